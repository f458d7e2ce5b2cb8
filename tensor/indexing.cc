// Composite kernels of the masking, indexing and joining ops (tensor/ops.inc):
// masked_fill_, masked_select, index_select and cat. They validate (torch's
// rules and messages, naming the shapes, dtypes and positions involved) and
// are written in terms of other ops, so only index_select needs a device
// kernel (tensor/cpu/indexing_kernels.cc):
//   masked_fill_  = where_out(self, mask, value, self), in place;
//   masked_select = the flat positions of the mask's true elements (read on
//                   the CPU, as torch's nonzero synchronises), then
//                   index_select of the flattened, broadcast input;
//   cat           = copies into narrow()ed slices of a fresh output.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tensor/ops.h"

namespace ember {
namespace {

Tensor MaskedFill(const Tensor& self, const Tensor& mask, const Scalar& value) {
  EMBER_CHECK(self.defined() && mask.defined(), "masked_fill_: both tensors must be defined");
  EMBER_CHECK(mask.dtype() == kBool,
              "masked_fill_: only supports boolean masks, but got mask with dtype ",
              dtype_name(mask.dtype()));
  SizeVector shape = BroadcastShapes(self.sizes(), mask.sizes(), "masked_fill_");
  EMBER_CHECK(shape == self.sizes(), "masked_fill_: the mask of shape ",
              ShapeToString(mask.sizes()), " cannot be broadcast to the tensor's shape ",
              ShapeToString(self.sizes()), " (in-place ops can't change the shape)");
  EMBER_CHECK(mask.device() == self.device() || mask.dim() == 0,
              "masked_fill_: expected the mask on the tensor's device ",
              self.device().str(), ", got ", mask.device().str());
  CheckWritable(self, "masked_fill_");
  if (self.numel() > 0) {
    Tensor m = mask.device() == self.device() ? mask : mask.to(self.device());
    // A mask sharing memory with self in another layout must be read before
    // self is written.
    bool same_layout = m.storage().is_alias_of(self.storage()) &&
                       m.storage_offset() == self.storage_offset() &&
                       m.strides() == self.strides() && m.sizes() == self.sizes();
    if (!same_layout && MayOverlap(self, m)) m = m.clone();
    Tensor fill = WrapScalar(value, kCPU).to(self.dtype());
    if (!self.is_cpu()) fill = fill.to(self.device());
    ops::where_out(self, m.expand(shape), fill.expand(shape), self);
  }
  BumpVersion(self);
  return self;
}

Tensor MaskedSelect(const Tensor& self, const Tensor& mask) {
  EMBER_CHECK(self.defined() && mask.defined(), "masked_select: both tensors must be defined");
  EMBER_CHECK(mask.dtype() == kBool,
              "masked_select: expected a bool mask, but got mask with dtype ",
              dtype_name(mask.dtype()));
  SizeVector shape = BroadcastShapes(self.sizes(), mask.sizes(), "masked_select");
  // Flat (row-major) positions of the selected elements.
  Tensor m = mask.expand(shape).to(kCPU).contiguous();
  const bool* mp = m.numel() > 0 ? m.data_ptr<bool>() : nullptr;
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < m.numel(); ++i) {
    if (mp[i]) positions.push_back(i);
  }
  const int64_t count = static_cast<int64_t>(positions.size());
  Tensor out = EmptyTensor({count}, self.dtype(), self.device());
  if (count == 0) return out;
  Tensor index = EmptyTensor({count}, kInt64, kCPU);
  std::memcpy(index.raw_data(), positions.data(), count * sizeof(int64_t));
  if (!self.is_cpu()) index = index.to(self.device());
  Tensor flat = self.expand(shape).reshape({Numel(shape)});
  ops::index_select_out(out, flat, 0, index);
  return out;
}

Tensor IndexSelect(const Tensor& self, int64_t dim, const Tensor& index) {
  EMBER_CHECK(self.defined() && index.defined(), "index_select: both tensors must be defined");
  EMBER_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32,
              "index_select: expected an int64 or int32 index, got dtype ",
              dtype_name(index.dtype()));
  EMBER_CHECK(index.dim() <= 1, "index_select: index is supposed to be a vector (1-D or 0-dim), "
                                "got shape ", ShapeToString(index.sizes()));
  EMBER_CHECK(index.device() == self.device(), "index_select: expected the index on ",
              self.device().str(), ", got ", index.device().str());
  int64_t d = WrapDim(dim, self.dim(), "index_select");
  const int64_t n = index.numel();
  SizeVector shape(self.sizes().begin(), self.sizes().end());
  if (self.dim() == 0) {
    EMBER_CHECK(n == 1, "index_select: index to a 0-dim tensor can have only 1 value, got ", n,
                " values");
  } else {
    shape[d] = n;
  }
  Tensor out = EmptyTensor(shape, self.dtype(), self.device());
  if (n == 0) return out;
  // The kernel checks the index values (they are data).
  ops::index_select_out(out, self, d, index.reshape({n}).contiguous());
  return out;
}

Tensor Cat(absl::Span<const Tensor> tensors, int64_t dim) {
  EMBER_CHECK(!tensors.empty(), "cat: expected a non-empty list of Tensors");
  // Legacy rule (torch): 1-D tensors of shape [0] are skipped when checking
  // shapes, but still take part in type promotion.
  auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.numel() == 0; };
  Dtype dtype = tensors[0].dtype();
  const Tensor* ref = nullptr;
  size_t ref_index = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    EMBER_CHECK(t.defined(), "cat: tensor number ", i, " in the list is undefined");
    EMBER_CHECK(t.dim() > 0, "cat: zero-dimensional tensor (at position ", i,
                ") cannot be concatenated");
    EMBER_CHECK(t.device() == tensors[0].device(),
                "cat: expected all tensors to be on the same device, but tensor number ", i,
                " is on ", t.device().str(), " and tensor number 0 on ",
                tensors[0].device().str());
    dtype = promote_types(dtype, t.dtype());
    if (ref == nullptr && !skipped(t)) {
      ref = &t;
      ref_index = i;
    }
  }
  if (ref == nullptr) {  // Only [0]-shaped tensors.
    WrapDim(dim, 1, "cat");
    return EmptyTensor({0}, dtype, tensors[0].device());
  }
  const int64_t nd = ref->dim();
  const int64_t d = WrapDim(dim, nd, "cat");
  SizeVector shape(ref->sizes().begin(), ref->sizes().end());
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skipped(t)) continue;
    EMBER_CHECK(t.dim() == nd, "cat: Tensors must have same number of dimensions: got ", nd,
                " (tensor number ", ref_index, ", shape ", ShapeToString(ref->sizes()),
                ") and ", t.dim(), " (tensor number ", i, ", shape ",
                ShapeToString(t.sizes()), ")");
    for (int64_t k = 0; k < nd; ++k) {
      if (k == d) continue;
      EMBER_CHECK(t.sizes()[k] == shape[k], "cat: Sizes of tensors must match except in "
                  "dimension ", d, ". Expected size ", shape[k], " but got size ",
                  t.sizes()[k], " for tensor number ", i, " in the list (shapes ",
                  ShapeToString(ref->sizes()), " and ", ShapeToString(t.sizes()), ")");
    }
    total += t.sizes()[d];
  }
  shape[d] = total;
  Tensor out = EmptyTensor(shape, dtype, ref->device());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (skipped(t)) continue;
    const int64_t len = t.sizes()[d];
    if (len > 0 && t.numel() > 0) ops::copy_out(out.narrow(d, offset, len), t);
    offset += len;
  }
  return out;
}

EMBER_REGISTER_KERNEL(masked_fill_, kComposite, &MaskedFill);
EMBER_REGISTER_KERNEL(masked_select, kComposite, &MaskedSelect);
EMBER_REGISTER_KERNEL(index_select, kComposite, &IndexSelect);
EMBER_REGISTER_KERNEL(cat, kComposite, &Cat);

}  // namespace
}  // namespace ember
