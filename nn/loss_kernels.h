// The per-device kernels of the class-index losses, cross_entropy and
// nll_loss (Note [nn device kernels] in nn/device_kernels.h): nn/loss.cc
// defines the slots and registers the CPU kernels; a device's library
// (nn/cuda/) registers its own. mse_loss, l1_loss and
// binary_cross_entropy_with_logits are tensor ops on every device and need
// none.
//
// The input is [N, C] (float32 or float64, contiguous), the target [N]
// (int64 class indices, contiguous), both on one device; the layer has
// checked shapes and dtypes. A forward kernel checks the targets (each in
// [0, C) or equal to ignore_index) and throws "Target 12 is out of bounds."
// for the first that is not, as PyTorch; so a device kernel reads that
// verdict (and the count of rows kept) back to the host. Kernel-internal.
#ifndef EMBER_NN_LOSS_KERNELS_H_
#define EMBER_NN_LOSS_KERNELS_H_

#include <cstdint>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// A class-index loss before its reduction.
struct ClassLossRows {
  Tensor rows;        // float64 [N]: each row's loss, 0 for an ignored row
  Tensor lse;         // float64 [N]: each row's log-sum-exp (cross_entropy only)
  int64_t count = 0;  // rows whose target is not ignore_index
};

// How the backward scales row i's gradient: by grad[i] (per_row: reduction
// none) or by grad[0] / divisor (sum: 1, mean: the count of rows kept);
// ignored rows get zeros.
struct ClassLossGrad {
  bool per_row = false;
  double divisor = 1;
  int64_t ignore_index = -100;
  double label_smoothing = 0;  // cross_entropy only
};

// Row loss (1 - s) * (lse - x[t]) + s * (lse - mean_j x[j]), s the label
// smoothing.
using CrossEntropyForwardFn = ClassLossRows(const Tensor& input, const Tensor& target,
                                            int64_t ignore_index, double label_smoothing);
// grad_input [N, C] = scale_i * (softmax(x_i) - q_i), q_i the smoothed one-hot
// target; `grad` is in the input's dtype ([N] or 0-dim), `lse` the forward's.
using CrossEntropyBackwardFn = Tensor(const Tensor& grad, const Tensor& input, const Tensor& target,
                                      const Tensor& lse, const ClassLossGrad& args);
// Row loss -x[t] (`lse` left undefined).
using NllForwardFn = ClassLossRows(const Tensor& input, const Tensor& target, int64_t ignore_index);
// grad_input [N, classes]: -scale_i at (i, t_i), zeros elsewhere, in grad's
// dtype.
using NllBackwardFn = Tensor(const Tensor& grad, const Tensor& target, int64_t classes,
                             const ClassLossGrad& args);

extern constinit DeviceKernel<CrossEntropyForwardFn> cross_entropy_forward;
extern constinit DeviceKernel<CrossEntropyBackwardFn> cross_entropy_backward;
extern constinit DeviceKernel<NllForwardFn> nll_loss_forward;
extern constinit DeviceKernel<NllBackwardFn> nll_loss_backward;

}  // namespace ember::nn::internal

#endif  // EMBER_NN_LOSS_KERNELS_H_
