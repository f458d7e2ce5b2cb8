// The interface between layer_norm's CUDA kernels (layer_norm_kernels.cu,
// built by nvcc) and their host side (layer_norm.cc, which registers them in
// nn/layer_norm_kernels.h's slots). Kernel-internal.
//
// The input is [rows, d], contiguous; weight, bias, grad_input, grad_weight
// and grad_bias may be null (absent or not wanted). T is float or double;
// statistics and sums are accumulated in double, as the CPU kernels do.
// Each launcher runs on `stream` on the current device and returns the
// launch's error.
#ifndef EMBER_NN_CUDA_LAYER_NORM_LAUNCH_H_
#define EMBER_NN_CUDA_LAYER_NORM_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ember::nn::cuda_kernels {

// One block per row: the row's mean and rstd (written to mean[r], rstd[r])
// and the normalised, scaled and shifted row.
template <typename T>
cudaError_t LaunchLayerNormForward(cudaStream_t stream, const T* input, const T* weight,
                                   const T* bias, T* out, T* mean, T* rstd, int64_t rows, int64_t d,
                                   double eps);

// Bytes of device workspace LaunchLayerNormBackward needs for grad_weight
// or grad_bias of a [rows, d] input (0 for none).
size_t LayerNormBackwardWorkspaceBytes(int64_t rows, int64_t d);

// grad_input by one block per row; grad_weight and grad_bias by a column
// reduction over the rows in a fixed order (deterministic), in chunks of
// rows whose sums go through `workspace` (LayerNormBackwardWorkspaceBytes,
// 8-byte aligned) when there are many rows.
template <typename T>
cudaError_t LaunchLayerNormBackward(cudaStream_t stream, const T* grad, const T* input,
                                    const T* weight, const T* mean, const T* rstd, T* grad_input,
                                    T* grad_weight, T* grad_bias, int64_t rows, int64_t d,
                                    void* workspace);

}  // namespace ember::nn::cuda_kernels

#endif  // EMBER_NN_CUDA_LAYER_NORM_LAUNCH_H_
