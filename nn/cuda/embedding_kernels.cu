// Device side of embedding's backward (embedding_launch.h), deterministic as
// PyTorch's embedding_dense_backward on CUDA: the (index, lookup position)
// pairs are sorted by index with cub's stable radix sort (only the bits
// num_weights needs), so each index's lookups form a segment in lookup
// order; then one thread per (segment, column) adds its segment's gradient
// rows in that order and writes the row of the weight's gradient once. No
// atomics: repeated indices accumulate to the same bits on every run.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/loops.cuh"
#include "nn/cuda/embedding_launch.h"

namespace ember::nn::cuda_kernels {
namespace {

using ::ember::cuda::kernels::GridFor;
using ::ember::cuda::kernels::kThreads;

// Bits that hold every index in [0, num_weights).
int KeyBits(int64_t num_weights) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < num_weights) ++bits;
  return bits;
}

constexpr size_t kAlign = 256;
size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The workspace: sorted keys, positions in lookup order, positions sorted by
// key, then cub's temporary storage.
struct Workspace {
  uint64_t* keys_out;
  int64_t* positions_in;
  int64_t* positions_out;
  void* sort_storage;
  size_t sort_bytes;
};

cudaError_t SortBytes(int64_t n, int64_t num_weights, size_t* bytes) {
  return cub::DeviceRadixSort::SortPairs(
      nullptr, *bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n, 0,
      KeyBits(num_weights));
}

Workspace Carve(void* base, int64_t n, size_t sort_bytes) {
  char* p = static_cast<char*>(base);
  const size_t array = AlignUp(static_cast<size_t>(n) * sizeof(int64_t));
  return {reinterpret_cast<uint64_t*>(p), reinterpret_cast<int64_t*>(p + array),
          reinterpret_cast<int64_t*>(p + 2 * array), p + 3 * array, sort_bytes};
}

__global__ void IotaKernel(int64_t* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = i;
  }
}

template <typename T>
__global__ void SegmentSumKernel(const T* __restrict__ g, const uint64_t* __restrict__ keys,
                                 const int64_t* __restrict__ positions, T* __restrict__ gw,
                                 int64_t n, int64_t d, int64_t padding_idx) {
  const int64_t total = n * d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = e / d, j = e - s * d;
    const uint64_t key = keys[s];
    if (s > 0 && keys[s - 1] == key) continue;  // not the first of its segment
    if (static_cast<int64_t>(key) == padding_idx) continue;
    T sum = T(0);
    for (int64_t k = s; k < n && keys[k] == key; ++k) sum += g[positions[k] * d + j];
    gw[static_cast<int64_t>(key) * d + j] = sum;
  }
}

}  // namespace

size_t EmbeddingBackwardWorkspaceBytes(int64_t n, int64_t num_weights) {
  if (n == 0) return 0;
  size_t sort_bytes = 0;
  if (SortBytes(n, num_weights, &sort_bytes) != cudaSuccess) return 0;
  return 3 * AlignUp(static_cast<size_t>(n) * sizeof(int64_t)) + sort_bytes;
}

template <typename T>
cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const T* grad, const int64_t* indices,
                                    T* grad_weight, int64_t n, int64_t d, int64_t num_weights,
                                    int64_t padding_idx, void* workspace) {
  if (n == 0 || d == 0) return cudaSuccess;
  size_t sort_bytes = 0;
  if (cudaError_t e = SortBytes(n, num_weights, &sort_bytes); e != cudaSuccess) return e;
  const Workspace w = Carve(workspace, n, sort_bytes);
  IotaKernel<<<GridFor(n), kThreads, 0, stream>>>(w.positions_in, n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // Indices are in [0, num_weights) (checked by the layer): as unsigned keys
  // they sort the same.
  size_t bytes = w.sort_bytes;
  if (cudaError_t e = cub::DeviceRadixSort::SortPairs(
          w.sort_storage, bytes, reinterpret_cast<const uint64_t*>(indices), w.keys_out,
          static_cast<const int64_t*>(w.positions_in), w.positions_out, n, 0, KeyBits(num_weights),
          stream);
      e != cudaSuccess) {
    return e;
  }
  SegmentSumKernel<T><<<GridFor(n * d), kThreads, 0, stream>>>(grad, w.keys_out, w.positions_out,
                                                               grad_weight, n, d, padding_idx);
  return cudaGetLastError();
}

template cudaError_t LaunchEmbeddingBackward<float>(cudaStream_t, const float*, const int64_t*,
                                                    float*, int64_t, int64_t, int64_t, int64_t,
                                                    void*);
template cudaError_t LaunchEmbeddingBackward<double>(cudaStream_t, const double*, const int64_t*,
                                                     double*, int64_t, int64_t, int64_t, int64_t,
                                                     void*);

}  // namespace ember::nn::cuda_kernels
