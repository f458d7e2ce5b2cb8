// Device side of reduce_out (sum, prod, mean, amax, amin) and arg_reduce_out
// (max/min along a dim with indices).
//
// Note [CUDA reduction strategy]
// A reduction is a set of outputs (the kept dims) each folding the same
// reduced index space. Three kernels cover it:
// - a full sum or mean of a contiguous float32/float64 tensor goes to
//   cub::DeviceReduce::Sum;
// - an "outer" reduction (the reduced dims are strided, the kept innermost
//   dim is contiguous in the input, and there are enough outputs to fill the
//   device) runs one thread per output, so a warp reads adjacent elements;
// - everything else runs one block per output; when there are too few
//   outputs to fill the device each output is split over several blocks,
//   whose partial results a second kernel folds in order.
// Accumulators: float for 16-bit floats and float32, double for float64,
// int64 for integers and bool (sums and products wrap around, as the CPU's
// uint64 ones do). The partitioning depends only on the shapes and the
// device's SM count, so the same input gives the same bits every time.
// Max and min propagate NaN; arg reductions keep the first index of the best
// value and of the first NaN, combining (value, index) pairs with an
// associative rule so the block's grouping does not change the answer.
#include <cmath>
#include <cub/device/device_reduce.cuh>

#include "cuda/loops.cuh"

namespace ember::cuda::kernels {
namespace {

template <typename T>
using Acc = std::conditional_t<kIsFloat<T>, Math<T>, int64_t>;

template <typename A>
__device__ __forceinline__ bool IsNan(A a) {
  if constexpr (std::is_floating_point_v<A>) {
    return a != a;
  } else {
    return false;
  }
}

template <typename A>
__device__ __forceinline__ A Identity(int op) {
  switch (op) {
    case kProd:
      return A(1);
    case kAmax:
      if constexpr (std::is_floating_point_v<A>)
        return -INFINITY;
      else
        return INT64_MIN;
    case kAmin:
      if constexpr (std::is_floating_point_v<A>)
        return INFINITY;
      else
        return INT64_MAX;
    default:
      return A(0);
  }
}

template <typename A>
struct Combiner {
  int op;
  __device__ A operator()(A a, A b) const {
    switch (op) {
      case kProd:
        if constexpr (std::is_floating_point_v<A>)
          return a * b;
        else
          return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      case kAmax:
        return (b > a || IsNan(b)) ? b : a;
      case kAmin:
        return (b < a || IsNan(b)) ? b : a;
      default:
        if constexpr (std::is_floating_point_v<A>)
          return a + b;
        else
          return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    }
  }
};

template <typename T>
__device__ __forceinline__ Acc<T> LoadAcc(const char* p) {
  return static_cast<Acc<T>>(static_cast<Math<T>>(*reinterpret_cast<const T*>(p)));
}

// Byte offset of reduced element j.
__device__ __forceinline__ int64_t ReducedOffset(const Geometry<1>& g, int64_t j) {
  if (g.ndim <= 1) return j * g.strides[0][0];
  int64_t off[1];
  OffsetsOf<1>(g, j, off);
  return off[0];
}

template <typename T>
__device__ __forceinline__ void WriteOut(const ReduceArgs& a, int64_t out_off, Acc<T> v) {
  if (a.op == kMean) {
    if constexpr (kIsFloat<T>) v = v / static_cast<Acc<T>>(a.reduced.numel);
  }
  if (a.out_int64) {
    *reinterpret_cast<int64_t*>(a.out + out_off) = static_cast<int64_t>(v);
  } else {
    *reinterpret_cast<T*>(a.out + out_off) = Cast<T>(v);
  }
}

// Folds reduced elements [begin, end) of the output at input offset `in`:
// each thread a strided subset, then the block. Sums flush their running
// total every 64 additions so that long reductions keep their precision.
template <typename T>
__device__ Acc<T> BlockFold(const ReduceArgs& a, int64_t in, int64_t begin, int64_t end,
                            Acc<T>* smem) {
  using A = Acc<T>;
  const Combiner<A> combine{a.op};
  A l1 = Identity<A>(a.op), l2 = l1;
  int count = 0;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    l1 = combine(l1, LoadAcc<T>(a.self + in + ReducedOffset(a.reduced, j)));
    if (++count == 64) {
      l2 = combine(l2, l1);
      l1 = Identity<A>(a.op);
      count = 0;
    }
  }
  return BlockCombine<A>(combine(l2, l1), combine, smem);
}

template <typename T>
__global__ void BlockReduceKernel(ReduceArgs a, int64_t splits, Acc<T>* partial) {
  __shared__ Acc<T> smem[32];
  const int64_t n = a.reduced.numel;
  const int64_t chunk = (n + splits - 1) / splits;
  const int64_t items = a.kept.numel * splits;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t o = item / splits, s = item % splits;
    int64_t off[2];
    OffsetsOf<2>(a.kept, o, off);
    const int64_t begin = s * chunk, end = begin + chunk < n ? begin + chunk : n;
    const Acc<T> v = BlockFold<T>(a, off[1], begin, end, smem);
    if (threadIdx.x == 0) {
      if (splits == 1) {
        WriteOut<T>(a, off[0], v);
      } else {
        partial[item] = v;
      }
    }
  }
}

template <typename T>
__global__ void FoldPartialsKernel(ReduceArgs a, int64_t splits, const Acc<T>* partial) {
  using A = Acc<T>;
  const Combiner<A> combine{a.op};
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < a.kept.numel;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A v = partial[o * splits];
    for (int64_t s = 1; s < splits; ++s) v = combine(v, partial[o * splits + s]);
    int64_t off[2];
    OffsetsOf<2>(a.kept, o, off);
    WriteOut<T>(a, off[0], v);
  }
}

template <typename T>
__global__ void ThreadReduceKernel(ReduceArgs a) {
  using A = Acc<T>;
  const Combiner<A> combine{a.op};
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < a.kept.numel;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2];
    OffsetsOf<2>(a.kept, o, off);
    const char* base = a.self + off[1];
    A l1 = Identity<A>(a.op), l2 = l1, l3 = l1;
    for (int64_t j = 0; j < a.reduced.numel; ++j) {
      l1 = combine(l1, LoadAcc<T>(base + ReducedOffset(a.reduced, j)));
      if ((j & 63) == 63) {
        l2 = combine(l2, l1);
        l1 = Identity<A>(a.op);
        if ((j & 4095) == 4095) {
          l3 = combine(l3, l2);
          l2 = Identity<A>(a.op);
        }
      }
    }
    WriteOut<T>(a, off[0], combine(l3, combine(l2, l1)));
  }
}

template <typename T>
__global__ void DivideKernel(T* out, int64_t n) {
  *out = *out / static_cast<T>(n);
}

bool UsesCub(const ReduceArgs& a) {
  return a.kept.numel == 1 && (a.op == kSum || a.op == kMean) &&
         (a.dtype == kF32 || a.dtype == kF64) && a.reduced.contiguous;
}

bool UsesThreadPerOutput(const ReduceArgs& a) {
  const int64_t es = ElementSize(a.dtype);
  const bool reduced_contiguous = a.reduced.ndim >= 1 && a.reduced.strides[0][0] == es;
  const bool kept_contiguous = a.kept.ndim >= 1 && a.kept.strides[1][0] == es;
  return !reduced_contiguous && kept_contiguous &&
         a.kept.numel >= static_cast<int64_t>(a.sm_count) * kThreads;
}

// Blocks per output for the block kernel (Note [CUDA reduction strategy]).
int64_t SplitsFor(const ReduceArgs& a) {
  const int64_t target = static_cast<int64_t>(a.sm_count) * 4;
  if (a.kept.numel >= target) return 1;
  const int64_t by_blocks = (target + a.kept.numel - 1) / a.kept.numel;
  const int64_t by_work = a.reduced.numel / (kThreads * 16);  // >= 16 elements per thread
  const int64_t s = by_blocks < by_work ? by_blocks : by_work;
  return s > 1 ? s : 1;
}

template <typename T>
size_t CubBytes(const ReduceArgs& a) {
  size_t bytes = 0;
  cub::DeviceReduce::Sum(nullptr, bytes, reinterpret_cast<const T*>(a.self),
                         reinterpret_cast<T*>(a.out), a.reduced.numel, cudaStream_t{});
  return bytes;
}

template <typename T>
cudaError_t CubSum(cudaStream_t stream, const ReduceArgs& a, void* workspace) {
  size_t bytes = CubBytes<T>(a);
  cudaError_t e = cub::DeviceReduce::Sum(workspace, bytes, reinterpret_cast<const T*>(a.self),
                                         reinterpret_cast<T*>(a.out), a.reduced.numel, stream);
  if (e != cudaSuccess) return e;
  if (a.op == kMean)
    DivideKernel<T><<<1, 1, 0, stream>>>(reinterpret_cast<T*>(a.out), a.reduced.numel);
  return cudaGetLastError();
}

// ---- arg reductions ---------------------------------------------------------------------

template <typename A>
struct ArgBest {
  A v;
  int64_t i;
};

// Whether candidate (v, i) beats (bv, bi): the first NaN wins, then the
// better value, then on ties the lower index.
template <typename A>
__device__ __forceinline__ bool Beats(bool is_max, A v, int64_t i, A bv, int64_t bi) {
  const bool vn = IsNan(v), bn = IsNan(bv);
  if (vn || bn) return vn && (!bn || i < bi);
  if (v == bv) return i < bi;
  return is_max ? v > bv : v < bv;
}

template <typename T>
__global__ void ArgReduceKernel(bool is_max, Geometry<3> kept, char* values, char* indices,
                                const char* self, int64_t n, int64_t in_stride) {
  using A = Acc<T>;
  __shared__ A sv[32];
  __shared__ int64_t si[32];
  for (int64_t o = blockIdx.x; o < kept.numel; o += gridDim.x) {
    int64_t off[3];
    OffsetsOf<3>(kept, o, off);
    const char* base = self + off[2];
    A bv = LoadAcc<T>(base);
    int64_t bi = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = LoadAcc<T>(base + j * in_stride);
      if (Beats(is_max, v, j, bv, bi)) {
        bv = v;
        bi = j;
      }
    }
    // Block combine of (value, index) pairs.
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      const A v = __shfl_down_sync(0xffffffffu, bv, s);
      const int64_t i = __shfl_down_sync(0xffffffffu, bi, s);
      if (Beats(is_max, v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
      sv[warp] = bv;
      si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
        if (Beats(is_max, sv[w], si[w], bv, bi)) {
          bv = sv[w];
          bi = si[w];
        }
      }
      *reinterpret_cast<T*>(values + off[0]) = Cast<T>(bv);
      *reinterpret_cast<int64_t*>(indices + off[1]) = bi;
    }
  }
}

}  // namespace

size_t ReduceWorkspaceBytes(const ReduceArgs& a) {
  if (a.kept.numel == 0 || a.reduced.numel == 0) return 0;
  if (UsesCub(a)) return a.dtype == kF32 ? CubBytes<float>(a) : CubBytes<double>(a);
  if (UsesThreadPerOutput(a)) return 0;
  const int64_t splits = SplitsFor(a);
  if (splits == 1) return 0;
  size_t acc = 8;  // int64 and double accumulators
  if (a.dtype == kF32 || a.dtype == kF16 || a.dtype == kBF16) acc = 4;
  return static_cast<size_t>(a.kept.numel * splits) * acc;
}

cudaError_t LaunchReduce(cudaStream_t stream, const ReduceArgs& a, void* workspace) {
  if (a.kept.numel == 0 || a.reduced.numel == 0) return cudaSuccess;
  if (UsesCub(a)) {
    return a.dtype == kF32 ? CubSum<float>(stream, a, workspace)
                           : CubSum<double>(stream, a, workspace);
  }
  VisitCode(a.dtype, [&]<typename T>() {
    if (UsesThreadPerOutput(a)) {
      ThreadReduceKernel<T><<<GridFor(a.kept.numel), kThreads, 0, stream>>>(a);
      return;
    }
    const int64_t splits = SplitsFor(a);
    const int64_t items = a.kept.numel * splits;
    const unsigned blocks = static_cast<unsigned>(items < (1 << 30) ? items : (1 << 30));
    const int64_t chunk = (a.reduced.numel + splits - 1) / splits;
    auto* partial = static_cast<Acc<T>*>(workspace);
    BlockReduceKernel<T><<<blocks, ThreadsFor(chunk), 0, stream>>>(a, splits, partial);
    if (splits > 1) {
      FoldPartialsKernel<T><<<GridFor(a.kept.numel), kThreads, 0, stream>>>(a, splits, partial);
    }
  });
  return cudaGetLastError();
}

cudaError_t LaunchArgReduce(cudaStream_t stream, bool is_max, const Geometry<3>& kept, char* values,
                            char* indices, const char* self, int dtype, int64_t n,
                            int64_t in_stride) {
  if (kept.numel == 0 || n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(kept.numel < (1 << 30) ? kept.numel : (1 << 30));
  VisitCode(dtype, [&]<typename T>() {
    ArgReduceKernel<T>
        <<<blocks, ThreadsFor(n), 0, stream>>>(is_max, kept, values, indices, self, n, in_stride);
  });
  return cudaGetLastError();
}

}  // namespace ember::cuda::kernels
