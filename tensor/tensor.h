// Tensor: an n-dimensional, strided view of a Storage, with PyTorch's API.
//
//   ```cpp
//   #include <iostream>
//   #include "tensor/factories.h"
//   #include "tensor/tensor.h"
//   ember::Tensor a = ember::arange(6).view({2, 3});           // int64 [2, 3]
//   ember::Tensor b = ember::ones({3}, ember::kFloat32);
//   ember::Tensor c = a + b;                                   // float32 [2, 3]
//   ember::Tensor s = c.sum(/*dims=*/{1}, /*keepdim=*/true);  // [2, 1]: 6, 15
//   std::cout << c.t().contiguous() << "\n";
//   ```
//
// A Tensor is a cheap, reference-counted handle to a TensorImpl (sizes,
// strides, storage offset, dtype, the storage, a version counter and an
// autograd slot). Copying a Tensor shares everything; view ops return new
// TensorImpls over the same storage and version counter. In-place ops (name
// ending in `_`) write through to every view and bump the version.
//
// Errors: user mistakes throw ember::Error with the shapes/dtypes involved
// (see tensor/error.h). Ops run on the calling thread, using the intra-op
// thread pool (tensor/thread_pool.h) for large tensors.
//
// Thread-safety: a Tensor handle is thread-compatible. Concurrent reads of
// the same data are safe; concurrent writes need external synchronisation, as
// in PyTorch.
#ifndef EMBER_TENSOR_TENSOR_H_
#define EMBER_TENSOR_TENSOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/device.h"
#include "tensor/dispatch.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/scalar.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace ember {

class Tensor;

// Note [Autograd hooks]
// The tensor layer knows nothing of graphs. Each TensorImpl has a slot for the
// autograd layer's per-tensor data (grad, grad_fn, hooks, ...), seen here only
// through AutogradMetaInterface, and the Tensor methods that need autograd
// (requires_grad_, grad, backward, ...) forward to the AutogradHooksInterface
// that //autograd registers when it is linked. Without it, requires_grad() is
// false, grad() is undefined, and the methods that need autograd throw, naming
// the library to link.

// The autograd layer's per-tensor data. The dispatcher asks requires_grad()
// to pick the autograd kernel (Note [Dispatch]).
class AutogradMetaInterface {
 public:
  virtual ~AutogradMetaInterface() = default;
  virtual bool requires_grad() const = 0;
  // False for tensors that an op recorded in the graph produced.
  virtual bool is_leaf() const { return true; }
};

// A node of the autograd graph as the tensor layer shows it
// (Tensor::grad_fn()); autograd::Node implements it.
class AutogradNodeInterface {
 public:
  virtual ~AutogradNodeInterface() = default;
  // "MulBackward", "AccumulateGrad", ...
  virtual std::string name() const = 0;
  // One (node, input number) pair per input of the recorded op, in order, as
  // torch's grad_fn.next_functions: the node that receives that input's
  // gradient (its grad_fn, or the AccumulateGrad of a leaf) and which of its
  // inputs the gradient arrives at. The node is null for inputs that need no
  // gradient.
  virtual std::vector<std::pair<std::shared_ptr<AutogradNodeInterface>, uint32_t>> next_functions()
      const = 0;
};

// The Tensor methods that autograd implements (Note [Autograd hooks]).
// Registered once, during static initialisation, by //autograd.
class AutogradHooksInterface {
 public:
  virtual ~AutogradHooksInterface() = default;
  virtual void SetRequiresGrad(const Tensor& self, bool requires_grad) const = 0;
  virtual Tensor Grad(const Tensor& self) const = 0;
  virtual void SetGrad(const Tensor& self, const Tensor& grad) const = 0;
  virtual void DetachInPlace(const Tensor& self) const = 0;
  virtual void RetainGrad(const Tensor& self) const = 0;
  virtual void Backward(const Tensor& self, const Tensor& gradient, bool retain_graph,
                        bool create_graph) const = 0;
  // The node that produced `self` (null for leaves); for views, regenerated
  // from the base's history when the base was written in place since (Note
  // [View tracking]).
  virtual std::shared_ptr<AutogradNodeInterface> GradFn(const Tensor& self) const = 0;
};

// Installs the autograd layer's hooks; `hooks` must outlive the program.
void SetAutogradHooks(const AutogradHooksInterface* hooks);
// The installed hooks, or nullptr when //autograd is not linked.
const AutogradHooksInterface* GetAutogradHooks();

// Counts in-place modifications of a tensor's data. Shared by a tensor, its
// views and detach() results, so that autograd can tell whether a saved
// tensor was modified.
struct VersionCounter {
  std::atomic<uint32_t> version{0};
};

// What a factory creates, as torch::TensorOptions: the dtype, the device,
// whether the result requires grad, and whether it lives in pinned
// (page-locked) host memory. Each setter returns a copy with that field set;
// a field left unset takes the factory's default (float32, or the dtype the
// values imply for full/arange/tensor; cpu; false; false), or, for the
// *_like factories, the input's dtype and device.
//
//   ember::Tensor w = ember::randn({3, 2}, ember::TensorOptions().requires_grad(true));
//   ember::Tensor i = ember::zeros({2}, ember::TensorOptions().dtype(ember::kInt64));
//   ember::Tensor d = ember::ones({2}, ember::kFloat64);  // a Dtype or Device converts
//
// requires_grad(true) needs //autograd and a floating dtype (the factory
// throws otherwise, as torch). pinned_memory(true) gives page-locked host
// memory from the pinned allocator a device backend registers (//cuda); the
// factories throw when none is linked or no device is usable, as torch does
// without CUDA.
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(Dtype dtype) : dtype_(dtype) {}      // NOLINT: implicit by design
  TensorOptions(Device device) : device_(device) {}  // NOLINT

  Dtype dtype() const { return dtype_.value_or(kDefaultFloatDtype); }
  Device device() const { return device_.value_or(kCPU); }
  bool requires_grad() const { return requires_grad_.value_or(false); }
  bool pinned_memory() const { return pinned_memory_.value_or(false); }
  bool has_dtype() const { return dtype_.has_value(); }
  bool has_device() const { return device_.has_value(); }
  bool has_requires_grad() const { return requires_grad_.has_value(); }
  bool has_pinned_memory() const { return pinned_memory_.has_value(); }
  std::optional<Dtype> dtype_opt() const { return dtype_; }

  TensorOptions dtype(Dtype d) const {
    TensorOptions o = *this;
    o.dtype_ = d;
    return o;
  }
  TensorOptions device(Device d) const {
    TensorOptions o = *this;
    o.device_ = d;
    return o;
  }
  TensorOptions requires_grad(bool r) const {
    TensorOptions o = *this;
    o.requires_grad_ = r;
    return o;
  }
  TensorOptions pinned_memory(bool p) const {
    TensorOptions o = *this;
    o.pinned_memory_ = p;
    return o;
  }
  // These options with the fields that `other` sets taken from `other`
  // (torch's merge_in).
  TensorOptions merge_in(const TensorOptions& other) const {
    TensorOptions o = *this;
    if (other.dtype_) o.dtype_ = other.dtype_;
    if (other.device_) o.device_ = other.device_;
    if (other.requires_grad_) o.requires_grad_ = other.requires_grad_;
    if (other.pinned_memory_) o.pinned_memory_ = other.pinned_memory_;
    return o;
  }

 private:
  std::optional<Dtype> dtype_;
  std::optional<Device> device_;
  std::optional<bool> requires_grad_;
  std::optional<bool> pinned_memory_;
};

class TensorImpl {
 public:
  TensorImpl(Storage storage, Dtype dtype, IntArrayRef sizes, IntArrayRef strides,
             int64_t storage_offset);

  IntArrayRef sizes() const { return sizes_; }
  IntArrayRef strides() const { return strides_; }
  int64_t storage_offset() const { return storage_offset_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t numel() const { return numel_; }
  Dtype dtype() const { return dtype_; }
  Device device() const { return storage_.device(); }
  const Storage& storage() const { return storage_; }
  bool is_contiguous() const { return is_contiguous_; }
  // Address of element 0 (storage data + offset).
  void* data() const {
    return static_cast<char*>(storage_.data()) + storage_offset_ * element_size(dtype_);
  }

  // Replaces the geometry (used by ops that rewrite metadata in place).
  void SetGeometry(IntArrayRef sizes, IntArrayRef strides, int64_t storage_offset);

  uint32_t version() const { return version_->version.load(std::memory_order_relaxed); }
  void BumpVersion() { version_->version.fetch_add(1, std::memory_order_relaxed); }
  const std::shared_ptr<VersionCounter>& version_counter() const { return version_; }
  void set_version_counter(std::shared_ptr<VersionCounter> v) { version_ = std::move(v); }

  AutogradMetaInterface* autograd_meta() const { return autograd_meta_.get(); }
  void set_autograd_meta(std::unique_ptr<AutogradMetaInterface> meta) {
    autograd_meta_ = std::move(meta);
  }
  // Whether ops on this tensor are recorded: its autograd data says so, or it
  // is a view of a tensor whose data does (Note [View tracking]).
  bool requires_grad() const {
    if (autograd_meta_ != nullptr && autograd_meta_->requires_grad()) return true;
    return view_base_ != nullptr && view_base_->autograd_meta_ != nullptr &&
           view_base_->autograd_meta_->requires_grad();
  }

  // Note [View tracking]
  // The output of a view op (view, as_strided, transpose, permute, slice,
  // select, expand, squeeze, unsqueeze, and what is built on them) records
  // the tensor whose memory it looks at: its base, the first tensor of a
  // chain of views. This happens whatever the grad mode and whether or not
  // anything requires grad, as in torch, because autograd's in-place rule
  // needs it later: writing a tensor that requires grad into a view gives
  // the base a new history (Note [In-place rules] in autograd/record.h), even
  // when the view was taken before anything required grad. A view also
  // records whether grad mode was off when it was made: torch refuses to
  // record an in-place write through such a view. A view requires grad when
  // its base does. Holding the base keeps its TensorImpl (not more memory:
  // the storage is shared anyway) alive as long as the view.
  const std::shared_ptr<TensorImpl>& view_base() const { return view_base_; }
  bool is_view() const { return view_base_ != nullptr; }
  bool is_view_made_without_grad_mode() const { return view_without_grad_mode_; }
  // Makes this a view of `of` (or of its base, when `of` is a view itself).
  void set_view_of(const std::shared_ptr<TensorImpl>& of, bool grad_mode) {
    view_base_ = of->view_base_ != nullptr ? of->view_base_ : of;
    view_without_grad_mode_ = !grad_mode;
  }

  // A 0-dim tensor made from a plain number (Tensor::add(Scalar)); it takes
  // part in type promotion as a number, not as a tensor.
  bool is_wrapped_number() const { return wrapped_number_; }
  void set_wrapped_number(bool v) { wrapped_number_ = v; }

 private:
  void Recompute();

  Storage storage_;
  SizeVector sizes_;
  SizeVector strides_;
  int64_t storage_offset_ = 0;
  int64_t numel_ = 1;
  Dtype dtype_;
  bool is_contiguous_ = true;
  bool wrapped_number_ = false;
  bool view_without_grad_mode_ = false;
  std::shared_ptr<VersionCounter> version_;
  std::unique_ptr<AutogradMetaInterface> autograd_meta_;
  std::shared_ptr<TensorImpl> view_base_;
};

// A new TensorImpl from the object pool (Note [Object pool]); every
// TensorImpl is made this way.
template <typename... Args>
std::shared_ptr<TensorImpl> MakeTensorImpl(Args&&... args) {
  return std::allocate_shared<TensorImpl>(PoolAllocator<TensorImpl>(), std::forward<Args>(args)...);
}

struct MinMaxResult;

class Tensor {
 public:
  // An undefined tensor (defined() is false). Asking it for anything but
  // defined(), impl() and is_same() throws ember::Error naming the call, as
  // torch's "called on an undefined Tensor".
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // True when both handles refer to the same TensorImpl.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // --- Metadata -----------------------------------------------------------
  IntArrayRef sizes() const { return Impl("sizes").sizes(); }
  IntArrayRef strides() const { return Impl("strides").strides(); }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return Impl("dim").dim(); }
  int64_t numel() const { return Impl("numel").numel(); }
  Dtype dtype() const { return Impl("dtype").dtype(); }
  Device device() const { return Impl("device").device(); }
  TensorOptions options() const { return TensorOptions(dtype()).device(device()); }
  const Storage& storage() const { return Impl("storage").storage(); }
  int64_t storage_offset() const { return Impl("storage_offset").storage_offset(); }
  bool is_contiguous() const { return Impl("is_contiguous").is_contiguous(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return ember::is_floating_point(dtype()); }
  size_t element_size() const { return ember::element_size(dtype()); }
  size_t nbytes() const { return numel() * element_size(); }
  uint32_t version() const { return Impl("version").version(); }
  // Typed pointer to element 0; T must match dtype().
  template <typename T>
  T* data_ptr() const {
    CheckDataPtrType(kDtypeOf<T>);
    return static_cast<T*>(impl_->data());  // CheckDataPtrType checked impl_
  }
  void* raw_data() const { return Impl("raw_data").data(); }
  // The value of a one-element tensor, converted to T.
  template <typename T>
  T item() const {
    return ItemScalar().to<T>();
  }
  Scalar ItemScalar() const;

  // --- Views (share storage) ----------------------------------------------
  Tensor view(IntArrayRef sizes) const;
  Tensor reshape(IntArrayRef sizes) const;
  Tensor as_strided(IntArrayRef sizes, IntArrayRef strides,
                    std::optional<int64_t> storage_offset = std::nullopt) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor permute(IntArrayRef dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Python-style slicing: negative and out-of-range bounds are clamped.
  Tensor slice(int64_t dim, std::optional<int64_t> start = std::nullopt,
               std::optional<int64_t> end = std::nullopt, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(IntArrayRef sizes) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split_with_sizes(IntArrayRef split_sizes, int64_t dim = 0) const;
  std::vector<Tensor> unbind(int64_t dim = 0) const;

  // --- Copies and conversions ---------------------------------------------
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Dtype dtype) const;
  // This tensor when it is on `device` already (a device without an index
  // matches any of its type), else a copy there. non_blocking (Note
  // [Non-blocking copies] in ops.h): a copy from pinned host memory to a
  // device is queued on the device's current stream without waiting, and a
  // copy from a device to the CPU lands in pinned memory without waiting
  // (when a pinned allocator is registered), as torch's to(); synchronize
  // the stream (or an event recorded after it) before reading the result on
  // the host. From pageable memory the copy waits.
  Tensor to(Device device, bool non_blocking = false) const;
  // to(kCPU): waits for the copy.
  Tensor cpu() const;
  // to(cuda:device, non_blocking); device -1 is the current CUDA device.
  Tensor cuda(int device = -1, bool non_blocking = false) const;
  // A copy in pinned host memory (this tensor when it is pinned already);
  // throws for a tensor not on the CPU and when no device backend registered
  // a pinned allocator (link //cuda), as torch's pin_memory.
  Tensor pin_memory() const;
  // Whether this CPU tensor's memory is pinned.
  bool is_pinned() const;
  // Keeps this tensor's memory from being reused, once freed, before the
  // work queued on `stream` so far is done (torch's record_stream: for a
  // tensor used on a stream other than the one it was allocated on). Throws
  // for memory that is not stream-ordered (plain CPU tensors).
  void record_stream(Stream stream) const;
  // Copies `src` (broadcast to this shape, any dtype) into this tensor;
  // non_blocking as for to() (Note [Non-blocking copies] in ops.h).
  Tensor copy_(const Tensor& src, bool non_blocking = false) const;
  Tensor fill_(const Scalar& value) const;
  Tensor zero_() const { return fill_(0); }

  // --- Elementwise unary (float ops on integer inputs give float32) --------
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor expm1() const;
  Tensor log() const;
  Tensor log1p() const;
  Tensor log2() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tan() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor gelu() const;
  Tensor erf() const;
  Tensor reciprocal() const;
  Tensor sign() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;
  Tensor square() const;
  Tensor logical_not() const;
  Tensor neg_() const;
  Tensor abs_() const;
  Tensor exp_() const;
  Tensor log_() const;
  Tensor sqrt_() const;
  Tensor sigmoid_() const;
  Tensor tanh_() const;
  Tensor relu_() const;

  // --- Elementwise binary (NumPy broadcasting, type promotion) -------------
  Tensor add(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor add(const Scalar& other, const Scalar& alpha = 1) const;
  Tensor sub(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor sub(const Scalar& other, const Scalar& alpha = 1) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(const Scalar& other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(const Scalar& other) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(const Scalar& exponent) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor eq(const Tensor& other) const;
  Tensor eq(const Scalar& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor ne(const Scalar& other) const;
  Tensor lt(const Tensor& other) const;
  Tensor lt(const Scalar& other) const;
  Tensor le(const Tensor& other) const;
  Tensor le(const Scalar& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor gt(const Scalar& other) const;
  Tensor ge(const Tensor& other) const;
  Tensor ge(const Scalar& other) const;
  Tensor logical_and(const Tensor& other) const;
  Tensor logical_or(const Tensor& other) const;
  Tensor logical_xor(const Tensor& other) const;
  // In place: the broadcast result must have this tensor's shape, and the
  // promoted dtype must be castable to this tensor's dtype.
  Tensor add_(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor add_(const Scalar& other, const Scalar& alpha = 1) const;
  Tensor sub_(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor sub_(const Scalar& other, const Scalar& alpha = 1) const;
  Tensor mul_(const Tensor& other) const;
  Tensor mul_(const Scalar& other) const;
  Tensor div_(const Tensor& other) const;
  Tensor div_(const Scalar& other) const;
  Tensor pow_(const Scalar& exponent) const;

  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor clamp_(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor masked_fill(const Tensor& mask, const Scalar& value) const;
  Tensor masked_fill_(const Tensor& mask, const Scalar& value) const;
  Tensor masked_select(const Tensor& mask) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;

  // --- Reductions ---------------------------------------------------------
  // Over all elements when `dims` is empty.
  Tensor sum(std::optional<Dtype> dtype = std::nullopt) const;
  Tensor sum(IntArrayRef dims, bool keepdim = false,
             std::optional<Dtype> dtype = std::nullopt) const;
  Tensor mean() const;
  Tensor mean(IntArrayRef dims, bool keepdim = false) const;
  Tensor prod() const;
  Tensor prod(int64_t dim, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  MinMaxResult max(int64_t dim, bool keepdim = false) const;
  MinMaxResult min(int64_t dim, bool keepdim = false) const;
  Tensor amax(IntArrayRef dims, bool keepdim = false) const;
  Tensor amin(IntArrayRef dims, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  // Bessel-corrected by default (correction = 1), as torch.var.
  Tensor var(IntArrayRef dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(IntArrayRef dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor norm(const Scalar& p = 2, IntArrayRef dims = {}, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // --- Linear algebra (OpenBLAS for float32/float64) ----------------------
  Tensor matmul(const Tensor& other) const;
  Tensor mm(const Tensor& other) const;
  Tensor bmm(const Tensor& other) const;
  Tensor dot(const Tensor& other) const;
  Tensor outer(const Tensor& other) const;

  // --- Comparison of whole tensors ----------------------------------------
  bool equal(const Tensor& other) const;
  bool allclose(const Tensor& other, double rtol = 1e-5, double atol = 1e-8,
                bool equal_nan = false) const;

  // Readable form, as torch prints: values, then shape/dtype when not the
  // defaults.
  std::string ToString() const;

  // --- Autograd (implemented by //autograd, Note [Autograd hooks]) ----------
  // Whether ops on this tensor record a graph: a leaf whose flag is set, or
  // the output of a recorded op.
  bool requires_grad() const;
  // Sets the flag of a leaf; throws for non-leaves and non-floating dtypes,
  // as torch does. Returns *this.
  const Tensor& requires_grad_(bool requires_grad = true) const;
  // The accumulated gradient (leaves, or non-leaves after retain_grad());
  // undefined when none.
  Tensor grad() const;
  // Replaces the gradient (optimizers, zero_grad); undefined clears it. The
  // shape must match.
  void set_grad(const Tensor& grad) const;
  // True unless the tensor is the output of a recorded op.
  bool is_leaf() const;
  // The recorded op that produced this tensor (torch's grad_fn): a handle
  // with name() and next_functions(); null for leaves and tensors outside
  // the graph.
  std::shared_ptr<AutogradNodeInterface> grad_fn() const;
  // Whether this tensor is the output of a view op, and the tensor whose
  // memory it shares (undefined when not a view), as torch's is_view() and
  // _base (Note [View tracking]).
  bool is_view() const { return Impl("is_view").is_view(); }
  Tensor _base() const { return Tensor(Impl("_base").view_base()); }
  // A tensor sharing data and version counter, outside any graph.
  Tensor detach() const;
  // Takes this tensor out of the graph (it becomes a leaf that does not
  // require grad). Throws for views, as torch does. Returns *this.
  const Tensor& detach_() const;
  // Makes backward() fill grad() of this non-leaf too.
  void retain_grad() const;
  // Computes the gradient of this tensor with respect to the graph leaves and
  // accumulates it into their grad(). `gradient` may be omitted only for
  // one-element tensors. Runs on the calling thread; blocks until done.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;

 private:
  // *impl_, or an ember::Error naming `call` for an undefined tensor.
  TensorImpl& Impl(const char* call) const {
    if (impl_ == nullptr) [[unlikely]] ThrowUndefined(call);
    return *impl_;
  }
  [[noreturn]] static void ThrowUndefined(const char* call);
  void CheckDataPtrType(Dtype requested) const;
  std::shared_ptr<TensorImpl> impl_;
};

// max(dim) / min(dim): the values and their int64 indices.
struct MinMaxResult {
  Tensor values;
  Tensor indices;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// --- Operators ---------------------------------------------------------------
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator/(const Tensor& a, const Scalar& b);
Tensor operator+(const Scalar& a, const Tensor& b);
Tensor operator-(const Scalar& a, const Tensor& b);
Tensor operator*(const Scalar& a, const Tensor& b);
Tensor operator/(const Scalar& a, const Tensor& b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator&&(const Tensor& a, const Tensor& b);
Tensor operator||(const Tensor& a, const Tensor& b);
Tensor operator!(const Tensor& a);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Scalar& b);
Tensor& operator-=(Tensor& a, const Scalar& b);
Tensor& operator*=(Tensor& a, const Scalar& b);
Tensor& operator/=(Tensor& a, const Scalar& b);

// --- Free functions ------------------------------------------------------------
Tensor where(const Tensor& condition, const Tensor& self, const Tensor& other);
Tensor cat(absl::Span<const Tensor> tensors, int64_t dim = 0);
Tensor stack(absl::Span<const Tensor> tensors, int64_t dim = 0);
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor addmm(const Tensor& self, const Tensor& mat1, const Tensor& mat2, const Scalar& beta = 1,
             const Scalar& alpha = 1);
Tensor dot(const Tensor& a, const Tensor& b);
Tensor outer(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);
bool equal(const Tensor& a, const Tensor& b);

// A 0-dim tensor holding `value` as a plain number (type promotion treats it
// as a Scalar).
Tensor WrapScalar(const Scalar& value, Device device = kCPU);

}  // namespace ember

#endif  // EMBER_TENSOR_TENSOR_H_
