// Device side of softmax_out (softmax and log_softmax along one dim), for the
// floating dtypes, computed in float (double for float64): one block per row
// makes three passes over it (the max, the sum of exp(x - max), the output),
// the row staying in L1/L2 between passes. log_softmax writes
// (x - max) - log(sum), as the CPU kernel does, so that log(sum) is not lost
// against a large max. NaN in a row makes the row NaN.
#include <cmath>

#include "cuda/loops.cuh"

namespace ember::cuda::kernels {
namespace {

template <typename A>
struct MaxOp {
  __device__ A operator()(A a, A b) const { return (b > a || b != b) ? b : a; }
};
template <typename A>
struct SumOp {
  __device__ A operator()(A a, A b) const { return a + b; }
};

template <typename T>
__global__ void SoftmaxKernel(Geometry<2> rows, char* out, const char* self, int64_t n,
                              int64_t out_stride, int64_t in_stride, bool log) {
  using A = Math<T>;
  __shared__ A smem[32];
  for (int64_t r = blockIdx.x; r < rows.numel; r += gridDim.x) {
    int64_t off[2];
    OffsetsOf<2>(rows, r, off);
    const char* x = self + off[1];
    char* y = out + off[0];
    auto load = [&](int64_t j) {
      return static_cast<A>(*reinterpret_cast<const T*>(x + j * in_stride));
    };
    A max = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) max = MaxOp<A>()(max, load(j));
    max = BlockCombine<A>(max, MaxOp<A>(), smem);
    A sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += exp(load(j) - max);
    sum = BlockCombine<A>(sum, SumOp<A>(), smem);
    if (log) {
      const A log_sum = ::log(sum);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        *reinterpret_cast<T*>(y + j * out_stride) = Cast<T>((load(j) - max) - log_sum);
      }
    } else {
      const A inv = A(1) / sum;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        *reinterpret_cast<T*>(y + j * out_stride) = Cast<T>(exp(load(j) - max) * inv);
      }
    }
  }
}

}  // namespace

cudaError_t LaunchSoftmax(cudaStream_t stream, const Geometry<2>& rows, char* out, const char* self,
                          int dtype, int64_t n, int64_t out_stride, int64_t in_stride, bool log) {
  if (rows.numel == 0 || n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(rows.numel < (1 << 30) ? rows.numel : (1 << 30));
  auto launch = [&]<typename T>() {
    SoftmaxKernel<T>
        <<<blocks, ThreadsFor(n), 0, stream>>>(rows, out, self, n, out_stride, in_stride, log);
  };
  switch (dtype) {
    case kF32:
      launch.template operator()<float>();
      break;
    case kF64:
      launch.template operator()<double>();
      break;
    case kF16:
      launch.template operator()<__half>();
      break;
    case kBF16:
      launch.template operator()<__nv_bfloat16>();
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace ember::cuda::kernels
