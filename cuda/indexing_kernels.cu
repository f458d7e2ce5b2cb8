// Device side of index_select_out: a check pass that finds the first index
// out of range (so the host can throw naming it, before anything is
// written), then a gather over the output's elements, moving raw elements of
// 1, 2, 4 or 8 bytes.
#include "cuda/loops.cuh"

namespace ember::cuda::kernels {
namespace {

__device__ __forceinline__ int64_t IndexAt(const char* index, int index_dtype, int64_t i,
                                           int64_t stride) {
  return index_dtype == kI64 ? reinterpret_cast<const int64_t*>(index)[i * stride]
                             : reinterpret_cast<const int32_t*>(index)[i * stride];
}

__global__ void IndexCheckKernel(const char* index, int index_dtype, int64_t n, int64_t stride,
                                 int64_t size, int64_t* first_bad) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = IndexAt(index, index_dtype, i, stride);
    if (v < 0 || v >= size) {
      atomicMin(reinterpret_cast<unsigned long long*>(first_bad),
                static_cast<unsigned long long>(i));
    }
  }
}

template <typename W>
struct GatherBody {
  char* out;
  const char* self;
  const char* index;
  int index_dtype;
  int64_t index_stride;
  int64_t self_dim_stride;
  __device__ void operator()(const int64_t (&off)[3]) {
    const int64_t row = IndexAt(index, index_dtype, off[2], index_stride);
    *reinterpret_cast<W*>(out + off[0]) =
        *reinterpret_cast<const W*>(self + off[1] + row * self_dim_stride);
  }
};

template <typename W>
__global__ void GatherKernel(Geometry<3> g, GatherBody<W> body) {
  ForEachElement<3>(g, body);
}

}  // namespace

cudaError_t LaunchIndexCheck(cudaStream_t stream, const char* index, int index_dtype, int64_t n,
                             int64_t index_stride, int64_t size, int64_t* first_bad) {
  cudaError_t e = cudaMemsetAsync(first_bad, 0x7f, sizeof(int64_t), stream);  // ~INT64_MAX
  if (e != cudaSuccess || n == 0) return e;
  IndexCheckKernel<<<GridFor(n), kThreads, 0, stream>>>(index, index_dtype, n, index_stride, size,
                                                        first_bad);
  return cudaGetLastError();
}

cudaError_t LaunchIndexSelect(cudaStream_t stream, const Geometry<3>& g, char* out,
                              const char* self, int64_t elem_size, const char* index,
                              int index_dtype, int64_t index_stride, int64_t self_dim_stride) {
  if (g.numel == 0) return cudaSuccess;
  auto launch = [&]<typename W>() {
    GatherKernel<W><<<GridFor(g.numel), kThreads, 0, stream>>>(
        g, GatherBody<W>{out, self, index, index_dtype, index_stride, self_dim_stride});
  };
  switch (elem_size) {
    case 8:
      launch.template operator()<uint64_t>();
      break;
    case 4:
      launch.template operator()<uint32_t>();
      break;
    case 2:
      launch.template operator()<uint16_t>();
      break;
    default:
      launch.template operator()<uint8_t>();
      break;
  }
  return cudaGetLastError();
}

}  // namespace ember::cuda::kernels
