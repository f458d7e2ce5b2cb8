// Device side of embedding's backward (embedding_launch.h): one thread per
// element of the output gradient, each adding its value to the looked-up
// row of the weight's gradient with atomicAdd (native for float and double
// from sm_60), so repeated indices accumulate correctly. As with PyTorch's
// index_add_ on CUDA, the order in which a row's additions land is not
// fixed, so sums over repeated indices may differ in the last bits from run
// to run.
#include "cuda/loops.cuh"
#include "nn/cuda/embedding_launch.h"

namespace ember::nn::cuda_kernels {
namespace {

template <typename T>
__global__ void EmbeddingBackwardKernel(const T* __restrict__ g, const int64_t* __restrict__ idx,
                                        T* __restrict__ gw, int64_t n, int64_t d,
                                        int64_t padding_idx) {
  const int64_t total = n * d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / d;
    const int64_t row = idx[i];
    if (row == padding_idx) continue;
    atomicAdd(gw + row * d + (e - i * d), g[e]);
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const T* grad, const int64_t* indices,
                                    T* grad_weight, int64_t n, int64_t d, int64_t padding_idx) {
  if (n == 0 || d == 0) return cudaSuccess;
  using ::ember::cuda::kernels::GridFor;
  using ::ember::cuda::kernels::kThreads;
  EmbeddingBackwardKernel<T><<<GridFor(n * d), kThreads, 0, stream>>>(grad, indices, grad_weight,
                                                                      n, d, padding_idx);
  return cudaGetLastError();
}

template cudaError_t LaunchEmbeddingBackward<float>(cudaStream_t, const float*, const int64_t*,
                                                    float*, int64_t, int64_t, int64_t);
template cudaError_t LaunchEmbeddingBackward<double>(cudaStream_t, const double*, const int64_t*,
                                                     double*, int64_t, int64_t, int64_t);

}  // namespace ember::nn::cuda_kernels
