#include "nn/optim/optimizer.h"

#include "autograd/grad_mode.h"

namespace ember::nn::optim {

void Optimizer::zero_grad(bool set_to_none) {
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : params(g)) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        autograd::NoGradGuard no_grad;
        grad.zero_();
      }
    }
  }
}

}  // namespace ember::nn::optim
