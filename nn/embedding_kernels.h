// The per-device kernel of embedding's backward (Note [nn device kernels] in
// nn/device_kernels.h): nn/embedding.cc defines the slot and registers the
// CPU kernel; a device's library (nn/cuda/) registers its own. The lookup
// itself is index_select, which every device has. Kernel-internal.
#ifndef EMBER_NN_EMBEDDING_KERNELS_H_
#define EMBER_NN_EMBEDDING_KERNELS_H_

#include <cstdint>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// The weight's gradient [num_weights, D]: row w is the sum of the rows i of
// `grad` ([N, D], contiguous, float32 or float64) whose index indices[i] is w
// (`indices` [N], contiguous int64, checked to be in [0, num_weights)); rows
// whose index is padding_idx (-1: none) add nothing. Repeated indices
// accumulate. All on one device.
using EmbeddingBackwardFn = Tensor(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                                   int64_t padding_idx);

extern constinit DeviceKernel<EmbeddingBackwardFn> embedding_backward;

}  // namespace ember::nn::internal

#endif  // EMBER_NN_EMBEDDING_KERNELS_H_
