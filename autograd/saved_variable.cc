#include "autograd/saved_variable.h"

#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/variable.h"

namespace ember::autograd {
namespace {

constexpr char kBackwardTwice[] =
    "Trying to backward through the graph a second time (or directly access saved "
    "tensors after they have already been freed). Saved intermediate values of the "
    "graph are freed when you call .backward() or autograd::grad(). Specify "
    "retain_graph=true if you need to backward through the graph a second time or if "
    "you need to access saved tensors after calling backward.";

[[noreturn]] void FailModified(const std::string& tensor, const std::shared_ptr<Node>& fn,
                               uint32_t output_nr, uint32_t version, uint32_t saved_version) {
  std::string which;
  if (fn != nullptr) {
    which = ::ember::internal::Concat(", which is output ", output_nr, " of ", fn->name(), ",");
  }
  EMBER_FAIL(
      "one of the variables needed for gradient computation has been modified by an "
      "inplace operation: ",
      tensor, which, " is at version ", version, "; expected version ", saved_version,
      " instead. Hint: enable anomaly detection (ember::autograd::DetectAnomalyGuard) "
      "to find the operation that failed to compute its gradient.");
}

}  // namespace

SavedVariable::SavedVariable(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  was_defined_ = true;
  is_output_ = is_output;
  saved_version_ = t.version();
  AutogradMeta* meta = GetMeta(t);
  requires_grad_ = meta != nullptr && meta->requires_grad();
  if (meta != nullptr) output_nr_ = meta->output_nr_;
  const bool own_output = is_output && meta != nullptr && meta->grad_fn_ != nullptr;
  if (internal::CurrentSavedTensorHooks() != nullptr && !t.impl()->is_wrapped_number()) {
    // Note [Saved-tensor hooks]: keep the gradient edge, hand the tensor over.
    is_output_ = own_output;
    if (own_output) {
      weak_grad_fn_ = meta->grad_fn_;
    } else if (meta != nullptr) {
      grad_fn_ = meta->grad_fn_ != nullptr ? meta->grad_fn_
                 : meta->requires_grad_    ? GradAccumulator(t)
                                           : nullptr;
    }
    Pack(internal::CurrentSavedTensorHooksState()->hooks, own_output ? t.detach() : t);
    return;
  }
  if (own_output) {
    data_ = t.detach();
    weak_grad_fn_ = meta->grad_fn_;
  } else {
    data_ = t;
    if (meta != nullptr) grad_fn_ = meta->grad_fn_;
  }
}

void SavedVariable::Pack(std::shared_ptr<const internal::SavedTensorHooks> hooks, const Tensor& t) {
  auto packed = std::make_unique<Packed>();
  packed->version_counter = t.impl()->version_counter();
  packed->shape = SizeVector(t.sizes().begin(), t.sizes().end());
  packed->dtype = t.dtype();
  {
    NoGradGuard no_grad;
    packed->value = hooks->pack_hook(t);
  }
  EMBER_CHECK(t.version() == saved_version_,
              "A saved tensor pack hook is modifying its input in place (a saved ",
              DescribeTensor(t), " went from version ", saved_version_, " to ", t.version(),
              "). Tensors given to a pack hook must not be modified in place; clone() the "
              "tensor first and modify the copy.");
  packed->hooks = std::move(hooks);
  packed_ = std::move(packed);
}

void SavedVariable::Release() {
  data_ = Tensor();
  packed_.reset();
  grad_fn_.reset();
  released_ = true;
}

Tensor SavedVariable::Unpack() const {
  if (!was_defined_) return Tensor();
  EMBER_CHECK(!released_, kBackwardTwice);
  if (packed_ != nullptr) return UnpackHooked();
  if (data_.version() != saved_version_) {
    FailModified(DescribeTensor(data_), is_output_ ? weak_grad_fn_.lock() : grad_fn_, output_nr_,
                 data_.version(), saved_version_);
  }
  if (is_output_ && requires_grad_ && GradMode::is_enabled()) {
    // Rebuild the output with its history so that a recorded backward
    // (create_graph) differentiates through it.
    std::shared_ptr<Node> fn = weak_grad_fn_.lock();
    if (fn != nullptr) {
      Tensor t = data_.detach();
      AutogradMeta* meta = MaterializeMeta(t);
      meta->grad_fn_ = std::move(fn);
      meta->output_nr_ = output_nr_;
      return t;
    }
  }
  return data_;
}

Tensor SavedVariable::UnpackHooked() const {
  const Packed& packed = *packed_;
  const uint32_t version = packed.version_counter->version.load(std::memory_order_relaxed);
  std::shared_ptr<Node> fn = is_output_ ? weak_grad_fn_.lock() : grad_fn_;
  if (version != saved_version_) {
    FailModified(DescribeTensor(packed.dtype, packed.shape), fn, output_nr_, version,
                 saved_version_);
  }
  Tensor data = packed.hooks->unpack_hook(packed.value);
  EMBER_CHECK(data.defined(),
              "the unpack hook of saved_tensors_hooks returned an undefined "
              "tensor for a saved ",
              DescribeTensor(packed.dtype, packed.shape),
              "; it must return a tensor with the content of the one the pack hook was given");
  if (!requires_grad_ || fn == nullptr || !GradMode::is_enabled()) return data;
  // A recorded backward (create_graph) differentiates through the saved
  // tensor: give it its place in the graph back (its node, or the leaf's
  // gradient accumulator).
  Tensor t = data.detach();
  AutogradMeta* meta = MaterializeMeta(t);
  meta->grad_fn_ = std::move(fn);
  meta->output_nr_ = output_nr_;
  return t;
}

}  // namespace ember::autograd
