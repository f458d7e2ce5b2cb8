// The interface between embedding's CUDA backward (embedding_kernels.cu,
// built by nvcc) and its host side (embedding.cc, which registers it in
// nn/embedding_kernels.h's slot). Kernel-internal.
#ifndef EMBER_NN_CUDA_EMBEDDING_LAUNCH_H_
#define EMBER_NN_CUDA_EMBEDDING_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::nn::cuda_kernels {

// grad_weight[indices[i], :] += grad[i, :] for each of the n rows of `grad`
// ([n, d], contiguous) whose index is not padding_idx (-1: none);
// grad_weight must hold zeros. T is float or double. Runs on `stream` on the
// current device; returns the launch's error.
template <typename T>
cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const T* grad, const int64_t* indices,
                                    T* grad_weight, int64_t n, int64_t d, int64_t padding_idx);

}  // namespace ember::nn::cuda_kernels

#endif  // EMBER_NN_CUDA_EMBEDDING_LAUNCH_H_
