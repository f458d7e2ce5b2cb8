// Losses: cross entropy, negative log likelihood, mean squared error, L1 and
// binary cross entropy with logits, as torch.nn.functional's and torch.nn's
// loss modules.
//
//   ```cpp
//   #include "nn/loss.h"
//   #include "tensor/factories.h"
//   ember::Tensor logits = ember::randn({4, 10}).requires_grad_();
//   ember::Tensor labels = ember::tensor({1, 0, 9, 3});  // int64 class indices
//   ember::Tensor loss = ember::nn::functional::cross_entropy(logits, labels);
//   ember::nn::CrossEntropyLoss criterion({.label_smoothing = 0.1});
//   ember::Tensor l = criterion(logits, labels);
//   l.backward();
//   ```
//
// cross_entropy and nll_loss take class indices (int64) as targets: input
// [N, C] with target [N], or input [C] with a 0-dim target. Entries equal to
// ignore_index (default -100) contribute nothing; the mean divides by the
// number of the others. cross_entropy fuses log_softmax and NLL in one kernel
// with an explicit backward (softmax - one_hot, scaled), so it never
// materialises the log-probabilities' graph; with label_smoothing s the
// target distribution is (1 - s) * one_hot + s / C, as PyTorch. mse_loss,
// l1_loss and binary_cross_entropy_with_logits are composed of tensor ops
// (autograd differentiates them); the last uses the stable form
// max(x, 0) - x * y + log(1 + exp(-|x|)).
//
// Errors: shape and dtype mismatches and out-of-range targets ("Target 12 is
// out of bounds.") throw ember::Error. Loss modules are plain function
// objects, not Modules (they have no state). Thread-safe.
#ifndef EMBER_NN_LOSS_H_
#define EMBER_NN_LOSS_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace ember::nn {

enum class Reduction { kNone, kMean, kSum };

struct CrossEntropyOptions {
  Reduction reduction = Reduction::kMean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

struct NllOptions {
  Reduction reduction = Reduction::kMean;
  int64_t ignore_index = -100;
};

namespace functional {
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyOptions& options = {});
Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& options = {});
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);
// pos_weight (undefined, or broadcastable to the input) weighs positives.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = Reduction::kMean,
                                        const Tensor& pos_weight = Tensor());
}  // namespace functional

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::cross_entropy(input, target, options_);
  }

 private:
  CrossEntropyOptions options_;
};

class NLLLoss {
 public:
  explicit NLLLoss(NllOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::nll_loss(input, target, options_);
  }

 private:
  NllOptions options_;
};

class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::kMean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::mse_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class L1Loss {
 public:
  explicit L1Loss(Reduction reduction = Reduction::kMean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::l1_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class BCEWithLogitsLoss {
 public:
  explicit BCEWithLogitsLoss(Reduction reduction = Reduction::kMean, Tensor pos_weight = Tensor())
      : reduction_(reduction), pos_weight_(std::move(pos_weight)) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::binary_cross_entropy_with_logits(input, target, reduction_, pos_weight_);
  }

 private:
  Reduction reduction_;
  Tensor pos_weight_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_LOSS_H_
