// Anomaly mode (torch.autograd.set_detect_anomaly): while on, every recorded
// node remembers the forward op that created it, a failing backward names that
// op, and a backward function that returns NaN raises an error naming itself.
//
//   ```cpp
//   #include <string>
//   #include "autograd/anomaly_mode.h"
//   #include "tensor/error.h"
//   #include "tensor/factories.h"
//   ember::autograd::DetectAnomalyGuard detect;
//   ember::Tensor x = ember::ones({2}).requires_grad_();
//   ember::Tensor d = x - x;
//   ember::Tensor loss = (d / d).sum();  // 0 / 0, whose gradient is NaN too
//   std::string message;
//   try {
//     loss.backward();
//   } catch (const ember::Error& e) {
//     message = e.what();  // "Function 'DivBackward' returned nan values in its 1th output."
//   }
//   if (message.empty()) return absl::InternalError("a NaN gradient went unnoticed");
//   ```
//
// It slows recording down; use it to debug. The flag is process-wide (as in
// torch), read and written atomically.
#ifndef EMBER_AUTOGRAD_ANOMALY_MODE_H_
#define EMBER_AUTOGRAD_ANOMALY_MODE_H_

#include <atomic>

namespace ember::autograd {

namespace internal {
inline std::atomic<bool> g_anomaly_enabled{false};
}  // namespace internal

class AnomalyMode {
 public:
  static bool is_enabled() { return internal::g_anomaly_enabled.load(std::memory_order_relaxed); }
  static void set_enabled(bool enabled) {
    internal::g_anomaly_enabled.store(enabled, std::memory_order_relaxed);
  }
};

// Turns anomaly mode on for its lifetime, then restores the previous state.
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard() : previous_(AnomalyMode::is_enabled()) { AnomalyMode::set_enabled(true); }
  ~DetectAnomalyGuard() { AnomalyMode::set_enabled(previous_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_ANOMALY_MODE_H_
