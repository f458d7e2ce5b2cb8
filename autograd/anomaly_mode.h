// Anomaly mode (torch.autograd.set_detect_anomaly): while on, every recorded
// node remembers the forward op that created it, a failing backward names that
// op, and a backward function that returns NaN raises an error naming itself.
//
//   ember::autograd::DetectAnomalyGuard detect;
//   loss.backward();  // "Error detected in DivBackward (forward op: div) ..."
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
