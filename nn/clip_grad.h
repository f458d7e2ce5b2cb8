// Gradient clipping, as torch.nn.utils.clip_grad_norm_.
//
//   ```cpp
//   #include "nn/clip_grad.h"
//   #include "nn/linear.h"
//   #include "nn/optim/sgd.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Linear>(4, 2);
//   ember::nn::optim::SGD optimizer(model->parameters(), {.lr = 0.1});
//   ember::Tensor loss = (*model)(ember::randn({8, 4})).pow(2).sum();
//   loss.backward();
//   ember::Tensor norm = ember::nn::clip_grad_norm_(model->parameters(), 1.0);
//   optimizer.step();
//   ```
//
// Computes the norm of all gradients together (as if concatenated into one
// vector; norm_type may be any p > 0 or infinity) and, when it exceeds
// max_norm, scales every gradient in place by max_norm / (norm + 1e-6).
// Parameters without a gradient are skipped. Returns the total norm (a
// 0-dim float tensor) before clipping.
//
// Errors: with error_if_nonfinite, a NaN or infinite total norm throws
// ember::Error and leaves the gradients untouched. Not thread-safe with
// respect to concurrent writers of the same gradients.
#ifndef EMBER_NN_CLIP_GRAD_H_
#define EMBER_NN_CLIP_GRAD_H_

#include <vector>

#include "tensor/tensor.h"

namespace ember::nn {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace ember::nn

#endif  // EMBER_NN_CLIP_GRAD_H_
