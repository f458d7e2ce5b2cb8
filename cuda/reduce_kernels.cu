// Device side of reduce_out (sum, prod, mean, amax, amin) and arg_reduce_out
// (max/min along a dim with indices).
//
// Note [CUDA reduction strategy]
// A reduction is a set of outputs (the kept dims) each folding the same
// reduced index space. Three kernels cover it:
// - a full sum or mean of a contiguous float32/float64 tensor goes to
//   cub::DeviceReduce::Sum;
// - an "outer" reduction (the reduced dims are strided, the kept innermost
//   dim is contiguous in the input) runs one thread per output, so a warp
//   reads adjacent elements: when there are enough outputs to fill the
//   device, each thread folds all its output's reduced elements
//   (ThreadReduceKernel); when there are fewer, but a warp's worth of
//   adjacent ones (the kept innermost dim has at least 32), the reduced
//   elements are cut into consecutive ranges, each range of each output one
//   thread (ColumnReduceKernel, a grid of column tiles by ranges: the bias
//   gradient of a Linear, a [batch, features] sum over the batch), and a
//   second kernel folds each output's ranges' results in range order;
// - everything else runs one block per output; when there are too few
//   outputs to fill the device each output is split over several blocks,
//   whose partial results a second kernel folds in order.
// PlanReduce (reduce_plan.h) makes the choice, on the host.
// Accumulators: float for 16-bit floats and float32, double for float64,
// int64 for integers and bool (sums and products wrap around, as the CPU's
// uint64 ones do). A thread folding elements in sequence (the thread and
// column kernels) flushes its running value into a second accumulator every
// 64 elements and that into a third every 4096, so that long sums keep their
// precision. The partitioning depends only on the shapes and the device's SM
// count, and every fold has a fixed order (no atomics), so the same input
// gives the same bits every time.
// Max and min propagate NaN; arg reductions keep the first index of the best
// value and of the first NaN, combining (value, index) pairs with an
// associative rule so the block's grouping does not change the answer.
#include <cmath>
#include <cub/device/device_reduce.cuh>

#include "cuda/loops.cuh"
#include "cuda/reduce_plan.h"

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

// Folds each output's `splits` partial results in order: output o's s-th
// at partial[o * output_stride + s * split_stride].
template <typename T>
__global__ void FoldPartialsKernel(ReduceArgs a, int64_t splits, const Acc<T>* partial,
                                   int64_t output_stride, int64_t split_stride) {
  using A = Acc<T>;
  const Combiner<A> combine{a.op};
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < a.kept.numel;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Acc<T>* p = partial + o * output_stride;
    A v = p[0];
    for (int64_t s = 1; s < splits; ++s) v = combine(v, p[s * split_stride]);
    int64_t off[2];
    OffsetsOf<2>(a.kept, o, off);
    WriteOut<T>(a, off[0], v);
  }
}

// One thread's fold of elements in sequence (the thread and column kernels):
// the running value is flushed into a second accumulator every 64 elements
// and that into a third every 4096, so that long sums keep their precision.
// Add(j, v) takes the j-th element (j counting from 0 in the sequence).
template <typename A>
struct SequentialFold {
  Combiner<A> combine;
  A l1 = Identity<A>(combine.op), l2 = l1, l3 = l1;
  __device__ __forceinline__ void Add(int64_t j, A v) {
    l1 = combine(l1, v);
    if ((j & 63) == 63) {
      l2 = combine(l2, l1);
      l1 = Identity<A>(combine.op);
      if ((j & 4095) == 4095) {
        l3 = combine(l3, l2);
        l2 = Identity<A>(combine.op);
      }
    }
  }
  __device__ __forceinline__ A Result() const { return combine(l3, combine(l2, l1)); }
};

template <typename T>
__global__ void ThreadReduceKernel(ReduceArgs a) {
  using A = Acc<T>;
  const Combiner<A> combine{a.op};
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < a.kept.numel;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2];
    OffsetsOf<2>(a.kept, o, off);
    const char* base = a.self + off[1];
    SequentialFold<A> fold{combine};
    for (int64_t j = 0; j < a.reduced.numel; ++j) {
      fold.Add(j, LoadAcc<T>(base + ReducedOffset(a.reduced, j)));
    }
    WriteOut<T>(a, off[0], fold.Result());
  }
}

// One thread per (output, range of the reduced elements): blockIdx.y is the
// range, threads of a block adjacent outputs. Folds the range in order, as
// ThreadReduceKernel folds a whole output, loading kUnroll elements before
// combining them (in order) so that many loads are in flight. A single range
// is written out; several go to partial[range * kept.numel + output] for
// FoldPartialsKernel.
template <typename T>
__global__ void ColumnReduceKernel(ReduceArgs a, int64_t chunk, Acc<T>* partial) {
  using A = Acc<T>;
  constexpr int kUnroll = 64 / static_cast<int>(sizeof(A));  // 16 floats or 8 doubles/int64s
  const Combiner<A> combine{a.op};
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= a.kept.numel) return;
  int64_t off[2];
  OffsetsOf<2>(a.kept, o, off);
  const char* base = a.self + off[1];
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = begin + chunk < a.reduced.numel ? begin + chunk : a.reduced.numel;
  SequentialFold<A> fold{combine};  // indices within the range
  // Groups of kUnroll loads, the last one partial (its loads predicated, so
  // a range's tail is in flight at once too).
  const int64_t count = end - begin;
  for (int64_t j = 0; j < count; j += kUnroll) {
    A v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j + u < count) v[u] = LoadAcc<T>(base + ReducedOffset(a.reduced, begin + j + u));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j + u < count) fold.Add(j + u, v[u]);
    }
  }
  const A v = fold.Result();
  if (gridDim.y == 1) {
    WriteOut<T>(a, off[0], v);
  } else {
    partial[static_cast<int64_t>(blockIdx.y) * a.kept.numel + o] = v;
  }
}

template <typename T>
__global__ void DivideKernel(T* out, int64_t n) {
  *out = *out / static_cast<T>(n);
}

static_assert(kReduceBlockThreads == kThreads, "reduce_plan.h plans blocks of kThreads");

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
  const ReducePlan plan = PlanReduce(a);
  if (plan.path == ReducePath::kCub) {
    return a.dtype == kF32 ? CubBytes<float>(a) : CubBytes<double>(a);
  }
  if (plan.splits == 1) return 0;
  size_t acc = 8;  // int64 and double accumulators
  if (a.dtype == kF32 || a.dtype == kF16 || a.dtype == kBF16) acc = 4;
  return static_cast<size_t>(a.kept.numel * plan.splits) * acc;
}

cudaError_t LaunchReduce(cudaStream_t stream, const ReduceArgs& a, void* workspace) {
  if (a.kept.numel == 0 || a.reduced.numel == 0) return cudaSuccess;
  const ReducePlan plan = PlanReduce(a);
  if (plan.path == ReducePath::kCub) {
    return a.dtype == kF32 ? CubSum<float>(stream, a, workspace)
                           : CubSum<double>(stream, a, workspace);
  }
  VisitCode(a.dtype, [&]<typename T>() {
    auto* partial = static_cast<Acc<T>*>(workspace);
    const int64_t splits = plan.splits;
    if (plan.path == ReducePath::kThreadPerOutput) {
      ThreadReduceKernel<T><<<GridFor(a.kept.numel), kThreads, 0, stream>>>(a);
      return;
    }
    if (plan.path == ReducePath::kColumns) {
      // kept.numel < sm_count * kThreads and splits <= kColumnMaxSplits:
      // both grid dims are small.
      const int threads = ThreadsFor(a.kept.numel);
      const dim3 grid(static_cast<unsigned>((a.kept.numel + threads - 1) / threads),
                      static_cast<unsigned>(splits));
      ColumnReduceKernel<T><<<grid, threads, 0, stream>>>(a, plan.chunk, partial);
      if (splits > 1) {
        FoldPartialsKernel<T>
            <<<GridFor(a.kept.numel), kThreads, 0, stream>>>(a, splits, partial, 1, a.kept.numel);
      }
      return;
    }
    const int64_t items = a.kept.numel * splits;
    const unsigned blocks = static_cast<unsigned>(items < (1 << 30) ? items : (1 << 30));
    BlockReduceKernel<T><<<blocks, ThreadsFor(plan.chunk), 0, stream>>>(a, splits, partial);
    if (splits > 1) {
      FoldPartialsKernel<T>
          <<<GridFor(a.kept.numel), kThreads, 0, stream>>>(a, splits, partial, splits, 1);
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
