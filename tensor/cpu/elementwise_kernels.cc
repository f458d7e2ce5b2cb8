// CPU kernels of the elementwise `_out` ops: unary_out, binary_out,
// binary_alpha_out, where_out and clamp_out. The composite kernels (tensor/elementwise.cc, Note
// [Elementwise dtypes]) have validated everything: `out` has the iteration
// shape, the inputs are expanded to it and are in the compute dtype (the
// output's, or any dtype for logical_not and bool-returning binary ops).
//
// Arithmetic on 16-bit floats is done in float (OpMath). Signed integer
// add/sub/mul/neg/abs/square wrap around (two's complement), as torch does,
// instead of being undefined behaviour. Contiguous runs are plain indexed
// loops that the compiler vectorises (cpu::Map); large tensors are split over
// the intra-op thread pool.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "tensor/cpu/loops.h"
#include "tensor/half.h"
#include "tensor/int_math.h"
#include "tensor/ops.h"

namespace ember::cpu {
namespace {

using int_math::IntPow;
using int_math::kIsSignedInt;
using int_math::WrapAdd;
using int_math::WrapMul;
using int_math::WrapNeg;
using int_math::WrapSub;

template <typename T>
inline constexpr bool kIsFloat = !std::is_integral_v<T>;  // float, double, Half, BFloat16.

// The typed core of a kernel: out[i] = f(x[i]) computed in OpMath<T>.
template <typename T, typename F>
void MapFloat(const Tensor& out, const Tensor& in, F f) {
  using M = OpMath<T>;
  Map<T, T>(out, {in}, [f](T x) { return CastTo<T>(f(static_cast<M>(x))); });
}

[[noreturn]] void Unreachable(std::string_view op, Dtype dtype) {
  EMBER_FAIL(op, ": cpu kernel got unsupported dtype ", dtype_name(dtype),
             " (the composite op should have refused it)");
}

// --- unary_out ---------------------------------------------------------------------

template <typename T>
void UnaryFloat(UnaryOp op, const Tensor& out, const Tensor& in) {
  using M = OpMath<T>;
  switch (op) {
    case UnaryOp::kNeg: return MapFloat<T>(out, in, [](M x) { return -x; });
    case UnaryOp::kAbs: return MapFloat<T>(out, in, [](M x) { return std::abs(x); });
    case UnaryOp::kExp: return MapFloat<T>(out, in, [](M x) { return std::exp(x); });
    case UnaryOp::kExpm1: return MapFloat<T>(out, in, [](M x) { return std::expm1(x); });
    case UnaryOp::kLog: return MapFloat<T>(out, in, [](M x) { return std::log(x); });
    case UnaryOp::kLog1p: return MapFloat<T>(out, in, [](M x) { return std::log1p(x); });
    case UnaryOp::kLog2: return MapFloat<T>(out, in, [](M x) { return std::log2(x); });
    case UnaryOp::kSqrt: return MapFloat<T>(out, in, [](M x) { return std::sqrt(x); });
    case UnaryOp::kRsqrt: return MapFloat<T>(out, in, [](M x) { return M(1) / std::sqrt(x); });
    case UnaryOp::kSin: return MapFloat<T>(out, in, [](M x) { return std::sin(x); });
    case UnaryOp::kCos: return MapFloat<T>(out, in, [](M x) { return std::cos(x); });
    case UnaryOp::kTan: return MapFloat<T>(out, in, [](M x) { return std::tan(x); });
    case UnaryOp::kTanh: return MapFloat<T>(out, in, [](M x) { return std::tanh(x); });
    case UnaryOp::kSigmoid:
      return MapFloat<T>(out, in, [](M x) { return M(1) / (M(1) + std::exp(-x)); });
    case UnaryOp::kRelu: return MapFloat<T>(out, in, [](M x) { return x < M(0) ? M(0) : x; });
    case UnaryOp::kGelu:
      return MapFloat<T>(out, in, [](M x) {
        constexpr M kSqrtHalf = M(0.70710678118654752440084436210484903);
        return M(0.5) * x * (M(1) + std::erf(x * kSqrtHalf));
      });
    case UnaryOp::kErf: return MapFloat<T>(out, in, [](M x) { return std::erf(x); });
    case UnaryOp::kReciprocal: return MapFloat<T>(out, in, [](M x) { return M(1) / x; });
    case UnaryOp::kSign:  // sign(0) = sign(NaN) = 0, as torch's vectorised kernel.
      return MapFloat<T>(out, in, [](M x) { return M((M(0) < x) - (x < M(0))); });
    case UnaryOp::kFloor: return MapFloat<T>(out, in, [](M x) { return std::floor(x); });
    case UnaryOp::kCeil: return MapFloat<T>(out, in, [](M x) { return std::ceil(x); });
    case UnaryOp::kRound:  // Half to even: the default rounding mode.
      return MapFloat<T>(out, in, [](M x) { return std::nearbyint(x); });
    case UnaryOp::kSquare: return MapFloat<T>(out, in, [](M x) { return x * x; });
    case UnaryOp::kLogicalNot: break;
  }
  Unreachable(UnaryOpName(op), kDtypeOf<T>);
}

template <typename T>
void UnaryIntegral(UnaryOp op, const Tensor& out, const Tensor& in) {
  switch (op) {
    case UnaryOp::kNeg: return Map<T, T>(out, {in}, [](T x) { return WrapNeg<T>(x); });
    case UnaryOp::kAbs:
      return Map<T, T>(out, {in}, [](T x) { return x < T(0) ? WrapNeg<T>(x) : x; });
    case UnaryOp::kRelu: return Map<T, T>(out, {in}, [](T x) { return x < T(0) ? T(0) : x; });
    case UnaryOp::kSign:
      return Map<T, T>(out, {in}, [](T x) { return static_cast<T>((T(0) < x) - (x < T(0))); });
    case UnaryOp::kSquare: return Map<T, T>(out, {in}, [](T x) { return WrapMul<T>(x, x); });
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound: return Map<T, T>(out, {in}, [](T x) { return x; });
    default: break;
  }
  Unreachable(UnaryOpName(op), kDtypeOf<T>);
}

void UnaryOut(UnaryOp op, const Tensor& out, const Tensor& in) {
  if (op == UnaryOp::kLogicalNot) {
    VisitDtype(in.dtype(), [&]<typename T>() {
      Map<bool, T>(out, {in}, [](T x) { return !CastTo<bool>(x); });
    });
    return;
  }
  VisitDtype(out.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      UnaryFloat<T>(op, out, in);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (op != UnaryOp::kSign) Unreachable(UnaryOpName(op), kBool);
      Map<bool, bool>(out, {in}, [](bool x) { return x; });
    } else {
      UnaryIntegral<T>(op, out, in);
    }
  });
}

// --- binary_out --------------------------------------------------------------------

// float16 and bfloat16 arithmetic on contiguous operands of one size (or a
// one-element second operand, a scalar's): converted to float a block at a
// time with the block conversions (F16C for float16), computed in float,
// converted back; the same values as converting element by element.
template <typename T, typename F>
bool MapHalfBlocks(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  const int64_t n = out.numel();
  // A scalar operand arrives as one element, or broadcast (every stride 0).
  const bool b_one = b.numel() == 1 || std::all_of(b.strides().begin(), b.strides().end(),
                                                    [](int64_t st) { return st == 0; });
  if (!out.is_contiguous() || !a.is_contiguous() || a.numel() != n ||
      !(b_one || (b.is_contiguous() && b.numel() == n))) {
    return false;
  }
  constexpr int64_t kBlock = 512;
  float x[kBlock], y[kBlock];
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  T* po = out.data_ptr<T>();
  const bool scalar = b_one;
  const float b0 = static_cast<float>(pb[0]);
  for (int64_t at = 0; at < n; at += kBlock) {
    const int64_t m = std::min(kBlock, n - at);
    HalfToFloat(pa + at, x, m);
    if (scalar) {
      for (int64_t i = 0; i < m; ++i) x[i] = f(x[i], b0);
    } else {
      HalfToFloat(pb + at, y, m);
      for (int64_t i = 0; i < m; ++i) x[i] = f(x[i], y[i]);
    }
    FloatToHalf(x, po + at, m);
  }
  return true;
}

template <typename T, typename F>
void MapArith(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  if constexpr (std::is_same_v<OpMath<T>, T>) {
    Map<T, T, T>(out, {a, b}, f);
  } else {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      if (MapHalfBlocks<T>(out, a, b, f)) return;
    }
    using M = OpMath<T>;
    Map<T, T, T>(out, {a, b},
                 [f](T x, T y) { return CastTo<T>(f(static_cast<M>(x), static_cast<M>(y))); });
  }
}

template <typename T, typename F>
void MapCompare(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  using M = OpMath<T>;
  Map<bool, T, T>(out, {a, b},
                  [f](T x, T y) -> bool { return f(static_cast<M>(x), static_cast<M>(y)); });
}

template <typename T>
void BinaryTyped(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  using M = OpMath<T>;
  switch (op) {
    case BinaryOp::kAdd:
      if constexpr (std::is_same_v<T, bool>) {
        return MapArith<T>(out, a, b, [](bool x, bool y) { return x || y; });
      } else {
        return MapArith<T>(out, a, b, [](M x, M y) { return WrapAdd<M>(x, y); });
      }
    case BinaryOp::kSub:
      if constexpr (!std::is_same_v<T, bool>) {
        return MapArith<T>(out, a, b, [](M x, M y) { return WrapSub<M>(x, y); });
      }
      break;
    case BinaryOp::kMul:
      if constexpr (std::is_same_v<T, bool>) {
        return MapArith<T>(out, a, b, [](bool x, bool y) { return x && y; });
      } else {
        return MapArith<T>(out, a, b, [](M x, M y) { return WrapMul<M>(x, y); });
      }
    case BinaryOp::kDiv:
      if constexpr (kIsFloat<T>) {
        return MapArith<T>(out, a, b, [](M x, M y) { return x / y; });
      }
      break;
    case BinaryOp::kPow:
      if constexpr (kIsFloat<T>) {
        return MapArith<T>(out, a, b, [](M x, M y) { return static_cast<M>(std::pow(x, y)); });
      } else if constexpr (!std::is_same_v<T, bool>) {
        return MapArith<T>(out, a, b, [](T x, T y) { return IntPow<T>(x, y); });
      }
      break;
    case BinaryOp::kMaximum:  // NaN wins.
      return MapArith<T>(out, a, b, [](M x, M y) { return (x > y || x != x) ? x : y; });
    case BinaryOp::kMinimum:
      return MapArith<T>(out, a, b, [](M x, M y) { return (x < y || x != x) ? x : y; });
    case BinaryOp::kEq: return MapCompare<T>(out, a, b, [](M x, M y) { return x == y; });
    case BinaryOp::kNe: return MapCompare<T>(out, a, b, [](M x, M y) { return x != y; });
    case BinaryOp::kLt: return MapCompare<T>(out, a, b, [](M x, M y) { return x < y; });
    case BinaryOp::kLe: return MapCompare<T>(out, a, b, [](M x, M y) { return x <= y; });
    case BinaryOp::kGt: return MapCompare<T>(out, a, b, [](M x, M y) { return x > y; });
    case BinaryOp::kGe: return MapCompare<T>(out, a, b, [](M x, M y) { return x >= y; });
    case BinaryOp::kLogicalAnd:
      return MapCompare<T>(out, a, b,
                           [](M x, M y) { return (x != M(0)) && (y != M(0)); });
    case BinaryOp::kLogicalOr:
      return MapCompare<T>(out, a, b,
                           [](M x, M y) { return (x != M(0)) || (y != M(0)); });
    case BinaryOp::kLogicalXor:
      return MapCompare<T>(out, a, b,
                           [](M x, M y) { return (x != M(0)) != (y != M(0)); });
  }
  Unreachable(BinaryOpName(op), kDtypeOf<T>);
}

void BinaryOut(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  VisitDtype(a.dtype(), [&]<typename T>() { BinaryTyped<T>(op, out, a, b); });
}

// --- binary_alpha_out (Note [One-pass alpha] in tensor/elementwise.cc) --------------

template <typename T>
void BinaryAlphaTyped(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                      const Scalar& alpha) {
  const bool add = op == BinaryOp::kAdd;
  if constexpr (std::is_same_v<T, bool>) {
    EMBER_INTERNAL_ASSERT(add, "sub on bool reached binary_alpha_out");
    if (alpha.to<bool>()) {
      MapArith<T>(out, a, b, [](bool x, bool y) { return x || y; });
    } else {
      MapArith<T>(out, a, b, [](bool x, bool) { return x; });
    }
  } else if constexpr (kIsFloat<T>) {
    using M = OpMath<T>;
    const M s = add ? alpha.to<M>() : -alpha.to<M>();
    MapArith<T>(out, a, b, [s](M x, M y) { return x + s * y; });
  } else {
    const T s = alpha.to<T>();
    if (add) {
      MapArith<T>(out, a, b, [s](T x, T y) { return WrapAdd<T>(x, WrapMul<T>(s, y)); });
    } else {
      MapArith<T>(out, a, b, [s](T x, T y) { return WrapSub<T>(x, WrapMul<T>(s, y)); });
    }
  }
}

void BinaryAlphaOut(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                    const Scalar& alpha) {
  VisitDtype(a.dtype(), [&]<typename T>() { BinaryAlphaTyped<T>(op, out, a, b, alpha); });
}

// --- where_out / clamp_out ---------------------------------------------------------

void WhereOut(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  VisitDtype(out.dtype(), [&]<typename T>() {
    Map<T, bool, T, T>(out, {condition, a, b}, [](bool c, T x, T y) { return c ? x : y; });
  });
}

// Bounds are compared in OpMath<T> for floats (NaN inputs stay NaN) and in
// int64 for integers, so that a bound outside T's range clamps nothing rather
// than wrapping around. min > max gives max everywhere, as torch.
template <typename T>
void ClampTyped(const Tensor& out, const Tensor& in, const std::optional<Scalar>& min,
                const std::optional<Scalar>& max) {
  using M = std::conditional_t<kIsFloat<T>, OpMath<T>, int64_t>;
  if (min && max) {
    const M lo = min->to<M>(), hi = max->to<M>();
    Map<T, T>(out, {in}, [lo, hi](T v) {
      M x = static_cast<M>(v);
      if (x != x) return v;
      x = x < lo ? lo : x;
      return static_cast<T>(x > hi ? hi : x);
    });
  } else if (min) {
    const M lo = min->to<M>();
    Map<T, T>(out, {in}, [lo](T v) {
      M x = static_cast<M>(v);
      return (x < lo) ? static_cast<T>(lo) : v;
    });
  } else {
    const M hi = max->to<M>();
    Map<T, T>(out, {in}, [hi](T v) {
      M x = static_cast<M>(v);
      return (x > hi) ? static_cast<T>(hi) : v;
    });
  }
}

void ClampOut(const Tensor& out, const Tensor& in, const std::optional<Scalar>& min,
              const std::optional<Scalar>& max) {
  VisitDtype(out.dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      Unreachable("clamp", kBool);
    } else {
      ClampTyped<T>(out, in, min, max);
    }
  });
}

EMBER_REGISTER_KERNEL(unary_out, kCPU, &UnaryOut);
EMBER_REGISTER_KERNEL(binary_out, kCPU, &BinaryOut);
EMBER_REGISTER_KERNEL(binary_alpha_out, kCPU, &BinaryAlphaOut);
EMBER_REGISTER_KERNEL(where_out, kCPU, &WhereOut);
EMBER_REGISTER_KERNEL(clamp_out, kCPU, &ClampOut);

}  // namespace
}  // namespace ember::cpu
