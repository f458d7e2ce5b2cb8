#include "autograd/saved_variable.h"

#include "autograd/grad_mode.h"
#include "autograd/variable.h"

namespace ember::autograd {

SavedVariable::SavedVariable(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  was_defined_ = true;
  is_output_ = is_output;
  saved_version_ = t.version();
  AutogradMeta* meta = GetMeta(t);
  requires_grad_ = meta != nullptr && meta->requires_grad();
  if (meta != nullptr) output_nr_ = meta->output_nr_;
  if (is_output && meta != nullptr && meta->grad_fn_ != nullptr) {
    data_ = t.detach();
    weak_grad_fn_ = meta->grad_fn_;
  } else {
    data_ = t;
    if (meta != nullptr) grad_fn_ = meta->grad_fn_;
  }
}

void SavedVariable::Release() {
  data_ = Tensor();
  grad_fn_.reset();
  released_ = true;
}

Tensor SavedVariable::Unpack() const {
  if (!was_defined_) return Tensor();
  EMBER_CHECK(!released_,
              "Trying to backward through the graph a second time (or directly access saved "
              "tensors after they have already been freed). Saved intermediate values of the "
              "graph are freed when you call .backward() or autograd::grad(). Specify "
              "retain_graph=true if you need to backward through the graph a second time or if "
              "you need to access saved tensors after calling backward.");
  if (data_.version() != saved_version_) {
    std::shared_ptr<Node> fn = is_output_ ? weak_grad_fn_.lock() : grad_fn_;
    std::string which;
    if (fn != nullptr) {
      which = ::ember::internal::Concat(", which is output ", output_nr_, " of ", fn->name(), ",");
    }
    EMBER_FAIL(
        "one of the variables needed for gradient computation has been modified by an "
        "inplace operation: ",
        DescribeTensor(data_), which, " is at version ", data_.version(), "; expected version ",
        saved_version_,
        " instead. Hint: enable anomaly detection (ember::autograd::DetectAnomalyGuard) "
        "to find the operation that failed to compute its gradient.");
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

}  // namespace ember::autograd
