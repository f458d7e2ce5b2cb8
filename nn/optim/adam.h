// Adam and AdamW, as torch.optim.Adam / torch.optim.AdamW.
//
//   ```cpp
//   #include "nn/linear.h"
//   #include "nn/optim/adam.h"
//   auto model = std::make_shared<ember::nn::Linear>(4, 2);
//   ember::nn::optim::Adam opt(model->parameters(), {.lr = 1e-3});
//   ember::nn::optim::AdamW optw(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   ```
//
// Per parameter p with gradient g at step t (PyTorch's update rule):
//   Adam:  g += weight_decay * p            AdamW: p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g     (amsgrad: vmax = max(vmax, v), used below)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State: "step", "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq" with
// amsgrad). AdamW differs only in its decoupled weight decay and its default
// weight_decay of 0.01. Errors, threads: see nn/optim/optimizer.h.
#ifndef EMBER_NN_OPTIM_ADAM_H_
#define EMBER_NN_OPTIM_ADAM_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "nn/optim/optimizer.h"
#include "tensor/tensor.h"

namespace ember::nn::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
  // torch's capturable: the step count and the learning rate live on the
  // parameters' device (Note [Capturable steps] in fused_kernels.h), so the
  // step can be captured in a CUDA graph and replayed.
  bool capturable = false;

  static void Validate(const AdamOptions& o);
  std::vector<std::pair<std::string, double>> ToPairs() const;
  absl::Status FromPairs(const std::vector<std::pair<std::string, double>>& pairs);
};

// AdamW's options: Adam's, with weight_decay defaulting to 0.01.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  bool capturable = false;  // as AdamOptions'

  static void Validate(const AdamWOptions& o);
  std::vector<std::pair<std::string, double>> ToPairs() const;
  absl::Status FromPairs(const std::vector<std::pair<std::string, double>>& pairs);
};

struct AdamState {
  int64_t step = 0;
  // With capturable: the count on the parameter's device, which the step
  // increments there (`step` is then the host's count of the steps it ran).
  Tensor step_tensor;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  Tensor max_exp_avg_sq;

  bool initialized() const { return exp_avg.defined(); }
  std::vector<std::pair<std::string, Tensor>> ToPairs() const;
  absl::Status FromPairs(const std::vector<std::pair<std::string, Tensor>>& pairs,
                         const Tensor& param);
};

class Adam : public OptimizerBase<AdamOptions, AdamState> {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  explicit Adam(std::vector<ParamGroup> groups) : OptimizerBase(std::move(groups)) {}
  void step() override;
};

class AdamW : public OptimizerBase<AdamWOptions, AdamState> {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  explicit AdamW(std::vector<ParamGroup> groups) : OptimizerBase(std::move(groups)) {}
  void step() override;
};

}  // namespace ember::nn::optim

#endif  // EMBER_NN_OPTIM_ADAM_H_
