// Device side of cross_entropy and nll_loss on CUDA (loss_launch.h).
// cross_entropy's forward fuses log_softmax and the gather of the target's
// log-probability: one block per row finds the row's max, then sum(exp(x -
// max)) and sum(x) (for label smoothing), combining its threads' partial
// sums in a fixed order (cuda/loops.cuh BlockCombine), in double as the CPU
// kernel. Its backward is one elementwise pass, softmax recomputed from the
// saved log-sum-exp. A bad target is not written anywhere: its row is
// reported through the status (atomicMin keeps the first), and the host
// throws.
#include <cmath>

#include "cuda/loops.cuh"
#include "nn/cuda/loss_launch.h"

namespace ember::nn::cuda_kernels {
namespace {

using ::ember::cuda::kernels::BlockCombine;
using ::ember::cuda::kernels::GridFor;
using ::ember::cuda::kernels::kThreads;
using ::ember::cuda::kernels::ThreadsFor;

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};
// NaN wins, so a NaN in a row makes its loss NaN.
struct MaxOp {
  __device__ double operator()(double a, double b) const { return (b > a || b != b) ? b : a; }
};

__device__ __forceinline__ void ReportBadRow(ClassLossStatus* status, int64_t row) {
  atomicMin(&status->first_bad_row, static_cast<unsigned long long>(row));
}

template <typename T>
__global__ void CrossEntropyForwardKernel(const T* __restrict__ x, const int64_t* __restrict__ t,
                                          double* __restrict__ rows, double* __restrict__ lse,
                                          ClassLossStatus* status, int64_t n, int64_t c,
                                          int64_t ignore_index, double smoothing) {
  __shared__ double smem[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* row = x + i * c;
    double mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      mx = MaxOp()(mx, static_cast<double>(row[j]));
    }
    mx = BlockCombine<double>(mx, MaxOp(), smem);
    double sum = 0, total = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const double v = static_cast<double>(row[j]);
      sum += exp(v - mx);
      total += v;
    }
    sum = BlockCombine<double>(sum, SumOp(), smem);
    total = BlockCombine<double>(total, SumOp(), smem);
    if (threadIdx.x != 0) continue;
    const double l = mx + log(sum);
    lse[i] = l;
    const int64_t ti = t[i];
    double loss = 0;
    if (ti != ignore_index) {
      if (ti < 0 || ti >= c) {
        ReportBadRow(status, i);
      } else {
        loss = (1 - smoothing) * (l - static_cast<double>(row[ti])) +
               smoothing * (l - total / static_cast<double>(c));
        atomicAdd(&status->count, 1ull);
      }
    }
    rows[i] = loss;
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* __restrict__ g, const T* __restrict__ x,
                                           const int64_t* __restrict__ t,
                                           const double* __restrict__ lse, T* __restrict__ gx,
                                           int64_t n, int64_t c, bool per_row, double divisor,
                                           int64_t ignore_index, double smoothing) {
  const int64_t total = n * c;
  const double uniform = smoothing / static_cast<double>(c);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / c, j = e - i * c;
    const int64_t ti = t[i];
    if (ti == ignore_index) {
      gx[e] = T(0);
      continue;
    }
    // Rounded to T first, as the CPU kernel's scale.
    const T scale = per_row ? g[i] : static_cast<T>(static_cast<double>(g[0]) / divisor);
    const double target_p = uniform + (j == ti ? 1 - smoothing : 0.0);
    gx[e] = static_cast<T>(static_cast<double>(scale) *
                           (exp(static_cast<double>(x[e]) - lse[i]) - target_p));
  }
}

template <typename T>
__global__ void NllForwardKernel(const T* __restrict__ x, const int64_t* __restrict__ t,
                                 double* __restrict__ rows, ClassLossStatus* status, int64_t n,
                                 int64_t c, int64_t ignore_index) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ti = t[i];
    double loss = 0;
    if (ti != ignore_index) {
      if (ti < 0 || ti >= c) {
        ReportBadRow(status, i);
      } else {
        loss = -static_cast<double>(x[i * c + ti]);
        atomicAdd(&status->count, 1ull);
      }
    }
    rows[i] = loss;
  }
}

template <typename T>
__global__ void NllBackwardKernel(const T* __restrict__ g, const int64_t* __restrict__ t,
                                  T* __restrict__ gx, int64_t n, int64_t c, bool per_row,
                                  double divisor, int64_t ignore_index) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ti = t[i];
    if (ti == ignore_index) continue;
    const T scale = per_row ? g[i] : static_cast<T>(static_cast<double>(g[0]) / divisor);
    gx[i * c + ti] = -scale;
  }
}

// Sets first_bad_row to kNoBadRow (all bits set) and count to 0.
cudaError_t InitStatus(cudaStream_t stream, ClassLossStatus* status) {
  cudaError_t e = cudaMemsetAsync(&status->first_bad_row, 0xff, sizeof(unsigned long long), stream);
  if (e != cudaSuccess) return e;
  return cudaMemsetAsync(&status->count, 0, sizeof(unsigned long long), stream);
}

unsigned RowBlocks(int64_t rows) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace

template <typename T>
cudaError_t LaunchCrossEntropyForward(cudaStream_t stream, const T* input, const int64_t* target,
                                      double* rows, double* lse, ClassLossStatus* status, int64_t n,
                                      int64_t c, int64_t ignore_index, double label_smoothing) {
  if (cudaError_t e = InitStatus(stream, status); e != cudaSuccess || n == 0) return e;
  CrossEntropyForwardKernel<T><<<RowBlocks(n), ThreadsFor(c), 0, stream>>>(
      input, target, rows, lse, status, n, c, ignore_index, label_smoothing);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchCrossEntropyBackward(cudaStream_t stream, const T* grad, const T* input,
                                       const int64_t* target, const double* lse, T* grad_input,
                                       int64_t n, int64_t c, bool per_row, double divisor,
                                       int64_t ignore_index, double label_smoothing) {
  if (n == 0 || c == 0) return cudaSuccess;
  CrossEntropyBackwardKernel<T><<<GridFor(n * c), kThreads, 0, stream>>>(
      grad, input, target, lse, grad_input, n, c, per_row, divisor, ignore_index, label_smoothing);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchNllForward(cudaStream_t stream, const T* input, const int64_t* target,
                             double* rows, ClassLossStatus* status, int64_t n, int64_t c,
                             int64_t ignore_index) {
  if (cudaError_t e = InitStatus(stream, status); e != cudaSuccess || n == 0) return e;
  NllForwardKernel<T>
      <<<GridFor(n), kThreads, 0, stream>>>(input, target, rows, status, n, c, ignore_index);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchNllBackward(cudaStream_t stream, const T* grad, const int64_t* target,
                              T* grad_input, int64_t n, int64_t c, bool per_row, double divisor,
                              int64_t ignore_index) {
  if (n == 0 || c == 0) return cudaSuccess;
  NllBackwardKernel<T><<<GridFor(n), kThreads, 0, stream>>>(grad, target, grad_input, n, c, per_row,
                                                            divisor, ignore_index);
  return cudaGetLastError();
}

#define EMBER_INSTANTIATE(T)                                                                     \
  template cudaError_t LaunchCrossEntropyForward<T>(cudaStream_t, const T*, const int64_t*,      \
                                                    double*, double*, ClassLossStatus*, int64_t, \
                                                    int64_t, int64_t, double);                   \
  template cudaError_t LaunchCrossEntropyBackward<T>(cudaStream_t, const T*, const T*,           \
                                                     const int64_t*, const double*, T*, int64_t, \
                                                     int64_t, bool, double, int64_t, double);    \
  template cudaError_t LaunchNllForward<T>(cudaStream_t, const T*, const int64_t*, double*,      \
                                           ClassLossStatus*, int64_t, int64_t, int64_t);         \
  template cudaError_t LaunchNllBackward<T>(cudaStream_t, const T*, const int64_t*, T*, int64_t, \
                                            int64_t, bool, double, int64_t);
EMBER_INSTANTIATE(float)
EMBER_INSTANTIATE(double)
#undef EMBER_INSTANTIATE

}  // namespace ember::nn::cuda_kernels
