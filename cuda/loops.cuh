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
// (static_asserts below). A kernel is a grid-stride loop (GridFor's grid)
// over linear indices, in one of these ways:
//  - Index width: when numel and every operand's byte extent are below 2^31
//    and no stride is negative (Geometry::index32, FitsIndex32), indices and
//    offsets are uint32_t (a 32-bit division costs a fraction of a 64-bit
//    one, which is a subroutine); otherwise int64_t.
//  - Scalar path (ForEachElement, one element per iteration): with at most
//    one dim the offset of element i in operand k is i * strides[k][0] (a
//    dense operand, a broadcast scalar with stride 0 or any other stride; no
//    division); with more, OffsetsOf turns i into each operand's byte
//    offset, looping over dims with compile-time indices (unrolled) so that
//    the geometry stays in registers and parameter space, never in local
//    memory. Broadcast inputs have stride 0 and need nothing else.
//  - Vector path (ForEachValue, for ops given as a function of the operands'
//    values, when UsesVectorPath; 32-bit indexing only, which keeps the
//    kernels' code and compile time down): each iteration handles a chunk of
//    V = 16 / (widest element size) consecutive elements of the innermost
//    dim, which the output and every input either step through densely
//    (loaded and stored as one aligned vector of V elements, 16 bytes for the
//    widest) or hold fixed (stride 0 there: one value for the chunk). Chunks
//    never straddle a row (one dim, or sizes[0] a multiple of V), so a chunk's
//    offsets come from one OffsetsOf (or a multiplication with one dim); the
//    leftover elements of a one-dim geometry take the scalar path. Every
//    input of a chunk is loaded before any output is stored, so an output
//    that is one of the inputs (in-place ops) reads its old values, as on
//    the scalar path. Each element still gets the same function of the same
//    values: results are bit-identical to the scalar path's.
// More bytes in flight per thread (16 per operand instead of 1 to 8) is what
// lets an elementwise kernel approach the memory bandwidth.
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
  bool index32 = false;     // uint32_t indices and offsets suffice (FitsIndex32)
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};       // innermost first
  int64_t strides[N][kMaxDims] = {};  // bytes
};

// Whether the kernels may index `g` in 32 bits (Note [CUDA loops]): numel
// below 2^31, and for every operand no negative stride and every element's
// bytes below 2^31 (its last element's offset plus its element size). Then an
// index plus a grid's stride (at most 2^31) fits in uint32_t, and so does
// every byte offset, as a sum of non-negative terms each at most the total.
template <int N>
bool FitsIndex32(const Geometry<N>& g, const int64_t (&elem_sizes)[N]) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (g.numel < 0 || g.numel >= kLimit) return false;
  for (int k = 0; k < N; ++k) {
    int64_t end = elem_sizes[k];
    for (int d = 0; d < g.ndim; ++d) {
      const int64_t stride = g.strides[k][d];
      if (stride < 0 || stride >= kLimit) return false;
      end += (g.sizes[d] - 1) * stride;  // < 2^31 * 2^31: no overflow.
      if (end > kLimit) return false;
    }
  }
  return true;
}

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
  g.index32 = FitsIndex32<N>(g, elem_sizes);
  return true;
}

// Byte offsets of linear element `i` (0 <= i < g.numel, iteration order,
// innermost dim fastest) in each operand (Note [CUDA loops]), computed in the
// index type I: int64_t always works, uint32_t when g.index32.
template <typename I, int N>
EMBER_CUDA_HOST_DEVICE void OffsetsIn(const Geometry<N>& g, I i, I (&off)[N]) {
  EMBER_CUDA_UNROLL
  for (int k = 0; k < N; ++k) off[k] = 0;
  EMBER_CUDA_UNROLL
  for (int d = 0; d < kMaxDims; ++d) {
    if (d == g.ndim) break;
    const I size = static_cast<I>(g.sizes[d]);
    const I q = i / size;
    const I r = i - q * size;
    i = q;
    EMBER_CUDA_UNROLL
    for (int k = 0; k < N; ++k) off[k] += r * static_cast<I>(g.strides[k][d]);
  }
}

template <int N>
EMBER_CUDA_HOST_DEVICE void OffsetsOf(const Geometry<N>& g, int64_t i, int64_t (&off)[N]) {
  OffsetsIn<int64_t, N>(g, i, off);
}

// OffsetsOf in 32 bits; only for a geometry with index32.
template <int N>
EMBER_CUDA_HOST_DEVICE void OffsetsOf32(const Geometry<N>& g, uint32_t i, uint32_t (&off)[N]) {
  OffsetsIn<uint32_t, N>(g, i, off);
}

// The byte offsets of element i as the loops compute them (Note [CUDA
// loops]): with at most one dim a multiplication, else OffsetsIn.
template <typename I, int N>
EMBER_CUDA_HOST_DEVICE void ElementOffsets(const Geometry<N>& g, I i, I (&off)[N]) {
  if (g.ndim <= 1) {
    EMBER_CUDA_UNROLL
    for (int k = 0; k < N; ++k) off[k] = i * static_cast<I>(g.strides[k][0]);  // 0 if ndim 0
  } else {
    OffsetsIn<I, N>(g, i, off);
  }
}

// Whether ForEachValue takes the vector path (Note [CUDA loops]) for
// operands at `ptrs` with element sizes `elem_sizes` (operand 0 the
// output), in chunks of `vec` elements: 32-bit indexing; at least one dim; the innermost one
// dense in the output and dense or of stride 0 in every input; a multiple of
// `vec` long unless it is the only one; and for each dense operand, its
// pointer and its strides over the outer dims multiples of its chunk's bytes
// (vec * element size), so that every chunk is aligned.
template <int N>
EMBER_CUDA_HOST_DEVICE bool UsesVectorPath(const Geometry<N>& g, const void* const (&ptrs)[N],
                                           const int64_t (&elem_sizes)[N], int64_t vec) {
  if (!g.index32 || g.ndim < 1 || (g.ndim > 1 && g.sizes[0] % vec != 0)) return false;
  for (int k = 0; k < N; ++k) {
    const int64_t inner = g.strides[k][0];
    if (inner == 0 && k > 0) continue;
    if (inner != elem_sizes[k]) return false;
    const int64_t chunk = vec * elem_sizes[k];
    if (reinterpret_cast<uintptr_t>(ptrs[k]) % static_cast<uintptr_t>(chunk) != 0) return false;
    for (int d = 1; d < g.ndim; ++d) {
      if (g.strides[k][d] % chunk != 0) return false;
    }
  }
  return true;
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
#include <utility>

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

template <typename I, int N, typename F>
__device__ __forceinline__ void ForEachElementIn(const Geometry<N>& g, F& f) {
  const I n = static_cast<I>(g.numel);
  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + threadIdx.x; i < n;
       i += step) {
    I o[N];
    ElementOffsets<I, N>(g, i, o);
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = static_cast<int64_t>(o[k]);
    f(off);
  }
}

// Calls f(off) for every element of `g`, grid-stride; off[k] is operand k's
// byte offset (the scalar path of Note [CUDA loops]).
template <int N, typename F>
__device__ __forceinline__ void ForEachElement(const Geometry<N>& g, F& f) {
  if (g.index32) {
    ForEachElementIn<uint32_t, N>(g, f);
  } else {
    ForEachElementIn<int64_t, N>(g, f);
  }
}

// V elements of type T, aligned to their size, so that nvcc loads and stores
// them as one vector (V * sizeof(T) is 1 to 16 bytes).
template <typename T, int V>
struct alignas(sizeof(T) * V) Chunk {
  T v[V];
};

// The elements per chunk of ForEachValue's vector path: 16 bytes of the
// widest operand.
template <typename... Ts>
__host__ __device__ constexpr int VecOf() {
  size_t widest = 1;
  ((widest = sizeof(Ts) > widest ? sizeof(Ts) : widest), ...);
  return static_cast<int>(16 / widest);
}

// A chunk of V elements at p, or V copies of the element at p (`fixed`: the
// operand's innermost stride is 0).
template <typename T, int V>
__device__ __forceinline__ Chunk<T, V> LoadChunk(const char* p, bool fixed) {
  if (fixed) {
    const T x = *reinterpret_cast<const T*>(p);
    Chunk<T, V> c;
#pragma unroll
    for (int j = 0; j < V; ++j) c.v[j] = x;
    return c;
  }
  return *reinterpret_cast<const Chunk<T, V>*>(p);
}

template <typename Out, int V, typename F, typename... In>
__device__ __forceinline__ Chunk<Out, V> ApplyChunk(const F& f, const Chunk<In, V>&... x) {
  Chunk<Out, V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = f(x.v[j]...);
  return r;
}

// out[off[0]] = f(in[off[k]]...), one element.
template <typename Out, typename... In, typename F, typename I, size_t... K>
__device__ __forceinline__ void StoreValue(const F& f, std::index_sequence<K...>,
                                           const char* const (&p)[1 + sizeof...(In)],
                                           const I (&off)[1 + sizeof...(In)]) {
  *reinterpret_cast<Out*>(const_cast<char*>(p[0]) + off[0]) =
      f(*reinterpret_cast<const In*>(p[K + 1] + off[K + 1])...);
}

// ForEachValue's scalar path: the body ForEachElement calls.
template <typename F, typename Out, typename... In>
struct ValueBody {
  const F& f;
  const char* p[1 + sizeof...(In)];  // out, then in...
  __device__ __forceinline__ void operator()(const int64_t (&off)[1 + sizeof...(In)]) const {
    StoreValue<Out, In...>(f, std::index_sequence_for<In...>(), p, off);
  }
};

// ForEachValue's vector path (Note [CUDA loops]), in index type I (uint32_t:
// one instantiation keeps nvcc's time down; larger geometries take the scalar
// path).
template <typename I, int V, typename F, typename Out, typename... In, size_t... K>
__device__ __forceinline__ void ForEachChunkIn(const Geometry<1 + sizeof...(In)>& g, const F& f,
                                               std::index_sequence<K...>, Out* out,
                                               const In*... in) {
  constexpr int N = 1 + sizeof...(In);
  const I n = static_cast<I>(g.numel);
  const I chunks = n / V;
  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  const I first = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + threadIdx.x;
  for (I c = first; c < chunks; c += step) {
    I off[N];
    ElementOffsets<I, N>(g, c * V, off);
    // Every load before the store (Note [CUDA loops]: in-place ops).
    const Chunk<Out, V> r = ApplyChunk<Out, V>(
        f, LoadChunk<In, V>(reinterpret_cast<const char*>(in) + off[K + 1],
                            g.strides[K + 1][0] == 0)...);
    *reinterpret_cast<Chunk<Out, V>*>(reinterpret_cast<char*>(out) + off[0]) = r;
  }
  // The last numel % V elements (none unless one dim), one each.
  const char* const p[N] = {reinterpret_cast<const char*>(out),
                            reinterpret_cast<const char*>(in)...};
  for (I i = chunks * V + first; i < n; i += step) {
    I off[N];
    ElementOffsets<I, N>(g, i, off);
    StoreValue<Out, In...>(f, std::index_sequence<K...>(), p, off);
  }
}

// out = f(in...) elementwise over `g` (operands: out, then in...): the
// vector path when UsesVectorPath, else the scalar path (Note [CUDA loops]).
// f is a pure function of the values (Out(In...)), so both paths give every
// element the same result. Launch with GridForValues' grid.
template <typename F, typename Out, typename... In>
__device__ __forceinline__ void ForEachValue(const Geometry<1 + sizeof...(In)>& g, const F& f,
                                             Out* out, const In*... in) {
  constexpr int N = 1 + sizeof...(In);
  constexpr int V = VecOf<Out, In...>();
  const void* const ptrs[N] = {out, in...};
  const int64_t sizes[N] = {int64_t{sizeof(Out)}, int64_t{sizeof(In)}...};
  if (UsesVectorPath<N>(g, ptrs, sizes, V)) {
    ForEachChunkIn<uint32_t, V>(g, f, std::index_sequence_for<In...>(), out, in...);
    return;
  }
  ValueBody<F, Out, In...> body{f, {reinterpret_cast<const char*>(out),
                                     reinterpret_cast<const char*>(in)...}};
  ForEachElement<N>(g, body);
}

// Blocks for a grid-stride loop over n elements (or chunks): enough to fill
// the device several times over, never more than the elements need. The cap
// is about 4 waves of the 8 blocks of 256 threads an SM holds at most; on
// the vector path a 32 MiB tensor of 16-bit floats (2M chunks of 16 bytes)
// takes 2 chunks per thread under it.
inline unsigned GridFor(int64_t n, int64_t threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 132 * 32;  // 32 blocks per SM of an H100.
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

// GridFor for ForEachValue: one thread per chunk on the vector path.
template <typename Out, typename... In>
unsigned GridForValues(const Geometry<1 + sizeof...(In)>& g, const Out* out, const In*... in) {
  constexpr int N = 1 + sizeof...(In);
  constexpr int V = VecOf<Out, In...>();
  const void* const ptrs[N] = {out, in...};
  const int64_t sizes[N] = {int64_t{sizeof(Out)}, int64_t{sizeof(In)}...};
  return GridFor(UsesVectorPath<N>(g, ptrs, sizes, V) ? (g.numel + V - 1) / V : g.numel);
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
