// The per-device kernels of layer_norm (Note [nn device kernels] in
// nn/device_kernels.h): nn/normalization.cc defines the slots and registers
// the CPU kernels; a device's library (nn/cuda/) registers its own.
//
// The input is viewed as [R, D], D the product of normalized_shape: each row
// is normalised with its own mean and rstd = 1 / sqrt(var + eps) (the biased
// variance), then scaled by weight and shifted by bias ([D] each, or
// undefined). Every tensor handed to a kernel is contiguous, of the input's
// dtype (float32 or float64) and on the input's device; the layer has
// checked shapes, dtypes and devices. Kernel-internal.
#ifndef EMBER_NN_LAYER_NORM_KERNELS_H_
#define EMBER_NN_LAYER_NORM_KERNELS_H_

#include <array>
#include <cstdint>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// {out (the input's shape), mean [R], rstd [R]}; `d` is D.
using LayerNormForwardFn = std::array<Tensor, 3>(const Tensor& input, const Tensor& weight,
                                                 const Tensor& bias, int64_t d, double eps);

// {grad_input (the input's shape), grad_weight [D], grad_bias [D]} from the
// output gradient and the forward's input, weight, mean and rstd; each only
// where `needs` asks for it (and grad_weight only with a weight), else
// undefined.
using LayerNormBackwardFn = std::array<Tensor, 3>(const Tensor& grad, const Tensor& input,
                                                  const Tensor& weight, const Tensor& mean,
                                                  const Tensor& rstd, int64_t d,
                                                  std::array<bool, 3> needs);

extern constinit DeviceKernel<LayerNormForwardFn> layer_norm_forward;
extern constinit DeviceKernel<LayerNormBackwardFn> layer_norm_backward;

}  // namespace ember::nn::internal

#endif  // EMBER_NN_LAYER_NORM_KERNELS_H_
