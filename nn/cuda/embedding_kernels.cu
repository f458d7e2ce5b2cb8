// Device side of embedding's backward (embedding_launch.h), deterministic as
// PyTorch's embedding_dense_backward on CUDA: the (index, lookup position)
// pairs are sorted by index with cub's stable radix sort (only the bits
// num_weights needs), so each index's lookups form a segment in lookup
// order; the segments are summed in windows of the sorted order, then the
// segments that cross windows are finished from the windows' partial sums
// (Note [Embedding backward windows] in embedding_segments.h). Every
// addition has a fixed place, so repeated indices accumulate to the same
// bits on every run, and no row waits on one thread for all its lookups.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/loops.cuh"
#include "nn/cuda/embedding_launch.h"
#include "nn/cuda/embedding_segments.h"

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
// key, the windows' head and tail sums, then cub's temporary storage.
struct Workspace {
  uint64_t* keys_out;
  int64_t* positions_in;
  int64_t* positions_out;
  void* head;
  void* tail;
  void* sort_storage;
  size_t sort_bytes;
};

int64_t Windows(int64_t n) { return (n + kWindow - 1) / kWindow; }

cudaError_t SortBytes(int64_t n, int64_t num_weights, size_t* bytes) {
  return cub::DeviceRadixSort::SortPairs(
      nullptr, *bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n, 0,
      KeyBits(num_weights));
}

Workspace Carve(void* base, int64_t n, int64_t d, size_t sort_bytes) {
  char* p = static_cast<char*>(base);
  const size_t array = AlignUp(static_cast<size_t>(n) * sizeof(int64_t));
  const size_t window_sums = AlignUp(static_cast<size_t>(Windows(n) * d) * sizeof(double));
  return {reinterpret_cast<uint64_t*>(p),
          reinterpret_cast<int64_t*>(p + array),
          reinterpret_cast<int64_t*>(p + 2 * array),
          p + 3 * array,
          p + 3 * array + window_sums,
          p + 3 * array + 2 * window_sums,
          sort_bytes};
}

__global__ void IotaKernel(int64_t* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = i;
  }
}

// A thread per (window, column), columns fastest: Note [Embedding backward
// windows].
template <typename T, bool kFinish>
__global__ void WindowKernel(SegmentArgs<T> args, int64_t windows) {
  const int64_t total = windows * args.d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t window = e / args.d, col = e - window * args.d;
    if constexpr (kFinish) {
      FinishSegment<T>(args, window, col);
    } else {
      SumWindow<T>(args, window, col);
    }
  }
}

}  // namespace

size_t EmbeddingBackwardWorkspaceBytes(int64_t n, int64_t d, int64_t num_weights) {
  if (n == 0 || d == 0) return 0;
  size_t sort_bytes = 0;
  if (SortBytes(n, num_weights, &sort_bytes) != cudaSuccess) return 0;
  return 3 * AlignUp(static_cast<size_t>(n) * sizeof(int64_t)) +
         2 * AlignUp(static_cast<size_t>(Windows(n) * d) * sizeof(double)) + sort_bytes;
}

template <typename T>
cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const T* grad, const int64_t* indices,
                                    T* grad_weight, int64_t n, int64_t d, int64_t num_weights,
                                    int64_t padding_idx, void* workspace) {
  if (n == 0 || d == 0) return cudaSuccess;
  size_t sort_bytes = 0;
  if (cudaError_t e = SortBytes(n, num_weights, &sort_bytes); e != cudaSuccess) return e;
  const Workspace w = Carve(workspace, n, d, sort_bytes);
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
  const SegmentArgs<T> args{grad,
                            w.keys_out,
                            w.positions_out,
                            grad_weight,
                            static_cast<T*>(w.head),
                            static_cast<T*>(w.tail),
                            n,
                            d,
                            padding_idx};
  const int64_t windows = Windows(n);
  WindowKernel<T, false><<<GridFor(windows * d), kThreads, 0, stream>>>(args, windows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  WindowKernel<T, true><<<GridFor(windows * d), kThreads, 0, stream>>>(args, windows);
  return cudaGetLastError();
}

template cudaError_t LaunchEmbeddingBackward<float>(cudaStream_t, const float*, const int64_t*,
                                                    float*, int64_t, int64_t, int64_t, int64_t,
                                                    void*);
template cudaError_t LaunchEmbeddingBackward<double>(cudaStream_t, const double*, const int64_t*,
                                                     double*, int64_t, int64_t, int64_t, int64_t,
                                                     void*);

}  // namespace ember::nn::cuda_kernels
