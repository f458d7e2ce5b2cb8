// Device side of layer_norm on CUDA (layer_norm_launch.h). The forward and
// the input's gradient take one block per row, each thread striding over the
// row (which stays in L1/L2 between passes) and the block combining its
// threads' sums in a fixed order (cuda/loops.cuh BlockCombine), so results
// do not depend on timing. The forward makes two passes for the statistics
// (the mean, then the squared deviations from it), as the CPU kernel does,
// rather than a one-pass formula that cancels badly.
#include "cuda/loops.cuh"
#include "nn/cuda/layer_norm_launch.h"

namespace ember::nn::cuda_kernels {
namespace {

using ::ember::cuda::kernels::BlockCombine;
using ::ember::cuda::kernels::kThreads;
using ::ember::cuda::kernels::ThreadsFor;

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Blocks for one block per row: every row its own block up to a cap, then
// grid-stride.
unsigned RowBlocks(int64_t rows) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

template <typename T>
__global__ void LayerNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                                       const T* __restrict__ b, T* __restrict__ y,
                                       T* __restrict__ mean, T* __restrict__ rstd, int64_t rows,
                                       int64_t d, double eps) {
  __shared__ double smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* p = x + r * d;
    T* q = y + r * d;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += static_cast<double>(p[j]);
    const double mu = BlockCombine<double>(sum, SumOp(), smem) / static_cast<double>(d);
    double sq = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double v = static_cast<double>(p[j]) - mu;
      sq += v * v;
    }
    const double var = BlockCombine<double>(sq, SumOp(), smem) / static_cast<double>(d);
    const double rs = 1.0 / sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean[r] = static_cast<T>(mu);
      rstd[r] = static_cast<T>(rs);
    }
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      double v = (static_cast<double>(p[j]) - mu) * rs;
      if (w != nullptr) v *= static_cast<double>(w[j]);
      if (b != nullptr) v += static_cast<double>(b[j]);
      q[j] = static_cast<T>(v);
    }
  }
}

// gx = rstd (dy - mean(dy) - x^ mean(dy x^)), dy = g w, per row.
template <typename T>
__global__ void LayerNormBackwardInputKernel(const T* __restrict__ g, const T* __restrict__ x,
                                             const T* __restrict__ w, const T* __restrict__ mean,
                                             const T* __restrict__ rstd, T* __restrict__ gx,
                                             int64_t rows, int64_t d) {
  __shared__ double smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* p = x + r * d;
    const T* pg = g + r * d;
    const double mu = static_cast<double>(mean[r]), rs = static_cast<double>(rstd[r]);
    double sum_dy = 0, sum_dyx = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double xhat = (static_cast<double>(p[j]) - mu) * rs;
      const double dy =
          static_cast<double>(pg[j]) * (w != nullptr ? static_cast<double>(w[j]) : 1.0);
      sum_dy += dy;
      sum_dyx += dy * xhat;
    }
    sum_dy = BlockCombine<double>(sum_dy, SumOp(), smem) / static_cast<double>(d);
    sum_dyx = BlockCombine<double>(sum_dyx, SumOp(), smem) / static_cast<double>(d);
    T* q = gx + r * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double xhat = (static_cast<double>(p[j]) - mu) * rs;
      const double dy =
          static_cast<double>(pg[j]) * (w != nullptr ? static_cast<double>(w[j]) : 1.0);
      q[j] = static_cast<T>(rs * (dy - sum_dy - xhat * sum_dyx));
    }
  }
}

// gw[j] = sum_r g[r, j] x^[r, j], gb[j] = sum_r g[r, j]: a block takes 32
// columns (consecutive threads, coalesced loads) of one chunk of the rows
// (blockIdx.y), its kRowLanes rows of threads stride over the chunk, and
// the lanes' partial sums are added in lane order. With one chunk the block
// writes gw/gb; with several (many rows, few columns: more blocks to fill
// the device) it writes its chunk's sums to partial_w/partial_b [chunks, d]
// (double) and LayerNormFinishParamsKernel adds the chunks in order. Either
// way the order of every addition is fixed: deterministic.
constexpr int kColumns = 32;
constexpr int kRowLanes = 16;

template <typename T>
__global__ void LayerNormBackwardParamsKernel(const T* __restrict__ g, const T* __restrict__ x,
                                              const T* __restrict__ mean,
                                              const T* __restrict__ rstd, T* __restrict__ gw,
                                              T* __restrict__ gb, double* __restrict__ partial_w,
                                              double* __restrict__ partial_b, int64_t rows,
                                              int64_t d, int64_t chunk_rows) {
  __shared__ double part_w[kRowLanes][kColumns + 1];
  __shared__ double part_b[kRowLanes][kColumns + 1];
  const int64_t chunk = blockIdx.y;
  const int64_t row_begin = chunk * chunk_rows;
  const int64_t row_end = row_begin + chunk_rows < rows ? row_begin + chunk_rows : rows;
  for (int64_t col0 = static_cast<int64_t>(blockIdx.x) * kColumns; col0 < d;
       col0 += static_cast<int64_t>(gridDim.x) * kColumns) {
    const int64_t col = col0 + threadIdx.x;
    double acc_w = 0, acc_b = 0;
    if (col < d) {
      for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
        const double gv = static_cast<double>(g[r * d + col]);
        const double xhat = (static_cast<double>(x[r * d + col]) - static_cast<double>(mean[r])) *
                            static_cast<double>(rstd[r]);
        acc_w += gv * xhat;
        acc_b += gv;
      }
    }
    part_w[threadIdx.y][threadIdx.x] = acc_w;
    part_b[threadIdx.y][threadIdx.x] = acc_b;
    __syncthreads();
    if (threadIdx.y == 0 && col < d) {
      double tw = 0, tb = 0;
      for (int k = 0; k < kRowLanes; ++k) {
        tw += part_w[k][threadIdx.x];
        tb += part_b[k][threadIdx.x];
      }
      if (partial_w != nullptr) {
        partial_w[chunk * d + col] = tw;
        partial_b[chunk * d + col] = tb;
      } else {
        if (gw != nullptr) gw[col] = static_cast<T>(tw);
        if (gb != nullptr) gb[col] = static_cast<T>(tb);
      }
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void LayerNormFinishParamsKernel(const double* __restrict__ partial_w,
                                            const double* __restrict__ partial_b,
                                            T* __restrict__ gw, T* __restrict__ gb, int64_t chunks,
                                            int64_t d) {
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < d;
       col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double tw = 0, tb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      tw += partial_w[c * d + col];
      tb += partial_b[c * d + col];
    }
    if (gw != nullptr) gw[col] = static_cast<T>(tw);
    if (gb != nullptr) gb[col] = static_cast<T>(tb);
  }
}

// Row chunks of the parameters' reduction: enough blocks for a few per SM of
// an H100, each chunk at least kMinChunkRows rows.
constexpr int64_t kMinChunkRows = 64;
int64_t ParamChunks(int64_t rows, int64_t d) {
  constexpr int64_t kTargetBlocks = 132 * 4;
  const int64_t tiles = (d + kColumns - 1) / kColumns;
  int64_t chunks = (rows + kMinChunkRows - 1) / kMinChunkRows;
  const int64_t fill = tiles < kTargetBlocks ? kTargetBlocks / tiles : 1;
  if (chunks > fill) chunks = fill;
  if (chunks > 65535) chunks = 65535;
  return chunks > 1 ? chunks : 1;
}

}  // namespace

template <typename T>
cudaError_t LaunchLayerNormForward(cudaStream_t stream, const T* input, const T* weight,
                                   const T* bias, T* out, T* mean, T* rstd, int64_t rows, int64_t d,
                                   double eps) {
  if (rows == 0 || d == 0) return cudaSuccess;
  LayerNormForwardKernel<T><<<RowBlocks(rows), ThreadsFor(d), 0, stream>>>(
      input, weight, bias, out, mean, rstd, rows, d, eps);
  return cudaGetLastError();
}

size_t LayerNormBackwardWorkspaceBytes(int64_t rows, int64_t d) {
  const int64_t chunks = ParamChunks(rows, d);
  return chunks > 1 ? static_cast<size_t>(2 * chunks * d) * sizeof(double) : 0;
}

template <typename T>
cudaError_t LaunchLayerNormBackward(cudaStream_t stream, const T* grad, const T* input,
                                    const T* weight, const T* mean, const T* rstd, T* grad_input,
                                    T* grad_weight, T* grad_bias, int64_t rows, int64_t d,
                                    void* workspace) {
  if (d == 0) return cudaSuccess;
  if (grad_input != nullptr && rows > 0) {
    LayerNormBackwardInputKernel<T><<<RowBlocks(rows), ThreadsFor(d), 0, stream>>>(
        grad, input, weight, mean, rstd, grad_input, rows, d);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (grad_weight == nullptr && grad_bias == nullptr) return cudaSuccess;
  // rows == 0 writes zeros: every column's sum is empty.
  const int64_t chunks = ParamChunks(rows, d);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  double* partial_w = chunks > 1 ? static_cast<double*>(workspace) : nullptr;
  double* partial_b = chunks > 1 ? partial_w + chunks * d : nullptr;
  const int64_t tiles = (d + kColumns - 1) / kColumns;
  const dim3 grid(static_cast<unsigned>(tiles < 65535 ? tiles : 65535),
                  static_cast<unsigned>(chunks));
  LayerNormBackwardParamsKernel<T><<<grid, dim3(kColumns, kRowLanes), 0, stream>>>(
      grad, input, mean, rstd, grad_weight, grad_bias, partial_w, partial_b, rows, d,
      chunk_rows > 0 ? chunk_rows : 1);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || chunks == 1) return e;
  LayerNormFinishParamsKernel<T><<<::ember::cuda::kernels::GridFor(d), kThreads, 0, stream>>>(
      partial_w, partial_b, grad_weight, grad_bias, chunks, d);
  return cudaGetLastError();
}

#define EMBER_INSTANTIATE(T)                                                                     \
  template cudaError_t LaunchLayerNormForward<T>(cudaStream_t, const T*, const T*, const T*, T*, \
                                                 T*, T*, int64_t, int64_t, double);              \
  template cudaError_t LaunchLayerNormBackward<T>(cudaStream_t, const T*, const T*, const T*,    \
                                                  const T*, const T*, T*, T*, T*, int64_t,       \
                                                  int64_t, void*);
EMBER_INSTANTIATE(float)
EMBER_INSTANTIATE(double)
#undef EMBER_INSTANTIATE

}  // namespace ember::nn::cuda_kernels
