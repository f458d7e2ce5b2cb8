// GradScaler: dynamic loss scaling for float16 training, as
// torch.amp.GradScaler.
//
//   ```cpp
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/grad_scaler.h"
//   #include "nn/optim/sgd.h"
//   #include "tensor/autocast.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Linear>(4, 1);
//   ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.1});
//   ember::nn::optim::GradScaler scaler(ember::DeviceType::kCPU);
//   ember::Tensor x = ember::randn({16, 4}), y = ember::randn({16, 1});
//   for (int step = 0; step < 10; ++step) {
//     opt.zero_grad();
//     ember::Tensor loss;
//     {
//       ember::autocast ac(ember::DeviceType::kCPU);
//       loss = ember::nn::functional::mse_loss((*model)(x), y);
//     }
//     scaler.scale(loss).backward();
//     scaler.step(opt);  // unscales, and skips the step when a gradient is inf or NaN
//     scaler.update();
//   }
//   ```
//
// Note [Loss scaling]
// float16 gradients underflow; scaling the loss by S before backward scales
// every gradient by S and keeps them representable. Before the optimizer
// step the gradients are unscaled (multiplied by 1/S, in place, with one
// fused pass per device that also notes any inf or NaN: the
// grad_scaler_kernels.h slots). A step whose gradients held an inf or a NaN
// is skipped, and update() backs the scale off (backoff_factor); after
// growth_interval steps in a row without one it grows (growth_factor). The
// scale, the growth tracker and the found-inf flags live on the device as
// tensors: only step()'s decision reads a flag back, once per optimizer, as
// PyTorch's does.
//
// Call order per iteration: scale(loss).backward(), optionally unscale_(opt)
// (to clip or inspect the true gradients: clip_grad_norm_ after it), step(opt)
// for each optimizer, then update() once. The errors name the misuse as
// PyTorch's do (unscale_ twice, step twice, update without a step, float16
// gradients to unscale). With DDP the gradients are already averaged when
// they are unscaled, so every rank skips the same steps; with parameters
// sharded across ranks (fully_shard) use parallel/'s ShardedGradScaler, which
// agrees the skip across the ranks. enabled = false makes every call a
// pass-through (scale returns its input, step just steps).
//
// Thread-compatible: one thread drives a scaler.
#ifndef EMBER_NN_OPTIM_GRAD_SCALER_H_
#define EMBER_NN_OPTIM_GRAD_SCALER_H_

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "nn/optim/optimizer.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::nn::optim {

// torch.amp.GradScaler's defaults. growth_factor must be > 1,
// backoff_factor in (0, 1), growth_interval > 0, init_scale > 0.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

// GradScaler's state_dict (torch's keys: scale, growth_factor,
// backoff_factor, growth_interval, _growth_tracker).
struct GradScalerState {
  double scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  int64_t growth_interval = 0;
  int64_t growth_tracker = 0;
};

class GradScaler {
 public:
  // `device_type` is where the scaled outputs live (torch's device="cuda").
  explicit GradScaler(DeviceType device_type = DeviceType::kCUDA,
                      GradScalerOptions options = {});
  virtual ~GradScaler() = default;
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  // outputs * scale (the scale made on outputs' device on first use); throws
  // unless outputs is a floating tensor of the scaler's device type.
  Tensor scale(const Tensor& outputs);
  std::vector<Tensor> scale(const std::vector<Tensor>& outputs);

  // Divides the optimizer's gradients by the scale, in place, and notes
  // whether any is inf or NaN. At most once per optimizer between updates.
  void unscale_(Optimizer& optimizer);
  // Unscales when unscale_ was not called, then steps the optimizer unless a
  // gradient was inf or NaN. Returns whether it stepped.
  bool step(Optimizer& optimizer);
  // Backs off or grows the scale from this iteration's steps (or sets it to
  // new_scale), and readies every optimizer for the next iteration.
  void update(std::optional<double> new_scale = std::nullopt);

  // The current scale (1 when disabled; init_scale before the first scale()).
  double get_scale() const;
  double get_growth_factor() const { return options_.growth_factor; }
  void set_growth_factor(double growth_factor);
  double get_backoff_factor() const { return options_.backoff_factor; }
  void set_backoff_factor(double backoff_factor);
  int64_t get_growth_interval() const { return options_.growth_interval; }
  void set_growth_interval(int64_t growth_interval);
  bool is_enabled() const { return options_.enabled; }

  // nullopt when disabled (torch's empty dict).
  std::optional<GradScalerState> state_dict() const;
  void load_state_dict(const GradScalerState& state);

 protected:
  // Called by unscale_ with the found-inf flag of each device the
  // optimizer's gradients are on (float32 [1] each; empty when it has no
  // gradient here) and the scale's device. The base leaves them; a scaler of
  // gradients sharded across processes makes every rank's flags the same
  // (ShardedGradScaler), and may replace the list.
  virtual void reduce_found_inf(std::vector<Tensor>& found_infs, Device scale_device);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    std::vector<Tensor> found_inf_per_device;
  };
  void CheckScale(const char* call) const;

  DeviceType device_type_;
  GradScalerOptions options_;
  Tensor scale_;           // float32 [1] once scale() has run
  Tensor growth_tracker_;  // int32 [1]
  // init_scale's and the tracker's values before the tensors exist (a state
  // loaded before the first scale()).
  double pending_scale_;
  int64_t pending_tracker_ = 0;
  std::unordered_map<const Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace ember::nn::optim

#endif  // EMBER_NN_OPTIM_GRAD_SCALER_H_
