// SGD: stochastic gradient descent with momentum, dampening, Nesterov
// momentum and weight decay, as torch.optim.SGD.
//
//   ```cpp
//   #include "nn/linear.h"
//   #include "nn/optim/sgd.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Linear>(4, 2);
//   ember::nn::optim::SGD opt(model->parameters(),
//                             {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
//   ember::Tensor loss = (*model)(ember::randn({8, 4})).square().mean();
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
//   ```
//
// Per parameter p with gradient g (PyTorch's update rule):
//   g += weight_decay * p
//   buf = g (first step) or momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
//   p -= lr * g                                      (p += lr * g with maximize)
// State: "momentum_buffer". Errors, threads: see nn/optim/optimizer.h.
#ifndef EMBER_NN_OPTIM_SGD_H_
#define EMBER_NN_OPTIM_SGD_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "nn/optim/optimizer.h"
#include "tensor/tensor.h"

namespace ember::nn::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
  // The learning rate read from device memory, so that a step captured in a
  // CUDA graph follows set_lr (Note [Capturable steps] in fused_kernels.h;
  // torch's SGD takes a tensor lr for it). A runtime choice: not in
  // state_dict.
  bool capturable = false;

  static void Validate(const SGDOptions& o);
  std::vector<std::pair<std::string, double>> ToPairs() const;
  absl::Status FromPairs(const std::vector<std::pair<std::string, double>>& pairs);
};

struct SGDState {
  Tensor momentum_buffer;

  bool initialized() const { return momentum_buffer.defined(); }
  std::vector<std::pair<std::string, Tensor>> ToPairs() const;
  absl::Status FromPairs(const std::vector<std::pair<std::string, Tensor>>& pairs,
                         const Tensor& param);
};

class SGD : public OptimizerBase<SGDOptions, SGDState> {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  explicit SGD(std::vector<ParamGroup> groups) : OptimizerBase(std::move(groups)) {}

  void step() override;
};

}  // namespace ember::nn::optim

#endif  // EMBER_NN_OPTIM_SGD_H_
