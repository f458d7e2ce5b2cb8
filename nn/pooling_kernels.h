// The per-device kernels of max_pool2d, avg_pool2d and adaptive_avg_pool2d
// (Note [nn device kernels] in nn/device_kernels.h): nn/pooling.cc defines
// the slots and registers the CPU kernels; a device's library (nn/cuda/)
// registers its own.
//
// Inputs are [N, C, H, W]; a kernel works plane by plane (N * C planes).
// Max pooling returns the argmax of each window as an index into its plane
// (iy * W + ix; -1 for a window that holds no input element), and its
// backward and double backward are the scatter and gather at those indices
// (Note [Pooling double backward] in pooling.cc). Average and adaptive
// average pooling share one form: an AvgPlan gives each output row's and
// column's window and divisor, so ceil_mode, count_include_pad and adaptive
// windows are decided once, by the layer. Arguments may be non-contiguous and
// must be detached; every tensor is on the input's device, values of the
// input's dtype, indices int64; the layer has checked shapes, dtypes and
// devices. Kernel-internal.
#ifndef EMBER_NN_POOLING_KERNELS_H_
#define EMBER_NN_POOLING_KERNELS_H_

#include <array>
#include <cstdint>
#include <vector>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

using Pool2 = std::array<int64_t, 2>;

// {out [N, C, OH, OW], indices [N, C, OH, OW] (int64)}: each window's
// maximum (NaN if it holds one) and where it is. The window of output
// (oy, ox) takes rows oy * stride - padding + ki * dilation, ki < kernel
// (likewise for columns), skipping those outside the input.
using MaxPool2dForwardFn = std::array<Tensor, 2>(const Tensor& input, Pool2 kernel, Pool2 stride,
                                                 Pool2 padding, Pool2 dilation, Pool2 out_size);

// The windows the indices come from.
struct MaxPoolWindow {
  Pool2 kernel, stride, padding, dilation;
};

// The input-shaped (`input_sizes`) gradient: zeros, plus grad[plane, j] at
// indices[plane, j], summed in the order of j where windows share an argmax
// (deterministic: a kernel that works per input element finds the outputs
// whose windows may hold it from `window`, rather than adding atomically).
using MaxPool2dScatterFn = Tensor(const Tensor& grad, const Tensor& indices,
                                  const std::vector<int64_t>& input_sizes,
                                  const MaxPoolWindow& window);

// out[plane, j] = input[plane, indices[plane, j]] (0 for index -1), of
// indices' shape.
using MaxPool2dGatherFn = Tensor(const Tensor& input, const Tensor& indices);

// Output row oy averages input rows [ys[oy], ye[oy]) and columns
// [xs[ox], xe[ox]), divided by yc[oy] * xc[ox] (0 for a zero divisor);
// `sizes` is the input's [N, C, H, W]. Starts and ends never decrease.
struct AvgPlan {
  std::vector<int64_t> sizes, ys, ye, yc, xs, xe, xc;
};

// The average pool, [N, C, OH, OW].
using AvgPool2dForwardFn = Tensor(const Tensor& input, const AvgPlan& plan);

// Its adjoint (the backward): each output's gradient spread evenly over its
// window, into an input-shaped tensor.
using AvgPool2dAdjointFn = Tensor(const Tensor& grad, const AvgPlan& plan);

extern constinit DeviceKernel<MaxPool2dForwardFn> max_pool2d_forward;
extern constinit DeviceKernel<MaxPool2dScatterFn> max_pool2d_scatter;
extern constinit DeviceKernel<MaxPool2dGatherFn> max_pool2d_gather;
extern constinit DeviceKernel<AvgPool2dForwardFn> avg_pool2d_forward;
extern constinit DeviceKernel<AvgPool2dAdjointFn> avg_pool2d_adjoint;

}  // namespace ember::nn::internal

#endif  // EMBER_NN_POOLING_KERNELS_H_
