// The interface between the class-index losses' CUDA kernels
// (loss_kernels.cu, built by nvcc) and their host side (loss.cc, which
// registers them in nn/loss_kernels.h's slots). Kernel-internal.
//
// input [n, c] and target [n] are contiguous; T is float or double. Each
// launcher runs on `stream` on the current device and returns the launch's
// error.
#ifndef EMBER_NN_CUDA_LOSS_LAUNCH_H_
#define EMBER_NN_CUDA_LOSS_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::nn::cuda_kernels {

// What a forward launch reports back (device memory, 16 bytes): the first
// row whose target is neither ignore_index nor in [0, c) (kNoBadRow when
// none), and the number of rows whose target is not ignore_index.
struct ClassLossStatus {
  unsigned long long first_bad_row;
  unsigned long long count;
};
inline constexpr unsigned long long kNoBadRow = ~0ull;

// Cross entropy, one block per row: rows[i] (float64) the row's loss (0 for an
// ignored row), lse[i] (float64) its log-sum-exp. Initialises *status.
template <typename T>
cudaError_t LaunchCrossEntropyForward(cudaStream_t stream, const T* input, const int64_t* target,
                                      double* rows, double* lse, ClassLossStatus* status, int64_t n,
                                      int64_t c, int64_t ignore_index, double label_smoothing);

// grad_input [n, c] = scale_i (softmax(x_i) - q_i), scale_i = grad[i] when
// per_row, else grad[0] / divisor; zero rows for ignored targets.
template <typename T>
cudaError_t LaunchCrossEntropyBackward(cudaStream_t stream, const T* grad, const T* input,
                                       const int64_t* target, const double* lse, T* grad_input,
                                       int64_t n, int64_t c, bool per_row, double divisor,
                                       int64_t ignore_index, double label_smoothing);

// NLL: rows[i] = -input[i, target[i]] (0 for an ignored row). Initialises
// *status.
template <typename T>
cudaError_t LaunchNllForward(cudaStream_t stream, const T* input, const int64_t* target,
                             double* rows, ClassLossStatus* status, int64_t n, int64_t c,
                             int64_t ignore_index);

// grad_input (zeros [n, c]) at (i, target[i]) = -scale_i for the rows kept.
template <typename T>
cudaError_t LaunchNllBackward(cudaStream_t stream, const T* grad, const int64_t* target,
                              T* grad_input, int64_t n, int64_t c, bool per_row, double divisor,
                              int64_t ignore_index);

}  // namespace ember::nn::cuda_kernels

#endif  // EMBER_NN_CUDA_LOSS_LAUNCH_H_
