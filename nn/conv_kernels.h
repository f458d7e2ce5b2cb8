// The per-device kernels of conv2d (Note [nn device kernels] in
// nn/device_kernels.h): nn/conv.cc defines the slots and registers the CPU
// kernels (oneDNN and im2col); a device's library (nn/cuda/: cuDNN) registers
// its own.
//
// The three kernels are the convolution and its two gradients, in whose
// terms every derivative of conv2d is written (Note [Convolution double
// backward] in conv.cc): the input gradient is also nn's transposed
// convolution (grad::conv2d_input). Input [N, C, H, W], weight
// [O, C / groups, kh, kw], output [N, O, OH, OW]. Arguments may be
// non-contiguous and must be detached (plain tensors: the Functions record
// the graph); every tensor is on the input's device and of its dtype, and the
// layer has checked shapes, dtypes and devices. A kernel refuses dtypes it
// does not compute, naming them. Kernel-internal.
#ifndef EMBER_NN_CONV_KERNELS_H_
#define EMBER_NN_CONV_KERNELS_H_

#include <array>
#include <cstdint>
#include <vector>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// Stride, padding, dilation and groups of one convolution.
struct ConvParams {
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
};

// y = conv(x, w) + b (b may be undefined), [N, O, OH, OW].
using ConvForwardFn = Tensor(const Tensor& input, const Tensor& weight, const Tensor& bias,
                             const ConvParams& p);

// The gradient of conv(x, w) with respect to x, of shape `input_sizes`, from
// the output gradient.
using ConvInputGradFn = Tensor(const Tensor& grad, const Tensor& weight,
                               const std::vector<int64_t>& input_sizes, const ConvParams& p);

// The gradient of conv(x, w) with respect to w, of shape `weight_sizes`, from
// the output gradient; and, when `grad_bias` is given, the bias's ([O], go
// summed over N, OH, OW) into it.
using ConvWeightGradFn = Tensor(const Tensor& input, const Tensor& grad,
                                const std::vector<int64_t>& weight_sizes, const ConvParams& p,
                                Tensor* grad_bias);

extern constinit DeviceKernel<ConvForwardFn> conv2d_forward;
extern constinit DeviceKernel<ConvInputGradFn> conv2d_input_grad;
extern constinit DeviceKernel<ConvWeightGradFn> conv2d_weight_grad;

}  // namespace ember::nn::internal

#endif  // EMBER_NN_CONV_KERNELS_H_
