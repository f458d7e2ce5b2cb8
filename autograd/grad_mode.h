// Grad mode: whether ops on this thread record the autograd graph.
//
//   ```cpp
//   #include "autograd/grad_mode.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::ones({3}).requires_grad_();
//   (w * w).sum().backward();
//   double lr = 0.1;
//   {
//     ember::autograd::NoGradGuard no_grad;   // e.g. an optimizer step
//     w.sub_(w.grad() * lr);                  // not recorded
//   }
//   bool on = ember::autograd::GradMode::is_enabled();  // true again
//   if (!on) return absl::InternalError("grad mode was not restored");
//   ```
//
// With grad mode off, ops produce tensors that do not require grad, whatever
// their inputs, and in-place ops on leaves that require grad are allowed (as
// torch.no_grad()). The mode is thread-local and starts enabled on every
// thread; the guards nest and restore the previous mode on destruction.
#ifndef EMBER_AUTOGRAD_GRAD_MODE_H_
#define EMBER_AUTOGRAD_GRAD_MODE_H_

#include "tensor/dispatch.h"

namespace ember::autograd {

class GradMode {
 public:
  static bool is_enabled() { return ::ember::internal::tls_grad_mode; }
  static void set_enabled(bool enabled) { ::ember::internal::tls_grad_mode = enabled; }
};

// Sets grad mode to `enabled` for its lifetime.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(enabled);
  }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// torch.no_grad().
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

// torch.enable_grad(): records again inside a NoGradGuard.
class EnableGradGuard : public AutoGradMode {
 public:
  EnableGradGuard() : AutoGradMode(true) {}
};

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_GRAD_MODE_H_
