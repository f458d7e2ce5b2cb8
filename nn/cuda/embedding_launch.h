// The interface between embedding's CUDA backward (embedding_kernels.cu,
// built by nvcc) and its host side (embedding.cc, which registers it in
// nn/embedding_kernels.h's slot). Kernel-internal.
#ifndef EMBER_NN_CUDA_EMBEDDING_LAUNCH_H_
#define EMBER_NN_CUDA_EMBEDDING_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ember::nn::cuda_kernels {

// Bytes of device workspace LaunchEmbeddingBackward needs for n lookups of
// rows of d values into a table of num_weights rows (0 when n or d is 0).
size_t EmbeddingBackwardWorkspaceBytes(int64_t n, int64_t d, int64_t num_weights);

// grad_weight[w, :] = the sum of grad[i, :] over the lookups i with
// indices[i] == w (in a fixed order: Note [Embedding backward windows]), for every w but
// padding_idx (-1: none); `grad` is [n, d] and contiguous, `indices` [n] in [0, num_weights),
// grad_weight [num_weights, d] must hold zeros (rows never looked up keep
// them). T is float or double. Deterministic: the same inputs give the same
// bits. `workspace` holds EmbeddingBackwardWorkspaceBytes(n, num_weights)
// bytes of device memory, 256-byte aligned. Runs on `stream` on the current
// device; returns the first error.
template <typename T>
cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const T* grad, const int64_t* indices,
                                    T* grad_weight, int64_t n, int64_t d, int64_t num_weights,
                                    int64_t padding_idx, void* workspace);

}  // namespace ember::nn::cuda_kernels

#endif  // EMBER_NN_CUDA_EMBEDDING_LAUNCH_H_
