// The per-device kernels of batch_norm (BatchNorm1d, BatchNorm2d) (Note [nn
// device kernels] in nn/device_kernels.h): nn/normalization.cc defines the
// slots and registers the CPU kernels; a device's library (nn/cuda/: cuDNN)
// registers its own.
//
// The input [N, C, *] is viewed as [N, C, S]: each channel is normalised over
// its N * S elements, with the batch's mean and biased variance in training
// and the running statistics in eval, as
//   out = (x - mean) * invstd * weight + bias,  invstd = 1 / sqrt(var + eps),
// weight and bias [C] each, or undefined (1 and 0). Training also updates
// running_mean and running_var (when given) in place with
//   running = (1 - momentum) * running + momentum * batch statistic,
// the variance's being the unbiased one (N * S - 1 in the divisor), as torch
// does; the layer bumps their versions. The running statistics may have
// another floating dtype than the input. Every tensor is contiguous, detached
// and on the input's device; the layer has checked shapes, dtypes and
// devices. Kernel-internal.
#ifndef EMBER_NN_BATCH_NORM_KERNELS_H_
#define EMBER_NN_BATCH_NORM_KERNELS_H_

#include <array>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// {out (the input's shape), mean [C], invstd [C]}: the statistics the
// output was normalised with (the batch's in training, the running ones in
// eval), of the input's dtype or a wider one (CUDA's float32 for float16
// and bfloat16 inputs), for the backward.
using BatchNormForwardFn = std::array<Tensor, 3>(const Tensor& input, const Tensor& weight,
                                                 const Tensor& bias, const Tensor& running_mean,
                                                 const Tensor& running_var, bool training,
                                                 double momentum, double eps);

// {grad_input, grad_weight [C], grad_bias [C]} from the output gradient and
// the forward's input, weight, mean and invstd (and its eps); in training
// the statistics are the batch's (and so depend on the input), in eval
// constants. Each only where `needs` asks for it (and grad_weight only with a
// weight), else undefined.
using BatchNormBackwardFn = std::array<Tensor, 3>(const Tensor& grad, const Tensor& input,
                                                  const Tensor& weight, const Tensor& mean,
                                                  const Tensor& invstd, bool training, double eps,
                                                  std::array<bool, 3> needs);

extern constinit DeviceKernel<BatchNormForwardFn> batch_norm_forward;
extern constinit DeviceKernel<BatchNormBackwardFn> batch_norm_backward;

}  // namespace ember::nn::internal

#endif  // EMBER_NN_BATCH_NORM_KERNELS_H_
