// The CUDA kernels' strided iteration scheme, and the interface between the
// kernels (the .cu files, compiled by nvcc without Ember's tensor headers) and
// their host side (the .cc files, which register them with the dispatcher).
//
// Note [CUDA loops]
// An operand is a base pointer plus byte strides over a shared iteration
// shape. The host side coalesces the shape as tensor/cpu/loops.h does (size-1
// dims dropped, dims that are contiguous for every operand merged) into a
// Geometry<N>: at most kMaxDims dims (25, torch's MAX_DIMS), innermost
// first, passed to the kernel by value so that no launch needs a device-side
// buffer. The largest, Geometry<4> (where), is about 1 KiB, well inside the
// 4 KiB of kernel parameters every architecture and CUDA version accepts
// (static_asserts below). A kernel is a
// grid-stride loop over linear indices. When every operand is dense in
// iteration order (Geometry::contiguous) the offset of element i is
// i * element size; otherwise OffsetsOf turns i into each operand's byte
// offset, looping over dims with compile-time indices (unrolled) so that the
// geometry stays in registers and parameter space, never in local memory.
// Broadcast inputs have stride 0 and need nothing else.
//
// Dtypes are dispatched at run time inside one kernel template per op family
// and element type (the op is a switch inside the kernel, uniform across a
// warp), which keeps nvcc's work and the binary small. Dtype codes are
// ember::Dtype's values; op codes are ember::UnaryOp's, BinaryOp's and
// ReduceOp's, made from the lists in tensor/op_kinds.h.
//
// Every launcher runs on `stream` on the current device and returns the
// launch's cudaError_t; the host side turns errors into ember::Error.
#ifndef EMBER_CUDA_LOOPS_CUH_
#define EMBER_CUDA_LOOPS_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tensor/op_kinds.h"

// OffsetsOf runs on the device in the kernels and on the host in tests.
#ifdef __CUDACC__
#define EMBER_CUDA_HOST_DEVICE __host__ __device__ __forceinline__
#define EMBER_CUDA_UNROLL _Pragma("unroll")
#else
#define EMBER_CUDA_HOST_DEVICE inline
#define EMBER_CUDA_UNROLL
#endif

namespace ember::cuda::kernels {

inline constexpr int kMaxDims = 25;

// ember::Dtype's values.
enum DtypeCode : int { kF32, kF64, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
inline constexpr int kNumDtypeCodes = 10;

// Bytes per element of a dtype code.
inline int64_t ElementSize(int dtype) {
  switch (dtype) {
    case kF64:
    case kI64:
      return 8;
    case kF32:
    case kI32:
      return 4;
    case kF16:
    case kBF16:
    case kI16:
      return 2;
    default:
      return 1;
  }
}

// ember::UnaryOp's, BinaryOp's and ReduceOp's values, from the same lists.
#define EMBER_OP_KIND(name) name,
enum UnaryCode : int { EMBER_UNARY_OPS(EMBER_OP_KIND) };
enum BinaryCode : int { EMBER_BINARY_OPS(EMBER_OP_KIND) };
enum ReduceCode : int { EMBER_REDUCE_OPS(EMBER_OP_KIND) };
#undef EMBER_OP_KIND

// The coalesced iteration space of N operands (operand 0 is the output).
template <int N>
struct Geometry {
  int ndim = 0;             // 0: a single element
  bool contiguous = false;  // every operand dense, in iteration order
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};       // innermost first
  int64_t strides[N][kMaxDims] = {};  // bytes
};

// Builds the geometry of N operands of shape `sizes` (outermost first, as a
// tensor stores them) with element strides `strides[k]` and element sizes
// `elem_sizes[k]`. Returns false when more than kMaxDims dims remain after
// coalescing.
template <int N>
bool MakeGeometry(int ndim, const int64_t* sizes, const int64_t* const (&strides)[N],
                  const int64_t (&elem_sizes)[N], Geometry<N>& g) {
  g = Geometry<N>();
  g.numel = 1;
  // Walk from the innermost dim outwards; merge a dim into the one inside it
  // when every operand steps over exactly that inner dim.
  for (int d = ndim - 1; d >= 0; --d) {
    g.numel *= sizes[d];
    if (sizes[d] == 1) continue;
    int64_t s[N];
    for (int k = 0; k < N; ++k) s[k] = strides[k][d] * elem_sizes[k];
    if (g.ndim > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k) {
        merge &= s[k] == g.strides[k][g.ndim - 1] * g.sizes[g.ndim - 1];
      }
      if (merge) {
        g.sizes[g.ndim - 1] *= sizes[d];
        continue;
      }
    }
    if (g.ndim == kMaxDims) return false;
    g.sizes[g.ndim] = sizes[d];
    for (int k = 0; k < N; ++k) g.strides[k][g.ndim] = s[k];
    ++g.ndim;
  }
  g.contiguous = g.ndim == 0;
  if (g.ndim == 1) {
    g.contiguous = true;
    for (int k = 0; k < N; ++k) g.contiguous &= g.strides[k][0] == elem_sizes[k];
  }
  return true;
}

// Byte offsets of linear element `i` (0 <= i < g.numel, iteration order,
// innermost dim fastest) in each operand (Note [CUDA loops]).
template <int N>
EMBER_CUDA_HOST_DEVICE void OffsetsOf(const Geometry<N>& g, int64_t i, int64_t (&off)[N]) {
  EMBER_CUDA_UNROLL
  for (int k = 0; k < N; ++k) off[k] = 0;
  EMBER_CUDA_UNROLL
  for (int d = 0; d < kMaxDims; ++d) {
    if (d == g.ndim) break;
    const int64_t size = g.sizes[d];
    const int64_t q = i / size;
    const int64_t r = i - q * size;
    i = q;
    EMBER_CUDA_UNROLL
    for (int k = 0; k < N; ++k) off[k] += r * g.strides[k][d];
  }
}

// A scalar's bits in the element type it is used as (value.to<T>() on the
// host side, copied bytewise).
struct ScalarBits {
  uint64_t bits = 0;
};

// ---- Launchers (one family per .cu file) --------------------------------------------

// copy_kernels.cu: out = src converted between any two dtypes; `g` has
// operands (out, src).
cudaError_t LaunchCopy(cudaStream_t stream, const Geometry<2>& g, char* out, int out_dtype,
                       const char* src, int src_dtype);
// out = value (the bits of a value of out_dtype).
cudaError_t LaunchFill(cudaStream_t stream, const Geometry<1>& g, char* out, int out_dtype,
                       ScalarBits value);

// elementwise_kernels.cu. `dtype` is the inputs' dtype; the output is of the
// same dtype, or bool for logical_not and bool-returning binary ops.
cudaError_t LaunchUnary(cudaStream_t stream, int op, const Geometry<2>& g, char* out,
                        const char* in, int dtype);
// has_alpha: out = a + alpha * b (op kAdd) or a - alpha * b (op kSub);
// alpha as a double for floating dtypes and an int64 for the others.
cudaError_t LaunchBinary(cudaStream_t stream, int op, const Geometry<3>& g, char* out,
                         const char* a, const char* b, int dtype, bool has_alpha,
                         double alpha_float, int64_t alpha_int);
// g: (out, condition, a, b).
cudaError_t LaunchWhere(cudaStream_t stream, const Geometry<4>& g, char* out, const char* cond,
                        const char* a, const char* b, int dtype);
// Bounds as doubles for floating dtypes and int64 for the others.
cudaError_t LaunchClamp(cudaStream_t stream, const Geometry<2>& g, char* out, const char* in,
                        int dtype, bool has_min, bool has_max, double min_float, double max_float,
                        int64_t min_int, int64_t max_int);

// reduce_kernels.cu. `kept` has operands (out, self) over the output's
// shape; `reduced` has the operand self over the reduced dims. out_int64:
// the output is int64 (integer sums and products), else the input's dtype.
struct ReduceArgs {
  int op = 0;
  int dtype = 0;
  bool out_int64 = false;
  Geometry<2> kept;
  Geometry<1> reduced;
  char* out = nullptr;
  const char* self = nullptr;
  int sm_count = 1;
};
// Kernel parameters: 4 KiB on every architecture (more only from CUDA 12.1
// on Volta and later). The kernels take at most one of these plus a few
// pointers and scalars.
static_assert(sizeof(Geometry<4>) + 256 <= 4096, "Geometry<4> too large for kernel parameters");
static_assert(sizeof(ReduceArgs) + 256 <= 4096, "ReduceArgs too large for kernel parameters");

// Bytes of device workspace LaunchReduce needs (0 for none).
size_t ReduceWorkspaceBytes(const ReduceArgs& args);
cudaError_t LaunchReduce(cudaStream_t stream, const ReduceArgs& args, void* workspace);

// values/indices along one dim of size n with input stride `in_stride`
// (bytes); `kept` has operands (values, indices, self). is_max: argmax.
cudaError_t LaunchArgReduce(cudaStream_t stream, bool is_max, const Geometry<3>& kept, char* values,
                            char* indices, const char* self, int dtype, int64_t n,
                            int64_t in_stride);

// softmax_kernels.cu: rows of length n; `rows` has operands (out, self) over
// the other dims; strides in bytes along the softmax dim.
cudaError_t LaunchSoftmax(cudaStream_t stream, const Geometry<2>& rows, char* out, const char* self,
                          int dtype, int64_t n, int64_t out_stride, int64_t in_stride, bool log);

// indexing_kernels.cu. Finds the first position of `index` (n entries of
// dtype kI64 or kI32, element stride `index_stride`) whose value is outside
// [0, size), writing it to *first_bad (device memory; a value >= n when none).
cudaError_t LaunchIndexCheck(cudaStream_t stream, const char* index, int index_dtype, int64_t n,
                             int64_t index_stride, int64_t size, int64_t* first_bad);
// out = self gathered along a dim: `g` has operands (out, self with stride 0
// along the dim, the position along the dim with stride 1 there and 0
// elsewhere, in an element size of 1); self_dim_stride is in bytes.
cudaError_t LaunchIndexSelect(cudaStream_t stream, const Geometry<3>& g, char* out,
                              const char* self, int64_t elem_size, const char* index,
                              int index_dtype, int64_t index_stride, int64_t self_dim_stride);

}  // namespace ember::cuda::kernels

// ---- Device side -------------------------------------------------------------------------
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace ember::cuda::kernels {

inline constexpr int kThreads = 256;

// The arithmetic type of an element type: float for the 16-bit floats.
template <typename T>
struct MathOf {
  using type = T;
};
template <>
struct MathOf<__half> {
  using type = float;
};
template <>
struct MathOf<__nv_bfloat16> {
  using type = float;
};
template <typename T>
using Math = typename MathOf<T>::type;

template <typename T>
inline constexpr bool kIsFloat = std::is_floating_point_v<Math<T>>;

// One element converted as ember::CastTo does: to bool is "!= 0", the 16-bit
// floats go through float.
template <typename D, typename S>
__device__ __forceinline__ D Cast(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    return static_cast<Math<S>>(s) != Math<S>(0);
  } else if constexpr (std::is_same_v<D, __half> || std::is_same_v<D, __nv_bfloat16>) {
    return D(static_cast<float>(static_cast<Math<S>>(s)));
  } else {
    return static_cast<D>(static_cast<Math<S>>(s));
  }
}

// Calls f(i, off) for every element of `g`, grid-stride; off[k] is operand k's
// byte offset (i * elem_sizes[k] on the contiguous path).
template <int N, typename F>
__device__ __forceinline__ void ForEachElement(const Geometry<N>& g, const int64_t (&elem_sizes)[N],
                                               F& f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t off[N];
  if (g.contiguous) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < g.numel;
         i += step) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = i * elem_sizes[k];
      f(off);
    }
    return;
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < g.numel;
       i += step) {
    OffsetsOf<N>(g, i, off);
    f(off);
  }
}

// Blocks for a grid-stride loop over n elements: enough to fill the device
// several times over, never more than the elements need.
inline unsigned GridFor(int64_t n, int64_t threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 132 * 32;  // 32 blocks per SM of an H100.
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

// Combines one value per thread of the block (blockDim.x a multiple of 32,
// every thread calling) with `combine` and returns the result to every
// thread. Warps combine by shuffles, then thread 0 folds the warps' results in
// order, so the grouping depends only on blockDim.x: deterministic. V is a
// type __shfl_down_sync moves (32- or 64-bit); `smem` holds 32 values.
template <typename V, typename C>
__device__ V BlockCombine(V v, C combine, V* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // smem may still be read from a previous call.
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    V r = smem[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = combine(r, smem[w]);
    smem[0] = r;
  }
  __syncthreads();
  return smem[0];
}

// Threads for a block that reduces n elements: a multiple of 32 up to kThreads.
inline int ThreadsFor(int64_t n) {
  int t = 32;
  while (t < kThreads && t < n) t *= 2;
  return t;
}

// Calls f.template operator()<T>() with T the device type of dtype code `d`.
template <typename F>
void VisitCode(int d, F&& f) {
  switch (d) {
    case kF32:
      return f.template operator()<float>();
    case kF64:
      return f.template operator()<double>();
    case kF16:
      return f.template operator()<__half>();
    case kBF16:
      return f.template operator()<__nv_bfloat16>();
    case kI64:
      return f.template operator()<int64_t>();
    case kI32:
      return f.template operator()<int32_t>();
    case kI16:
      return f.template operator()<int16_t>();
    case kI8:
      return f.template operator()<int8_t>();
    case kU8:
      return f.template operator()<uint8_t>();
    default:
      return f.template operator()<bool>();
  }
}

}  // namespace ember::cuda::kernels
#endif  // __CUDACC__

#endif  // EMBER_CUDA_LOOPS_CUH_
