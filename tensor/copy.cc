// Composite kernels of copy_ and fill_, plus the shared in-place checks
// declared in tensor/ops.h. Device kernels (copy_out, fill_out) do the work.
#include "tensor/ops.h"

#include <optional>

#include "tensor/device_guard.h"

namespace ember {

namespace internal {
thread_local constinit bool tls_non_blocking_copy = false;
}  // namespace internal

void CheckWritable(const Tensor& self, const char* op) {
  for (int64_t d = 0; d < self.dim(); ++d) {
    EMBER_CHECK(self.strides()[d] != 0 || self.sizes()[d] <= 1, op,
                ": unsupported operation: more than one element of the written-to tensor "
                "(shape ", ShapeToString(self.sizes()), ", strides ",
                ShapeToString(self.strides()),
                ") refers to a single memory location; call clone() on it first");
  }
}

void CheckInPlaceShape(const Tensor& self, IntArrayRef broadcast, const char* op) {
  EMBER_CHECK(self.sizes() == broadcast, op, ": output with shape ", ShapeToString(self.sizes()),
              " doesn't match the broadcast shape ", ShapeToString(broadcast));
}

bool MayOverlap(const Tensor& a, const Tensor& b) {
  if (!a.storage().is_alias_of(b.storage()) || a.numel() == 0 || b.numel() == 0) return false;
  auto range = [](const Tensor& t) {
    int64_t lo = t.storage_offset(), hi = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) hi += (t.sizes()[d] - 1) * t.strides()[d];
    return std::pair<int64_t, int64_t>(lo * t.element_size(), (hi + 1) * t.element_size());
  };
  auto [alo, ahi] = range(a);
  auto [blo, bhi] = range(b);
  return alo < bhi && blo < ahi;
}

bool SameView(const Tensor& a, const Tensor& b) {
  return a.storage().is_alias_of(b.storage()) && a.storage_offset() == b.storage_offset() &&
         a.sizes() == b.sizes() && a.strides() == b.strides() && a.dtype() == b.dtype();
}

Tensor EmptyTensor(IntArrayRef sizes, Dtype dtype, Device device) {
  for (int64_t s : sizes) {
    EMBER_CHECK(s >= 0, "empty: trying to create a tensor with negative dimension ", s, ": ",
                ShapeToString(sizes));
  }
  Allocator* allocator = GetAllocator(device.type());
  EMBER_CHECK(allocator != nullptr, "empty: no allocator is registered for device ",
              device.str(), "; link //cuda to use CUDA devices");
  return EmptyTensor(sizes, dtype, device, allocator);
}

Tensor EmptyTensor(IntArrayRef sizes, Dtype dtype, Device device, Allocator* allocator) {
  // A device allocator serves the current device: `device` is made current
  // when it names one (the CPU and "the current device" have no index).
  std::optional<DeviceGuard> guard;
  if (device.has_index()) guard.emplace(device);
  size_t nbytes = static_cast<size_t>(Numel(sizes)) * element_size(dtype);
  return Tensor(MakeTensorImpl(Storage::Allocate(nbytes, allocator), dtype, sizes,
                               ContiguousStrides(sizes), 0));
}

BlasOperand AsBlasOperand(const Tensor& t, int64_t rows, int64_t cols) {
  if (std::optional<BlasMatrixLayout> l =
          GetBlasMatrixLayout(rows, cols, t.strides()[1], t.strides()[2])) {
    return {t, *l};
  }
  Tensor c = t.contiguous();
  std::optional<BlasMatrixLayout> l =
      GetBlasMatrixLayout(rows, cols, c.strides()[1], c.strides()[2]);
  EMBER_INTERNAL_ASSERT(l.has_value(), "gemm: no BLAS layout for a contiguous operand");
  return {c, *l};
}

namespace {

Tensor Copy(const Tensor& self, const Tensor& src) {
  EMBER_CHECK(self.defined() && src.defined(), "copy_: both tensors must be defined");
  bool expandable = src.dim() <= self.dim();
  for (int64_t i = 1; expandable && i <= src.dim(); ++i) {
    int64_t s = src.sizes()[src.dim() - i];
    expandable = s == 1 || s == self.sizes()[self.dim() - i];
  }
  EMBER_CHECK(expandable, "copy_: the source shape ", ShapeToString(src.sizes()),
              " cannot be broadcast to the destination shape ", ShapeToString(self.sizes()));
  CheckWritable(self, "copy_");
  if (self.numel() > 0 && !(self.is_same(src))) {
    Tensor from = src;
    if (!SameView(self, src)) {
      if (MayOverlap(self, src)) from = src.clone();
      ops::copy_out(self, from.expand(self.sizes()));
    }
  }
  BumpVersion(self);
  return self;
}

Tensor Fill(const Tensor& self, const Scalar& value) {
  EMBER_CHECK(self.defined(), "fill_: the tensor is undefined");
  CheckWritable(self, "fill_");
  if (self.numel() > 0) ops::fill_out(self, value);
  BumpVersion(self);
  return self;
}

EMBER_REGISTER_KERNEL(copy_, kComposite, &Copy);
EMBER_REGISTER_KERNEL(fill_, kComposite, &Fill);

}  // namespace
}  // namespace ember
