#include "distributed/reduce.h"

#include <algorithm>
#include <type_traits>

namespace ember::distributed {
namespace {

// out[i] = f(a[i], b[i]); `out` may be `a` (ReduceInto) or a third buffer.
template <typename T, typename F>
void Apply(void* out, const void* a, const void* b, int64_t n, F f) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
}

// float16 / bfloat16 SUM a block at a time through float (the block
// conversions, F16C for float16): the same values as element by element.
template <typename T>
void SumHalf(void* out, const void* acc, const void* in, int64_t n) {
  constexpr int64_t kBlock = 512;
  float x[kBlock], y[kBlock];
  for (int64_t at = 0; at < n; at += kBlock) {
    const int64_t m = std::min(kBlock, n - at);
    HalfToFloat(static_cast<const T*>(acc) + at, x, m);
    HalfToFloat(static_cast<const T*>(in) + at, y, m);
    for (int64_t i = 0; i < m; ++i) x[i] += y[i];
    FloatToHalf(x, static_cast<T*>(out) + at, m);
  }
}

template <typename T>
void ReduceTyped(ReduceOp op, void* out, const void* acc, const void* in, int64_t n) {
  using M = OpMath<T>;
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) return SumHalf<T>(out, acc, in, n);
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::kProduct || op == ReduceOp::kMin) {
      Apply<T>(out, acc, in, n, [](bool a, bool b) { return a && b; });
    } else {
      Apply<T>(out, acc, in, n, [](bool a, bool b) { return a || b; });
    }
    return;
  } else {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        Apply<T>(out, acc, in, n, [](T a, T b) { return static_cast<T>(M(a) + M(b)); });
        return;
      case ReduceOp::kProduct:
        Apply<T>(out, acc, in, n, [](T a, T b) { return static_cast<T>(M(a) * M(b)); });
        return;
      case ReduceOp::kMin:
        // NaN propagates, as torch.minimum does.
        Apply<T>(out, acc, in, n, [](T a, T b) {
          M x = M(a), y = M(b);
          if (x != x) return a;
          if (y != y) return b;
          return y < x ? b : a;
        });
        return;
      case ReduceOp::kMax:
        Apply<T>(out, acc, in, n, [](T a, T b) {
          M x = M(a), y = M(b);
          if (x != x) return a;
          if (y != y) return b;
          return y > x ? b : a;
        });
        return;
    }
  }
}

}  // namespace

void ReduceInto(ReduceOp op, Dtype dtype, void* acc, const void* in, int64_t n) {
  VisitDtype(dtype, [&]<typename T>() { ReduceTyped<T>(op, acc, acc, in, n); });
}

void ReduceTo(ReduceOp op, Dtype dtype, void* out, const void* a, const void* b, int64_t n) {
  VisitDtype(dtype, [&]<typename T>() { ReduceTyped<T>(op, out, a, b, n); });
}

void DivideBy(Dtype dtype, void* data, int64_t n, int64_t divisor) {
  VisitFloatingDtype(dtype, "all_reduce AVG", [&]<typename T>() {
    T* p = static_cast<T*>(data);
    using M = OpMath<T>;
    const M d = static_cast<M>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(M(p[i]) / d);
  });
}

}  // namespace ember::distributed
