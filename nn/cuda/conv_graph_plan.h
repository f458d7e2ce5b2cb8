// The host-only parts of conv2d's cuDNN graph-API path (nn/cuda/conv_graph.h,
// Note [cuDNN graph API] in conv_graph.cc): the packed NCHW strides of its
// tensor descriptors, the byte alignment of their data pointers, the key of
// its plan cache and the filter that keeps full float32 precision (TF32 off)
// by refusing engines through their numerical notes. No device is needed.
//
// Thread-safety: pure functions.
#ifndef EMBER_NN_CUDA_CONV_GRAPH_PLAN_H_
#define EMBER_NN_CUDA_CONV_GRAPH_PLAN_H_

#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "nn/conv_kernels.h"

namespace ember::nn::cudnn::internal {

// The convolution's three directions: y = conv(x, w), dx from dy and w, dw
// from x and dy.
enum class ConvDirection { kForward = 0, kInputGrad = 1, kWeightGrad = 2 };

// The strides of a contiguous tensor of `dims` (row-major: NCHW for 4 dims).
inline std::vector<int64_t> PackedStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

// The largest power of two, at most 16, that divides `address` (16 for
// address 0): the byte alignment a tensor descriptor promises cuDNN for the
// data it is executed on.
inline int64_t Alignment(uintptr_t address) {
  int64_t alignment = 1;
  while (alignment < 16 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

// Whether an engine whose numerical notes are `notes` must be refused for
// data of `type`, as torch filters cuDNN's engine configurations: for
// float32 with TF32 off (`allow_tf32` false), one on the tensor cores (TF32
// products) or one that converts its inputs to a lower precision. float32
// with TF32 allowed, float64, float16 and bfloat16 take any engine, as on
// the legacy path.
inline bool RefusesEngine(const std::vector<cudnnBackendNumericalNote_t>& notes,
                          cudnnDataType_t type, bool allow_tf32) {
  if (type != CUDNN_DATA_FLOAT || allow_tf32) return false;
  for (cudnnBackendNumericalNote_t note : notes) {
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
        note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) {
      return true;
    }
  }
  return false;
}

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
