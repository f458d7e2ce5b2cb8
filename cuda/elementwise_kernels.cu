// Device side of unary_out, binary_out, binary_alpha_out, where_out and
// clamp_out. One kernel template per family and element type, the op chosen
// by a switch inside it (Note [CUDA loops] in loops.cuh). Semantics follow
// the CPU kernels (tensor/cpu/elementwise_kernels.cc): 16-bit floats compute
// in float; signed integer add/sub/mul/neg/abs/square wrap around; maximum
// and minimum propagate NaN; integer pow squares and returns 0 for negative
// exponents except for bases 1 and -1.
#include <cmath>

#include "cuda/loops.cuh"
#include "tensor/int_math.h"

namespace ember::cuda::kernels {
namespace {

using int_math::IntPow;
using int_math::kIsSignedInt;
using int_math::WrapAdd;
using int_math::WrapMul;
using int_math::WrapSub;

// ---- unary ----------------------------------------------------------------------------

template <typename M>
__device__ __forceinline__ M UnaryFloat(int op, M x) {
  switch (op) {
    case kNeg:
      return -x;
    case kAbs:
      return fabs(x);
    case kExp:
      return exp(x);
    case kExpm1:
      return expm1(x);
    case kLog:
      return log(x);
    case kLog1p:
      return log1p(x);
    case kLog2:
      return log2(x);
    case kSqrt:
      return sqrt(x);
    case kRsqrt:
      return M(1) / sqrt(x);
    case kSin:
      return sin(x);
    case kCos:
      return cos(x);
    case kTan:
      return tan(x);
    case kTanh:
      return tanh(x);
    case kSigmoid:
      return M(1) / (M(1) + exp(-x));
    case kRelu:
      return x < M(0) ? M(0) : x;
    case kGelu:
      return M(0.5) * x * (M(1) + erf(x * M(0.70710678118654752440084436210484903)));
    case kErf:
      return erf(x);
    case kReciprocal:
      return M(1) / x;
    case kSign:
      return M((M(0) < x) - (x < M(0)));
    case kFloor:
      return floor(x);
    case kCeil:
      return ceil(x);
    case kRound:
      return rint(x);  // Half to even.
    case kSquare:
      return x * x;
    default:
      return x;
  }
}

template <typename T>
__device__ __forceinline__ bool IsNegative(T x) {
  if constexpr (std::is_signed_v<T>) {
    return x < T(0);
  } else {
    return false;
  }
}

template <typename T>
__device__ __forceinline__ T UnaryIntegral(int op, T x) {
  switch (op) {
    case kNeg:
      return WrapSub<T>(T(0), x);
    case kAbs:
      return IsNegative(x) ? WrapSub<T>(T(0), x) : x;
    case kRelu:
      return IsNegative(x) ? T(0) : x;
    case kSign:
      return static_cast<T>((T(0) < x) - IsNegative(x));
    case kSquare:
      return WrapMul<T>(x, x);
    default:
      return x;  // floor, ceil, round
  }
}

// Every unary op but logical_not (ForEachValue's f; Note [CUDA loops]).
template <typename T>
struct UnaryOf {
  int op;
  __device__ T operator()(T x) const {
    if constexpr (kIsFloat<T>) {
      return Cast<T>(UnaryFloat<Math<T>>(op, static_cast<Math<T>>(x)));
    } else if constexpr (std::is_same_v<T, bool>) {
      return x;  // sign
    } else {
      return UnaryIntegral<T>(op, x);
    }
  }
};

template <typename T>
struct LogicalNotOf {
  __device__ bool operator()(T x) const { return !Cast<bool>(x); }
};

template <typename T>
__global__ void UnaryKernel(Geometry<2> g, int op, char* out, const char* in) {
  const T* x = reinterpret_cast<const T*>(in);
  if (op == kLogicalNot) {
    ForEachValue(g, LogicalNotOf<T>{}, reinterpret_cast<bool*>(out), x);
  } else {
    ForEachValue(g, UnaryOf<T>{op}, reinterpret_cast<T*>(out), x);
  }
}

// ---- binary -----------------------------------------------------------------------------

template <typename M>
__device__ __forceinline__ bool Compare(int op, M x, M y) {
  switch (op) {
    case kEq:
      return x == y;
    case kNe:
      return x != y;
    case kLt:
      return x < y;
    case kLe:
      return x <= y;
    case kGt:
      return x > y;
    case kGe:
      return x >= y;
    case kLogicalAnd:
      return (x != M(0)) && (y != M(0));
    case kLogicalOr:
      return (x != M(0)) || (y != M(0));
    default:
      return (x != M(0)) != (y != M(0));
  }
}

// Arithmetic in M (Math<T>), which is T for integers and bool.
template <typename T, typename M>
__device__ __forceinline__ M Arith(int op, M x, M y) {
  switch (op) {
    case kAdd:
      if constexpr (std::is_same_v<T, bool>)
        return x || y;
      else
        return WrapAdd<M>(x, y);
    case kSub:
      if constexpr (std::is_same_v<T, bool>)
        return x;
      else
        return WrapSub<M>(x, y);
    case kMul:
      if constexpr (std::is_same_v<T, bool>)
        return x && y;
      else
        return WrapMul<M>(x, y);
    case kDiv:
      if constexpr (kIsFloat<T>)
        return x / y;
      else
        return x;
    case kPow:
      if constexpr (kIsFloat<T>)
        return static_cast<M>(pow(x, y));
      else if constexpr (!std::is_same_v<T, bool>)
        return IntPow<M>(x, y);
      else
        return x;
    case kMaximum:
      return (x > y || x != x) ? x : y;
    default:
      return (x < y || x != x) ? x : y;  // kMinimum
  }
}

// The bool-returning binary ops (op >= kEq).
template <typename T>
struct CompareOf {
  int op;
  __device__ bool operator()(T a, T b) const {
    using M = Math<T>;
    return Compare<M>(op, static_cast<M>(a), static_cast<M>(b));
  }
};

// The others, returning T.
template <typename T>
struct ArithOf {
  int op;
  bool has_alpha;
  Math<T> alpha;  // Already negated for kSub on floats.
  __device__ T operator()(T a, T b) const {
    using M = Math<T>;
    const M x = static_cast<M>(a);
    const M y = static_cast<M>(b);
    M r;
    if (has_alpha) {
      if constexpr (std::is_same_v<T, bool>) {
        r = alpha ? (x || y) : x;
      } else if constexpr (kIsFloat<T>) {
        r = x + alpha * y;
      } else {
        r = op == kAdd ? WrapAdd<M>(x, WrapMul<M>(alpha, y)) : WrapSub<M>(x, WrapMul<M>(alpha, y));
      }
    } else {
      r = Arith<T, M>(op, x, y);
    }
    return Cast<T>(r);
  }
};

template <typename T>
__global__ void BinaryKernel(Geometry<3> g, ArithOf<T> f, char* out, const char* a,
                             const char* b) {
  const T* x = reinterpret_cast<const T*>(a);
  const T* y = reinterpret_cast<const T*>(b);
  if (f.op >= kEq) {
    ForEachValue(g, CompareOf<T>{f.op}, reinterpret_cast<bool*>(out), x, y);
  } else {
    ForEachValue(g, f, reinterpret_cast<T*>(out), x, y);
  }
}

// ---- where / clamp ------------------------------------------------------------------------

// Both values are read (each operand's own memory); the result is the chosen
// one's bits.
template <typename T>
struct WhereOf {
  __device__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};

template <typename T>
__global__ void WhereKernel(Geometry<4> g, char* out, const char* cond, const char* a,
                            const char* b) {
  ForEachValue(g, WhereOf<T>{}, reinterpret_cast<T*>(out), reinterpret_cast<const bool*>(cond),
               reinterpret_cast<const T*>(a), reinterpret_cast<const T*>(b));
}

// Floats compare in Math<T> (NaN stays NaN), integers in int64 so that a bound
// outside T's range clamps nothing; min > max gives max, as torch.
template <typename T>
struct ClampOf {
  using M = std::conditional_t<kIsFloat<T>, Math<T>, int64_t>;
  bool has_min;
  bool has_max;
  M lo;
  M hi;
  __device__ T operator()(T v) const {
    M x = static_cast<M>(v);
    if (has_min && x < lo) x = lo;
    if (has_max && x > hi) x = hi;
    return Cast<T>(x);
  }
};

template <typename T>
__global__ void ClampKernel(Geometry<2> g, ClampOf<T> f, char* out, const char* in) {
  ForEachValue(g, f, reinterpret_cast<T*>(out), reinterpret_cast<const T*>(in));
}

}  // namespace

cudaError_t LaunchUnary(cudaStream_t stream, int op, const Geometry<2>& g, char* out,
                        const char* in, int dtype) {
  if (g.numel == 0) return cudaSuccess;
  VisitCode(dtype, [&]<typename T>() {
    const T* x = reinterpret_cast<const T*>(in);
    const unsigned grid = op == kLogicalNot
                              ? GridForValues(g, reinterpret_cast<const bool*>(out), x)
                              : GridForValues(g, reinterpret_cast<const T*>(out), x);
    UnaryKernel<T><<<grid, kThreads, 0, stream>>>(g, op, out, in);
  });
  return cudaGetLastError();
}

cudaError_t LaunchBinary(cudaStream_t stream, int op, const Geometry<3>& g, char* out,
                         const char* a, const char* b, int dtype, bool has_alpha,
                         double alpha_float, int64_t alpha_int) {
  if (g.numel == 0) return cudaSuccess;
  VisitCode(dtype, [&]<typename T>() {
    using M = Math<T>;
    M alpha{};
    if constexpr (std::is_same_v<T, bool>) {
      alpha = alpha_int != 0;
    } else if constexpr (kIsFloat<T>) {
      alpha = static_cast<M>(op == kSub ? -alpha_float : alpha_float);
    } else {
      alpha = static_cast<M>(alpha_int);
    }
    const T* x = reinterpret_cast<const T*>(a);
    const T* y = reinterpret_cast<const T*>(b);
    const unsigned grid = op >= kEq ? GridForValues(g, reinterpret_cast<const bool*>(out), x, y)
                                    : GridForValues(g, reinterpret_cast<const T*>(out), x, y);
    BinaryKernel<T><<<grid, kThreads, 0, stream>>>(g, ArithOf<T>{op, has_alpha, alpha}, out, a, b);
  });
  return cudaGetLastError();
}

cudaError_t LaunchWhere(cudaStream_t stream, const Geometry<4>& g, char* out, const char* cond,
                        const char* a, const char* b, int dtype) {
  if (g.numel == 0) return cudaSuccess;
  VisitCode(dtype, [&]<typename T>() {
    const unsigned grid = GridForValues(
        g, reinterpret_cast<const T*>(out), reinterpret_cast<const bool*>(cond),
        reinterpret_cast<const T*>(a), reinterpret_cast<const T*>(b));
    WhereKernel<T><<<grid, kThreads, 0, stream>>>(g, out, cond, a, b);
  });
  return cudaGetLastError();
}

cudaError_t LaunchClamp(cudaStream_t stream, const Geometry<2>& g, char* out, const char* in,
                        int dtype, bool has_min, bool has_max, double min_float, double max_float,
                        int64_t min_int, int64_t max_int) {
  if (g.numel == 0) return cudaSuccess;
  VisitCode(dtype, [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      using M = typename ClampOf<T>::M;
      M lo, hi;
      if constexpr (kIsFloat<T>) {
        lo = static_cast<M>(min_float);
        hi = static_cast<M>(max_float);
      } else {
        lo = min_int;
        hi = max_int;
      }
      const unsigned grid =
          GridForValues(g, reinterpret_cast<const T*>(out), reinterpret_cast<const T*>(in));
      ClampKernel<T><<<grid, kThreads, 0, stream>>>(g, ClampOf<T>{has_min, has_max, lo, hi}, out,
                                                    in);
    }
  });
  return cudaGetLastError();
}

}  // namespace ember::cuda::kernels
