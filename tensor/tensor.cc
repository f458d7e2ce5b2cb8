#include "tensor/tensor.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "tensor/ops.h"

namespace ember {

// --- TensorImpl ------------------------------------------------------------------

TensorImpl::TensorImpl(Storage storage, Dtype dtype, IntArrayRef sizes, IntArrayRef strides,
                       int64_t storage_offset)
    : storage_(std::move(storage)),
      sizes_(sizes.begin(), sizes.end()),
      strides_(strides.begin(), strides.end()),
      storage_offset_(storage_offset),
      dtype_(dtype),
      version_(std::allocate_shared<VersionCounter>(PoolAllocator<VersionCounter>())) {
  EMBER_INTERNAL_ASSERT(sizes.size() == strides.size());
  Recompute();
}

void TensorImpl::SetGeometry(IntArrayRef sizes, IntArrayRef strides, int64_t storage_offset) {
  EMBER_INTERNAL_ASSERT(sizes.size() == strides.size());
  sizes_.assign(sizes.begin(), sizes.end());
  strides_.assign(strides.begin(), strides.end());
  storage_offset_ = storage_offset;
  Recompute();
}

void TensorImpl::Recompute() {
  numel_ = Numel(sizes_);
  // Contiguous: row-major strides, ignoring dims of size 1 (torch's rule).
  is_contiguous_ = true;
  if (numel_ == 0) return;
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (sizes_[d] == 1) continue;
    if (strides_[d] != expected) {
      is_contiguous_ = false;
      return;
    }
    expected *= sizes_[d];
  }
}

// --- Dispatch keys ----------------------------------------------------------------

DispatchKey DeviceDispatchKey(DeviceType type) {
  return type == DeviceType::kCUDA ? DispatchKey::kCUDA : DispatchKey::kCPU;
}

namespace internal {

thread_local constinit bool tls_below_autograd = false;

DispatchKeySet KeysOf(const Tensor& t) {
  if (!t.defined()) return {};
  DispatchKeySet keys(DeviceDispatchKey(t.device().type()));
  if (t.impl()->requires_grad()) keys = keys | DispatchKeySet(DispatchKey::kAutograd);
  return keys;
}

DispatchKeySet KeysOf(const TensorOptions& options) {
  return DispatchKeySet(DeviceDispatchKey(options.device().type()));
}

DispatchKeySet KeysOf(absl::Span<const Tensor> ts) {
  DispatchKeySet keys;
  for (const Tensor& t : ts) keys = keys | KeysOf(t);
  return keys;
}

namespace {
std::string DeviceNames(DispatchKeySet keys, std::string_view separator) {
  std::string devices;
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    if (!keys.Has(DeviceDispatchKey(type))) continue;
    if (!devices.empty()) devices.append(separator);
    devices.append(DeviceTypeName(type));
  }
  return devices;
}
}  // namespace

void ThrowNoKernel(std::string_view op, DispatchKeySet keys) {
  const std::string devices = DeviceNames(keys, " ");
  EMBER_FAIL(op, ": no kernel registered for device(s) ", devices.empty() ? "(none)" : devices,
             "; link the library that implements it (//tensor for cpu, //cuda for cuda)");
}

void ThrowMixedDevices(std::string_view op, DispatchKeySet keys) {
  EMBER_FAIL(op, ": expected all tensors to be on the same device, but found tensors on ",
             DeviceNames(keys, " and "), "; move them to one device with to() first");
}

}  // namespace internal

// --- Metadata ---------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const { return sizes()[WrapDim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[WrapDim(d, dim(), "stride")]; }

void Tensor::CheckDataPtrType(Dtype requested) const {
  EMBER_CHECK(defined(), "data_ptr: the tensor is undefined");
  EMBER_CHECK(requested == dtype(), "data_ptr: expected a ", dtype_name(requested),
              " pointer type for a ", dtype_name(dtype()), " tensor; ask for the tensor's own type");
}

Scalar Tensor::ItemScalar() const {
  EMBER_CHECK(defined(), "item: the tensor is undefined");
  EMBER_CHECK(numel() == 1, "item: a Tensor with ", numel(),
              " elements cannot be converted to Scalar");
  Tensor cpu = is_cpu() ? *this : to(kCPU);
  return VisitDtype(dtype(), [&]<typename T>() -> Scalar {
    T v = *static_cast<const T*>(cpu.raw_data());
    if constexpr (std::is_same_v<T, bool>) {
      return Scalar(v);
    } else if constexpr (std::is_integral_v<T>) {
      return Scalar(static_cast<int64_t>(v));
    } else {
      return Scalar(static_cast<double>(static_cast<OpMath<T>>(v)));
    }
  });
}

// --- Views ------------------------------------------------------------------------

Tensor Tensor::view(IntArrayRef sizes) const { return ops::view(*this, sizes); }

Tensor Tensor::reshape(IntArrayRef sizes) const {
  SizeVector shape = InferSize(sizes, numel(), "reshape");
  if (ComputeViewStrides(this->sizes(), strides(), shape)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::as_strided(IntArrayRef sizes, IntArrayRef strides,
                          std::optional<int64_t> storage_offset) const {
  return ops::as_strided(*this, sizes, strides, storage_offset.value_or(this->storage_offset()));
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  return ops::transpose(*this, dim0, dim1);
}

Tensor Tensor::t() const {
  EMBER_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dimensions, but got a ", dim(),
              "-D tensor of shape ", ShapeToString(sizes()), "; use transpose(dim0, dim1)");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(IntArrayRef dims) const { return ops::permute(*this, dims); }

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  EMBER_CHECK(dim() > 0, "narrow: cannot be applied to a 0-dim tensor");
  int64_t wd = WrapDim(d, dim(), "narrow");
  int64_t n = sizes()[wd];
  if (start < 0) start += n;
  EMBER_CHECK(start >= 0 && start <= n, "narrow: start (", start,
              ") is out of bounds for dimension ", wd, " of size ", n);
  EMBER_CHECK(length >= 0 && start + length <= n, "narrow: start (", start, ") + length (", length,
              ") exceeds dimension size (", n, ")");
  return ops::slice(*this, wd, start, start + length, 1);
}

Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t step) const {
  EMBER_CHECK(dim() > 0, "slice: cannot be applied to a 0-dim tensor");
  EMBER_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t wd = WrapDim(d, dim(), "slice");
  int64_t n = sizes()[wd];
  auto clampi = [n](int64_t v) {
    if (v < 0) v += n;
    return std::min(std::max<int64_t>(v, 0), n);
  };
  int64_t s = start ? clampi(*start) : 0;
  int64_t e = end ? clampi(*end) : n;
  if (e < s) e = s;
  return ops::slice(*this, wd, s, e, step);
}

Tensor Tensor::select(int64_t d, int64_t index) const { return ops::select(*this, d, index); }
Tensor Tensor::expand(IntArrayRef sizes) const { return ops::expand(*this, sizes); }
Tensor Tensor::squeeze() const { return ops::squeeze(*this, std::nullopt); }
Tensor Tensor::squeeze(int64_t d) const { return ops::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return ops::unsqueeze(*this, d); }

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int64_t s = WrapDim(start_dim, dim(), "flatten");
  int64_t e = WrapDim(end_dim, dim(), "flatten");
  EMBER_CHECK(s <= e, "flatten: start_dim (", start_dim, ") cannot come after end_dim (", end_dim,
              ")");
  SizeVector shape(sizes().begin(), sizes().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= sizes()[i];
  shape.push_back(n);
  shape.insert(shape.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(shape);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  EMBER_CHECK(dim() > 0, "split: expects at least a 1-dimensional tensor");
  EMBER_CHECK(split_size >= 0, "split: split_size must be non-negative, got ", split_size);
  int64_t wd = WrapDim(d, dim(), "split");
  int64_t n = sizes()[wd];
  EMBER_CHECK(split_size > 0 || n == 0, "split: split_size can only be 0 if dimension ", wd,
              " has size 0, but got size ", n);
  std::vector<Tensor> out;
  if (n == 0) {
    out.push_back(*this);
    return out;
  }
  for (int64_t start = 0; start < n; start += split_size) {
    out.push_back(narrow(wd, start, std::min(split_size, n - start)));
  }
  return out;
}

std::vector<Tensor> Tensor::split_with_sizes(IntArrayRef split_sizes, int64_t d) const {
  int64_t wd = WrapDim(d, dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    EMBER_CHECK(s >= 0, "split_with_sizes: split sizes must be non-negative, got ",
                ShapeToString(split_sizes));
    total += s;
  }
  EMBER_CHECK(total == sizes()[wd], "split_with_sizes: split sizes ", ShapeToString(split_sizes),
              " sum to ", total, " but dimension ", wd, " has size ", sizes()[wd]);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(narrow(wd, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  EMBER_CHECK(dim() > 0, "chunk: expects at least a 1-dimensional tensor");
  EMBER_CHECK(chunks > 0, "chunk: number of chunks must be greater than 0, got ", chunks);
  int64_t n = sizes()[WrapDim(d, dim(), "chunk")];
  int64_t split_size = (n + chunks - 1) / chunks;
  if (split_size == 0 && n == 0) return split(0, d);
  return split(split_size, d);
}

std::vector<Tensor> Tensor::unbind(int64_t d) const {
  int64_t wd = WrapDim(d, dim(), "unbind");
  std::vector<Tensor> out;
  for (int64_t i = 0; i < sizes()[wd]; ++i) out.push_back(select(wd, i));
  return out;
}

// --- Copies -----------------------------------------------------------------------

namespace {
// `fresh` (just allocated) filled from `src` through copy_, so autograd records
// it; the result reads version 0 (Note [Fresh tensors start at version 0]).
Tensor CopyIntoFresh(const Tensor& fresh, const Tensor& src, bool non_blocking = false) {
  fresh.copy_(src, non_blocking);
  ResetFreshVersion(fresh);
  return fresh;
}
}  // namespace

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  return CopyIntoFresh(EmptyTensor(sizes(), dtype(), device()), *this);
}

Tensor Tensor::to(Dtype d) const {
  if (d == dtype()) return *this;
  return CopyIntoFresh(EmptyTensor(sizes(), d, device()), *this);
}

Tensor Tensor::to(Device dev, bool non_blocking) const {
  if (dev.type() == device().type() && (!dev.has_index() || dev.index() == device().index())) {
    return *this;
  }
  Allocator* allocator = GetAllocator(dev.type());
  EMBER_CHECK(allocator != nullptr, "to: no allocator is registered for device ", dev.str(),
              "; link //cuda to use CUDA devices");
  // A non-blocking copy to the host lands in pinned memory, which the device
  // can write without the host waiting (as torch's _to_copy pins its output).
  if (non_blocking && dev.is_cpu() && GetPinnedMemoryAllocator() != nullptr) {
    allocator = GetPinnedMemoryAllocator();
  }
  return CopyIntoFresh(EmptyTensor(sizes(), dtype(), dev, allocator), *this, non_blocking);
}

Tensor Tensor::cpu() const { return to(kCPU); }

Tensor Tensor::cuda(int device, bool non_blocking) const {
  EMBER_CHECK(device >= -1, "cuda: device index must be -1 (the current device) or >= 0, got ",
              device);
  return to(Device(DeviceType::kCUDA, device), non_blocking);
}

bool Tensor::is_pinned() const {
  Allocator* pinned = GetPinnedMemoryAllocator();
  return defined() && pinned != nullptr && storage().allocator() == pinned;
}

void Tensor::record_stream(Stream stream) const {
  EMBER_CHECK(defined(), "record_stream: the tensor is undefined");
  Allocator* allocator = storage().allocator();
  EMBER_CHECK(allocator != nullptr, "record_stream: the tensor's memory (on ", device().str(),
              ") was not made by an allocator (from_blob or shared memory), so no allocator "
              "can delay its reuse");
  allocator->RecordStream(storage().data_ptr(), stream);
}

Tensor Tensor::pin_memory() const {
  EMBER_CHECK(defined(), "pin_memory: the tensor is undefined");
  EMBER_CHECK(is_cpu(), "pin_memory: only CPU tensors can be pinned, but this one is on ",
              device().str());
  if (is_pinned()) return *this;
  Allocator* pinned = GetPinnedMemoryAllocator();
  EMBER_CHECK(pinned != nullptr,
              "pin_memory: pinned host memory is page-locked by a device runtime, and none is "
              "linked; link //cuda (part of //:ember) or drop the pinning");
  return CopyIntoFresh(EmptyTensor(sizes(), dtype(), kCPU, pinned), *this);
}

Tensor Tensor::copy_(const Tensor& src, bool non_blocking) const {
  NonBlockingCopyGuard guard(non_blocking);
  return ops::copy_(*this, src);
}
Tensor Tensor::fill_(const Scalar& value) const { return ops::fill_(*this, value); }

// --- Elementwise ------------------------------------------------------------------

#define EMBER_UNARY_METHOD(method, kind) \
  Tensor Tensor::method() const { return ops::unary(UnaryOp::kind, *this); }
#define EMBER_UNARY_INPLACE_METHOD(method, kind) \
  Tensor Tensor::method() const { return ops::unary_(UnaryOp::kind, *this); }
EMBER_UNARY_METHOD(neg, kNeg)
EMBER_UNARY_METHOD(abs, kAbs)
EMBER_UNARY_METHOD(exp, kExp)
EMBER_UNARY_METHOD(expm1, kExpm1)
EMBER_UNARY_METHOD(log, kLog)
EMBER_UNARY_METHOD(log1p, kLog1p)
EMBER_UNARY_METHOD(log2, kLog2)
EMBER_UNARY_METHOD(sqrt, kSqrt)
EMBER_UNARY_METHOD(rsqrt, kRsqrt)
EMBER_UNARY_METHOD(sin, kSin)
EMBER_UNARY_METHOD(cos, kCos)
EMBER_UNARY_METHOD(tan, kTan)
EMBER_UNARY_METHOD(tanh, kTanh)
EMBER_UNARY_METHOD(sigmoid, kSigmoid)
EMBER_UNARY_METHOD(relu, kRelu)
EMBER_UNARY_METHOD(gelu, kGelu)
EMBER_UNARY_METHOD(erf, kErf)
EMBER_UNARY_METHOD(reciprocal, kReciprocal)
EMBER_UNARY_METHOD(sign, kSign)
EMBER_UNARY_METHOD(floor, kFloor)
EMBER_UNARY_METHOD(ceil, kCeil)
EMBER_UNARY_METHOD(round, kRound)
EMBER_UNARY_METHOD(square, kSquare)
EMBER_UNARY_METHOD(logical_not, kLogicalNot)
EMBER_UNARY_INPLACE_METHOD(neg_, kNeg)
EMBER_UNARY_INPLACE_METHOD(abs_, kAbs)
EMBER_UNARY_INPLACE_METHOD(exp_, kExp)
EMBER_UNARY_INPLACE_METHOD(log_, kLog)
EMBER_UNARY_INPLACE_METHOD(sqrt_, kSqrt)
EMBER_UNARY_INPLACE_METHOD(sigmoid_, kSigmoid)
EMBER_UNARY_INPLACE_METHOD(tanh_, kTanh)
EMBER_UNARY_INPLACE_METHOD(relu_, kRelu)
#undef EMBER_UNARY_METHOD
#undef EMBER_UNARY_INPLACE_METHOD

Tensor WrapScalar(const Scalar& value, Device device) {
  Tensor t(MakeTensorImpl(Storage::Allocate(element_size(value.dtype()), GetCpuAllocator()),
                          value.dtype(), IntArrayRef{}, IntArrayRef{}, 0));
  VisitDtype(value.dtype(), [&]<typename T>() { *static_cast<T*>(t.raw_data()) = value.to<T>(); });
  if (!device.is_cpu()) t = t.to(device);
  t.impl()->set_wrapped_number(true);
  return t;
}

namespace {
// The number operand of `self op number`, wrapped (WrapScalar). When self's
// dtype is its own compute type (float32, float64, int64) and the number is
// of the same category, the number is wrapped in that dtype directly: type
// promotion only looks at a wrapped number's category, and the kernel would
// convert it to this dtype anyway, so the result is the same without the
// conversion (which dominates ops on tiny tensors). The backward of mul/div
// applies the number the same way, so it may read the rounded one; pow,
// whose backward computes with its exponent, wraps it exactly instead
// (Note [Number operands] in autograd/derivatives.cc).
Tensor WrapOperand(const Tensor& self, const Scalar& value) {
  const Dtype d = self.dtype();
  const bool same_category = (value.is_floating_point() && (d == kFloat32 || d == kFloat64)) ||
                             (value.is_integral() && d == kInt64);
  if (!same_category || !self.is_cpu()) return WrapScalar(value, self.device());
  Tensor t(MakeTensorImpl(Storage::Allocate(element_size(d), GetCpuAllocator()), d, IntArrayRef{},
                          IntArrayRef{}, 0));
  VisitDtype(d, [&]<typename T>() { *static_cast<T*>(t.raw_data()) = value.to<T>(); });
  t.impl()->set_wrapped_number(true);
  return t;
}

bool IsOne(const Scalar& alpha) {
  return alpha.is_floating_point() ? alpha.to_double() == 1.0 : alpha.to_int() == 1;
}

// Whether an op on `a` and `b` would be recorded by autograd.
bool RecordsGraph(const Tensor& a, const Tensor& b) {
  return (internal::KeysOf(a) | internal::KeysOf(b)).Has(DispatchKey::kAutograd) &&
         !internal::tls_below_autograd;
}

// self op alpha * other: one pass (binary_alpha) unless autograd records it,
// which it does as a mul and an add (Note [One-pass alpha] in elementwise.cc).
// An integer alpha of 1 needs no checks; any other alpha is checked against
// the result dtype by binary_alpha.
Tensor WithAlpha(BinaryOp op, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  const bool records = RecordsGraph(self, other);
  if (IsOne(alpha) && (alpha.is_integral() || records)) return ops::binary(op, self, other);
  if (!records) return ops::binary_alpha(op, self, other, alpha);
  return ops::binary(op, self,
                     ops::binary(BinaryOp::kMul, other, WrapScalar(alpha, other.device())));
}
Tensor WithAlphaInPlace(BinaryOp op, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  const bool records = RecordsGraph(self, other);
  if (IsOne(alpha) && (alpha.is_integral() || records)) return ops::binary_(op, self, other);
  if (!records) return ops::binary_alpha_(op, self, other, alpha);
  return ops::binary_(op, self,
                      ops::binary(BinaryOp::kMul, other, WrapScalar(alpha, other.device())));
}
}  // namespace

#define EMBER_BINARY_METHODS(method, kind)            \
  Tensor Tensor::method(const Tensor& other) const {  \
    return ops::binary(BinaryOp::kind, *this, other); \
  }
#define EMBER_BINARY_SCALAR_METHODS(method, kind)                         \
  EMBER_BINARY_METHODS(method, kind)                                      \
  Tensor Tensor::method(const Scalar& other) const {                      \
    return ops::binary(BinaryOp::kind, *this, WrapOperand(*this, other)); \
  }
EMBER_BINARY_SCALAR_METHODS(mul, kMul)
EMBER_BINARY_SCALAR_METHODS(div, kDiv)
EMBER_BINARY_METHODS(pow, kPow)
EMBER_BINARY_METHODS(maximum, kMaximum)
EMBER_BINARY_METHODS(minimum, kMinimum)
EMBER_BINARY_SCALAR_METHODS(eq, kEq)
EMBER_BINARY_SCALAR_METHODS(ne, kNe)
EMBER_BINARY_SCALAR_METHODS(lt, kLt)
EMBER_BINARY_SCALAR_METHODS(le, kLe)
EMBER_BINARY_SCALAR_METHODS(gt, kGt)
EMBER_BINARY_SCALAR_METHODS(ge, kGe)
EMBER_BINARY_METHODS(logical_and, kLogicalAnd)
EMBER_BINARY_METHODS(logical_or, kLogicalOr)
EMBER_BINARY_METHODS(logical_xor, kLogicalXor)
#undef EMBER_BINARY_METHODS
#undef EMBER_BINARY_SCALAR_METHODS

Tensor Tensor::add(const Tensor& other, const Scalar& alpha) const {
  return WithAlpha(BinaryOp::kAdd, *this, other, alpha);
}
Tensor Tensor::add(const Scalar& other, const Scalar& alpha) const {
  return add(WrapOperand(*this, other), alpha);
}
Tensor Tensor::sub(const Tensor& other, const Scalar& alpha) const {
  return WithAlpha(BinaryOp::kSub, *this, other, alpha);
}
Tensor Tensor::sub(const Scalar& other, const Scalar& alpha) const {
  return sub(WrapOperand(*this, other), alpha);
}
Tensor Tensor::add_(const Tensor& other, const Scalar& alpha) const {
  return WithAlphaInPlace(BinaryOp::kAdd, *this, other, alpha);
}
Tensor Tensor::add_(const Scalar& other, const Scalar& alpha) const {
  return add_(WrapOperand(*this, other), alpha);
}
Tensor Tensor::sub_(const Tensor& other, const Scalar& alpha) const {
  return WithAlphaInPlace(BinaryOp::kSub, *this, other, alpha);
}
Tensor Tensor::sub_(const Scalar& other, const Scalar& alpha) const {
  return sub_(WrapOperand(*this, other), alpha);
}
Tensor Tensor::mul_(const Tensor& other) const {
  return ops::binary_(BinaryOp::kMul, *this, other);
}
Tensor Tensor::mul_(const Scalar& other) const { return mul_(WrapOperand(*this, other)); }
Tensor Tensor::div_(const Tensor& other) const {
  return ops::binary_(BinaryOp::kDiv, *this, other);
}
Tensor Tensor::div_(const Scalar& other) const { return div_(WrapOperand(*this, other)); }
// The exponent is wrapped exactly (a double stays double) and on the CPU:
// the kernel rounds it to the compute dtype as it reads it, and autograd
// keeps the exact number for the backward formula, which computes
// exponent - 1 in double as torch does.
Tensor Tensor::pow(const Scalar& exponent) const {
  return ops::binary(BinaryOp::kPow, *this, WrapScalar(exponent));
}
Tensor Tensor::pow_(const Scalar& exponent) const {
  return ops::binary_(BinaryOp::kPow, *this, WrapScalar(exponent));
}

Tensor Tensor::clamp(std::optional<Scalar> min, std::optional<Scalar> max) const {
  return ops::clamp(*this, min, max);
}
Tensor Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) const {
  return ops::clamp_(*this, min, max);
}
Tensor Tensor::masked_fill(const Tensor& mask, const Scalar& value) const {
  return clone().masked_fill_(mask, value);
}
Tensor Tensor::masked_fill_(const Tensor& mask, const Scalar& value) const {
  return ops::masked_fill_(*this, mask, value);
}
Tensor Tensor::masked_select(const Tensor& mask) const { return ops::masked_select(*this, mask); }
Tensor Tensor::index_select(int64_t d, const Tensor& index) const {
  return ops::index_select(*this, d, index);
}

// --- Reductions -------------------------------------------------------------------

Tensor Tensor::sum(std::optional<Dtype> dtype) const { return sum({}, false, dtype); }
Tensor Tensor::sum(IntArrayRef dims, bool keepdim, std::optional<Dtype> dtype) const {
  return ops::reduce(ReduceOp::kSum, *this, dims, keepdim, dtype);
}
Tensor Tensor::mean() const { return mean({}, false); }
Tensor Tensor::mean(IntArrayRef dims, bool keepdim) const {
  return ops::reduce(ReduceOp::kMean, *this, dims, keepdim, std::nullopt);
}
Tensor Tensor::prod() const { return ops::reduce(ReduceOp::kProd, *this, {}, false, std::nullopt); }
Tensor Tensor::prod(int64_t d, bool keepdim) const {
  int64_t dims[] = {d};
  return ops::reduce(ReduceOp::kProd, *this, dims, keepdim, std::nullopt);
}
Tensor Tensor::max() const {
  EMBER_CHECK(numel() > 0, "max(): expected a non-empty tensor; specify a dim for empty ones");
  return amax({}, false);
}
Tensor Tensor::min() const {
  EMBER_CHECK(numel() > 0, "min(): expected a non-empty tensor; specify a dim for empty ones");
  return amin({}, false);
}
MinMaxResult Tensor::max(int64_t d, bool keepdim) const { return ops::max_dim(*this, d, keepdim); }
MinMaxResult Tensor::min(int64_t d, bool keepdim) const { return ops::min_dim(*this, d, keepdim); }
Tensor Tensor::amax(IntArrayRef dims, bool keepdim) const {
  return ops::reduce(ReduceOp::kAmax, *this, dims, keepdim, std::nullopt);
}
Tensor Tensor::amin(IntArrayRef dims, bool keepdim) const {
  return ops::reduce(ReduceOp::kAmin, *this, dims, keepdim, std::nullopt);
}
Tensor Tensor::argmax(std::optional<int64_t> d, bool keepdim) const {
  if (!d) return flatten().max(0, false).indices;
  return max(*d, keepdim).indices;
}
Tensor Tensor::argmin(std::optional<int64_t> d, bool keepdim) const {
  if (!d) return flatten().min(0, false).indices;
  return min(*d, keepdim).indices;
}
Tensor Tensor::var(IntArrayRef dims, int64_t correction, bool keepdim) const {
  return ops::var(*this, dims, correction, keepdim);
}
Tensor Tensor::std(IntArrayRef dims, int64_t correction, bool keepdim) const {
  return ops::std(*this, dims, correction, keepdim);
}
Tensor Tensor::norm(const Scalar& p, IntArrayRef dims, bool keepdim) const {
  return ops::norm(*this, p, dims, keepdim);
}
Tensor Tensor::softmax(int64_t d) const { return ops::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return ops::log_softmax(*this, d); }

// --- Linear algebra ---------------------------------------------------------------

Tensor Tensor::mm(const Tensor& other) const { return ops::mm(*this, other); }
Tensor Tensor::bmm(const Tensor& other) const { return ops::bmm(*this, other); }
Tensor Tensor::dot(const Tensor& other) const { return ops::dot(*this, other); }
Tensor Tensor::outer(const Tensor& other) const {
  EMBER_CHECK(dim() == 1 && other.dim() == 1, "outer: expected 1-D tensors, got shapes ",
              ShapeToString(sizes()), " and ", ShapeToString(other.sizes()));
  return unsqueeze(1).mul(other.unsqueeze(0));
}

Tensor Tensor::matmul(const Tensor& other) const {
  const Tensor& a = *this;
  const Tensor& b = other;
  EMBER_CHECK(a.dim() > 0 && b.dim() > 0, "matmul: both arguments need at least 1 dimension, got ",
              a.dim(), "-D and ", b.dim(), "-D");
  if (a.dim() == 1 && b.dim() == 1) return a.dot(b);
  if (a.dim() == 2 && b.dim() == 1) return a.mm(b.unsqueeze(1)).squeeze(1);
  if (a.dim() == 1 && b.dim() == 2) return a.unsqueeze(0).mm(b).squeeze(0);
  if (a.dim() == 2 && b.dim() == 2) return a.mm(b);
  // Batched: broadcast the batch dims, fold them into one, run bmm.
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  IntArrayRef a_batch = a2.sizes().subspan(0, a2.dim() - 2);
  IntArrayRef b_batch = b2.sizes().subspan(0, b2.dim() - 2);
  SizeVector batch = BroadcastShapes(a_batch, b_batch, "matmul");
  int64_t n = a2.size(-2), k = a2.size(-1), k2 = b2.size(-2), m = b2.size(-1);
  EMBER_CHECK(k == k2, "matmul: shapes ", ShapeToString(a.sizes()), " and ",
              ShapeToString(b.sizes()), " cannot be multiplied (", n, "x", k, " and ", k2, "x", m,
              ")");
  SizeVector a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), {n, k});
  b_shape.insert(b_shape.end(), {k, m});
  int64_t nb = Numel(batch);
  Tensor out = a2.expand(a_shape).reshape({nb, n, k}).bmm(b2.expand(b_shape).reshape({nb, k, m}));
  SizeVector out_shape = batch;
  if (a.dim() > 1) out_shape.push_back(n);
  if (b.dim() > 1) out_shape.push_back(m);
  return out.view(out_shape);
}

// --- Whole-tensor comparison ------------------------------------------------------

bool Tensor::equal(const Tensor& other) const {
  if (sizes() != other.sizes()) return false;
  if (numel() == 0) return true;
  return eq(other).logical_not().sum().item<int64_t>() == 0;
}

bool Tensor::allclose(const Tensor& other, double rtol, double atol, bool equal_nan) const {
  BroadcastShapes(sizes(), other.sizes(), "allclose");
  if (numel() == 0 || other.numel() == 0) return true;
  Dtype common = promote_types(dtype(), other.dtype());
  if (!ember::is_floating_point(common)) return eq(other).logical_not().sum().item<int64_t>() == 0;
  Tensor a = to(kFloat64), b = other.to(kFloat64);
  // x - x == 0 exactly when x is finite. Infinities are close only to an
  // equal infinity (the a == b term), never through the tolerance.
  Tensor finite = a.sub(a).eq(0).logical_and(b.sub(b).eq(0));
  Tensor close = finite.logical_and(a.sub(b).abs().le(b.abs().mul(rtol).add(atol)));
  Tensor ok = close.logical_or(a.eq(b));
  if (equal_nan) ok = ok.logical_or(a.ne(a).logical_and(b.ne(b)));
  return ok.logical_not().sum().item<int64_t>() == 0;
}

// --- Autograd (Note [Autograd hooks]) -------------------------------------------

namespace {
const AutogradHooksInterface* g_autograd_hooks = nullptr;

const AutogradHooksInterface& RequireAutogradHooks(const char* method) {
  EMBER_CHECK(g_autograd_hooks != nullptr, method,
              ": autograd is not linked into this program; depend on //autograd");
  return *g_autograd_hooks;
}
}  // namespace

void SetAutogradHooks(const AutogradHooksInterface* hooks) { g_autograd_hooks = hooks; }
const AutogradHooksInterface* GetAutogradHooks() { return g_autograd_hooks; }

void Tensor::ThrowUndefined(const char* call) {
  EMBER_FAIL(call, "() called on an undefined tensor (a Tensor() that holds no data, such as "
                   "the grad() of a tensor no backward reached); check defined() first");
}

bool Tensor::requires_grad() const { return Impl("requires_grad").requires_grad(); }

const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  RequireAutogradHooks("requires_grad_").SetRequiresGrad(*this, requires_grad);
  return *this;
}

Tensor Tensor::grad() const {
  if (Impl("grad").autograd_meta() == nullptr) return Tensor();
  return RequireAutogradHooks("grad").Grad(*this);
}

void Tensor::set_grad(const Tensor& grad) const {
  RequireAutogradHooks("set_grad").SetGrad(*this, grad);
}

bool Tensor::is_leaf() const {
  if (!Impl("is_leaf").requires_grad()) return true;
  // A view's history may be regenerated from its base's (Note [View tracking]).
  if (impl_->is_view()) return grad_fn() == nullptr;
  return impl_->autograd_meta()->is_leaf();
}

std::shared_ptr<AutogradNodeInterface> Tensor::grad_fn() const {
  if (!Impl("grad_fn").requires_grad()) return nullptr;
  return RequireAutogradHooks("grad_fn").GradFn(*this);
}

Tensor Tensor::detach() const {
  auto impl = MakeTensorImpl(storage(), dtype(), sizes(), strides(), storage_offset());
  impl->set_version_counter(impl_->version_counter());
  impl->set_wrapped_number(impl_->is_wrapped_number());
  return Tensor(std::move(impl));
}

const Tensor& Tensor::detach_() const {
  EMBER_CHECK(!is_view(), "Can't detach views in-place. Use detach() instead. The tensor of shape ",
              ShapeToString(sizes()), " is a view of another tensor.");
  if (impl_->autograd_meta() != nullptr) RequireAutogradHooks("detach_").DetachInPlace(*this);
  return *this;
}

void Tensor::retain_grad() const { RequireAutogradHooks("retain_grad").RetainGrad(*this); }

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  RequireAutogradHooks("backward").Backward(*this, gradient, retain_graph, create_graph);
}

// --- Operators and free functions -------------------------------------------------

Tensor operator-(const Tensor& a) { return a.neg(); }
Tensor operator+(const Tensor& a, const Tensor& b) { return a.add(b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return a.sub(b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return a.mul(b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return a.div(b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return a.add(b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return a.sub(b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return a.mul(b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return a.div(b); }
Tensor operator+(const Scalar& a, const Tensor& b) { return WrapScalar(a, b.device()).add(b); }
Tensor operator-(const Scalar& a, const Tensor& b) { return WrapScalar(a, b.device()).sub(b); }
Tensor operator*(const Scalar& a, const Tensor& b) { return WrapScalar(a, b.device()).mul(b); }
Tensor operator/(const Scalar& a, const Tensor& b) { return WrapScalar(a, b.device()).div(b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return a.eq(b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return a.ne(b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return a.lt(b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return a.le(b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return a.gt(b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return a.ge(b); }
Tensor operator&&(const Tensor& a, const Tensor& b) { return a.logical_and(b); }
Tensor operator||(const Tensor& a, const Tensor& b) { return a.logical_or(b); }
Tensor operator!(const Tensor& a) { return a.logical_not(); }
Tensor& operator+=(Tensor& a, const Tensor& b) {
  a.add_(b);
  return a;
}
Tensor& operator-=(Tensor& a, const Tensor& b) {
  a.sub_(b);
  return a;
}
Tensor& operator*=(Tensor& a, const Tensor& b) {
  a.mul_(b);
  return a;
}
Tensor& operator/=(Tensor& a, const Tensor& b) {
  a.div_(b);
  return a;
}
Tensor& operator+=(Tensor& a, const Scalar& b) {
  a.add_(b);
  return a;
}
Tensor& operator-=(Tensor& a, const Scalar& b) {
  a.sub_(b);
  return a;
}
Tensor& operator*=(Tensor& a, const Scalar& b) {
  a.mul_(b);
  return a;
}
Tensor& operator/=(Tensor& a, const Scalar& b) {
  a.div_(b);
  return a;
}

Tensor where(const Tensor& condition, const Tensor& self, const Tensor& other) {
  return ops::where(condition, self, other);
}
Tensor cat(absl::Span<const Tensor> tensors, int64_t dim) { return ops::cat(tensors, dim); }
Tensor stack(absl::Span<const Tensor> tensors, int64_t dim) {
  EMBER_CHECK(!tensors.empty(), "stack: expects a non-empty list of tensors");
  int64_t wd = WrapDim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EMBER_CHECK(tensors[i].sizes() == tensors[0].sizes(),
                "stack: expects each tensor to be equal size, but got ",
                ShapeToString(tensors[0].sizes()), " at entry 0 and ",
                ShapeToString(tensors[i].sizes()), " at entry ", i);
    expanded.push_back(tensors[i].unsqueeze(wd));
  }
  return cat(expanded, wd);
}
Tensor matmul(const Tensor& a, const Tensor& b) { return a.matmul(b); }
Tensor mm(const Tensor& a, const Tensor& b) { return a.mm(b); }
Tensor bmm(const Tensor& a, const Tensor& b) { return a.bmm(b); }
Tensor addmm(const Tensor& self, const Tensor& mat1, const Tensor& mat2, const Scalar& beta,
             const Scalar& alpha) {
  return ops::addmm(self, mat1, mat2, beta, alpha);
}
Tensor dot(const Tensor& a, const Tensor& b) { return a.dot(b); }
Tensor outer(const Tensor& a, const Tensor& b) { return a.outer(b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return a.maximum(b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return a.minimum(b); }
bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return a.allclose(b, rtol, atol, equal_nan);
}
bool equal(const Tensor& a, const Tensor& b) { return a.equal(b); }

}  // namespace ember
