// The host-only parts of conv2d's cuDNN graph-API path (nn/cuda/conv_graph.h,
// Note [cuDNN graph API] in conv_graph.cc): its directions and the key of its
// plan cache. The strides, alignments and engine filter it shares with the
// other graph-API kernels are in nn/cuda/cudnn_graph.h. No device is needed.
//
// Thread-safety: pure functions.
#ifndef EMBER_NN_CUDA_CONV_GRAPH_PLAN_H_
#define EMBER_NN_CUDA_CONV_GRAPH_PLAN_H_

#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "nn/conv_kernels.h"
#include "nn/cuda/cudnn_graph.h"

namespace ember::nn::cudnn::internal {

// The convolution's three directions: y = conv(x, w), dx from dy and w, dw
// from x and dy.
enum class ConvDirection { kForward = 0, kInputGrad = 1, kWeightGrad = 2 };

// What a cached execution plan is specific to: the device and the handle it
// was built with (a handle belongs to one thread at a time, so a plan is
// never executed by two threads at once), the direction, the dtype, the TF32
// setting, whether the result is added to (beta 1: the weight gradient's
// later batch chunks), the input and weight sizes (the output's follow), the
// stride, padding, dilation and groups, and the byte alignments of x, w and y
// (`alignments`, as Alignment gives them).
inline std::vector<int64_t> GraphPlanKey(int device, uintptr_t handle, ConvDirection direction,
                                         int dtype, bool allow_tf32, bool accumulate,
                                         const std::vector<int64_t>& x_sizes,
                                         const std::vector<int64_t>& w_sizes,
                                         const ::ember::nn::internal::ConvParams& p,
                                         const std::vector<int64_t>& alignments) {
  std::vector<int64_t> key = {device, static_cast<int64_t>(handle), static_cast<int64_t>(direction),
                              dtype,  allow_tf32 ? 1 : 0,           accumulate ? 1 : 0};
  key.reserve(key.size() + x_sizes.size() + w_sizes.size() + 7 + alignments.size());
  key.insert(key.end(), x_sizes.begin(), x_sizes.end());
  key.insert(key.end(), w_sizes.begin(), w_sizes.end());
  key.insert(key.end(), {p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0],
                         p.dilation[1], p.groups});
  key.insert(key.end(), alignments.begin(), alignments.end());
  return key;
}

}  // namespace ember::nn::cudnn::internal

#endif  // EMBER_NN_CUDA_CONV_GRAPH_PLAN_H_
