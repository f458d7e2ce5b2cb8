// CPU kernels of the reductions: reduce_out (sum, prod, mean, amax, amin),
// arg_reduce_out (max/min with indices along one dim) and softmax_out.
//
// Note [CPU reduction strategy]
// reduce_out splits the input's dims into kept dims (the output's size there
// is the input's) and reduced dims (output size 1), orders the reduced dims by
// decreasing stride and merges the ones that are contiguous with each other.
// Then:
// - Inner reduction (the innermost reduced dim is the input's most local one,
//   e.g. sum(), sum(-1)): each output element reduces its runs of the input
//   with a multi-accumulator loop (ReduceRun), outputs split over the pool.
//   When there are few outputs and many elements each (sum() of a large
//   tensor), every output is split into fixed blocks of kBlock elements whose
//   partial results are computed in parallel and combined pairwise in block
//   order.
// - Outer reduction (the input's contiguous dim is kept, e.g. sum(0) of a
//   row-major matrix): for a chunk of up to kColumns contiguous outputs,
//   accumulate whole input rows into an array of accumulators, which the
//   compiler vectorises.
// Floating sums accumulate in float (double for float64) in a cascade: lanes
// of partial sums, flushed into a second level every 64 additions and that
// into a third every 64 flushes, so the rounding error stays close to that of
// a pairwise sum instead of growing with the length. Chunking
// depends only on the shapes, never on the thread count or timing, so the same
// input gives the same bits every time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/ops.h"

namespace ember::cpu {
namespace {

// Elements per parallel block of a large reduction (fixed; see the Note).
constexpr int64_t kBlock = 65536;
// Outputs accumulated together by the outer-reduction loop.
constexpr int64_t kColumns = 256;

template <typename A>
bool IsNan(A a) {
  if constexpr (std::is_floating_point_v<A>) {
    return std::isnan(a);
  } else {
    return false;
  }
}

// The accumulator type of a sum/prod/mean: float for 16-bit floats and
// float32, double for float64, uint64 (wrapping, as int64 two's complement)
// for integer and bool inputs.
template <typename T>
using SumAcc = std::conditional_t<std::is_floating_point_v<OpMath<T>>, OpMath<T>, uint64_t>;

// Each reduction: the accumulator type, identity, how an element enters the
// accumulator and how two accumulators combine.
template <typename T>
struct SumReducer {
  using Acc = SumAcc<T>;
  static constexpr bool kIsSum = true;
  static Acc Identity() { return Acc(0); }
  static Acc Load(T x) { return static_cast<Acc>(static_cast<OpMath<T>>(x)); }
  static Acc Combine(Acc a, Acc b) { return a + b; }
};

template <typename T>
struct ProdReducer {
  using Acc = SumAcc<T>;
  static constexpr bool kIsSum = false;
  static Acc Identity() { return Acc(1); }
  static Acc Load(T x) { return static_cast<Acc>(static_cast<OpMath<T>>(x)); }
  static Acc Combine(Acc a, Acc b) { return a * b; }
};

// NaN propagates: once an accumulator is NaN it stays NaN.
template <typename T>
struct MaxReducer {
  using Acc = OpMath<T>;
  static constexpr bool kIsSum = false;
  static Acc Identity() {
    if constexpr (std::is_floating_point_v<Acc>) return -std::numeric_limits<Acc>::infinity();
    return std::numeric_limits<Acc>::lowest();
  }
  static Acc Load(T x) { return static_cast<Acc>(x); }
  static Acc Combine(Acc a, Acc b) { return (b > a || IsNan(b)) ? b : a; }
};

template <typename T>
struct MinReducer {
  using Acc = OpMath<T>;
  static constexpr bool kIsSum = false;
  static Acc Identity() {
    if constexpr (std::is_floating_point_v<Acc>) return std::numeric_limits<Acc>::infinity();
    return std::numeric_limits<Acc>::max();
  }
  static Acc Load(T x) { return static_cast<Acc>(x); }
  static Acc Combine(Acc a, Acc b) { return (b < a || IsNan(b)) ? b : a; }
};

// Folds `n` lane accumulators pairwise into lane 0.
template <typename R, int N>
typename R::Acc FoldLanes(typename R::Acc (&lanes)[N]) {
  for (int width = N / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] = R::Combine(lanes[j], lanes[j + width]);
  }
  return lanes[0];
}

// Reduces x[0], x[s], ..., x[(n-1)s]. Contiguous runs use kLanes independent
// accumulators (vectorised); sums flush them into a second level every
// kLanes * kInner elements and that into a third every 64 flushes (Note [CPU
// reduction strategy]).
template <typename R, typename T>
typename R::Acc ReduceRun(const T* x, int64_t n, int64_t s) {
  using Acc = typename R::Acc;
  constexpr int kLanes = sizeof(Acc) >= 8 ? 8 : 16;
  constexpr int64_t kInner = 64;
  if (s != 1 || n < 2 * kLanes) {
    Acc l1 = R::Identity(), l2 = R::Identity(), l3 = R::Identity();
    for (int64_t i = 0; i < n; ++i) {
      l1 = R::Combine(l1, R::Load(x[i * s]));
      if constexpr (R::kIsSum) {
        if ((i & 63) == 63) {
          l2 = R::Combine(l2, l1);
          l1 = R::Identity();
          if ((i & 4095) == 4095) {
            l3 = R::Combine(l3, l2);
            l2 = R::Identity();
          }
        }
      }
    }
    return R::Combine(l3, R::Combine(l2, l1));
  }
  Acc l1[kLanes], l2[kLanes], l3[kLanes];
  for (int j = 0; j < kLanes; ++j) l1[j] = l2[j] = l3[j] = R::Identity();
  int64_t i = 0;
  constexpr int64_t kStep = kLanes * kInner;
  for (int64_t step = 1; i + kStep <= n; i += kStep, ++step) {
    const T* p = x + i;
    for (int64_t k = 0; k < kInner; ++k) {
      for (int j = 0; j < kLanes; ++j) l1[j] = R::Combine(l1[j], R::Load(p[k * kLanes + j]));
    }
    if constexpr (R::kIsSum) {
      for (int j = 0; j < kLanes; ++j) {
        l2[j] = R::Combine(l2[j], l1[j]);
        l1[j] = R::Identity();
      }
      if (step % 64 == 0) {
        for (int j = 0; j < kLanes; ++j) {
          l3[j] = R::Combine(l3[j], l2[j]);
          l2[j] = R::Identity();
        }
      }
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) l1[j] = R::Combine(l1[j], R::Load(x[i + j]));
  }
  for (int j = 0; i < n; ++i, ++j) l1[j] = R::Combine(l1[j], R::Load(x[i]));
  for (int j = 0; j < kLanes; ++j) l1[j] = R::Combine(l3[j], R::Combine(l2[j], l1[j]));
  return FoldLanes<R>(l1);
}

// Folds partial results pairwise, in order.
template <typename R>
typename R::Acc FoldPairwise(std::vector<typename R::Acc>& v) {
  if (v.empty()) return R::Identity();
  for (size_t width = 1; width < v.size(); width *= 2) {
    for (size_t i = 0; i + width < v.size(); i += 2 * width) v[i] = R::Combine(v[i], v[i + width]);
  }
  return v[0];
}

// A dim of the iteration: size and element strides of the input and output.
struct Dim {
  int64_t size;
  int64_t in;
  int64_t out;
};
using Dims = absl::InlinedVector<Dim, 6>;

// Walks a multi-dimensional index space in row-major order (dims outer to
// inner), tracking the input and output offsets.
class Walker {
 public:
  explicit Walker(const Dims& dims) : dims_(dims), idx_(dims.size(), 0) {}

  // Positions the walker at linear index `linear`.
  void Seek(int64_t linear) {
    in_ = out_ = 0;
    for (int64_t d = static_cast<int64_t>(dims_.size()) - 1; d >= 0; --d) {
      idx_[d] = linear % dims_[d].size;
      linear /= dims_[d].size;
      in_ += idx_[d] * dims_[d].in;
      out_ += idx_[d] * dims_[d].out;
    }
  }
  void Next() {
    for (int64_t d = static_cast<int64_t>(dims_.size()) - 1; d >= 0; --d) {
      in_ += dims_[d].in;
      out_ += dims_[d].out;
      if (++idx_[d] < dims_[d].size) return;
      in_ -= dims_[d].in * dims_[d].size;
      out_ -= dims_[d].out * dims_[d].size;
      idx_[d] = 0;
    }
  }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  const Dims& dims_;
  absl::InlinedVector<int64_t, 6> idx_;
  int64_t in_ = 0;
  int64_t out_ = 0;
};

// Calls fn(offset, n) for the innermost runs covering linear indices
// [begin, end) of `dims` (input strides); the run's stride is dims.back().in.
template <typename F>
void ForRuns(const Dims& dims, int64_t begin, int64_t end, F&& fn) {
  if (dims.empty()) {
    if (begin < end) fn(int64_t{0}, int64_t{1});
    return;
  }
  const int64_t inner = dims.back().size;
  Dims outer(dims.begin(), dims.end() - 1);
  Walker w(outer);
  int64_t pos = begin;
  w.Seek(begin / inner);
  int64_t j = begin % inner;
  while (pos < end) {
    int64_t n = std::min(inner - j, end - pos);
    fn(w.in() + j * dims.back().in, n);
    pos += n;
    j = 0;
    w.Next();
  }
}

// Product of sizes.
int64_t Count(const Dims& dims) {
  int64_t n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

// Sorts dims by decreasing input stride (stable) and merges neighbours that
// are contiguous in both the input and the output.
void SortAndMerge(Dims& dims) {
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& a, const Dim& b) { return a.in > b.in; });
  Dims merged;
  for (const Dim& d : dims) {
    if (!merged.empty() && merged.back().in == d.in * d.size &&
        merged.back().out == d.out * d.size) {
      merged.back() = {merged.back().size * d.size, d.in, d.out};
    } else {
      merged.push_back(d);
    }
  }
  dims = merged;
}

template <typename R, typename T, typename O>
void ReduceTyped(const Tensor& out, const Tensor& self, bool mean) {
  using Acc = typename R::Acc;
  const T* x = static_cast<const T*>(self.raw_data());
  O* y = static_cast<O*>(out.raw_data());
  Dims kept, red;
  for (int64_t d = 0; d < self.dim(); ++d) {
    int64_t size = self.sizes()[d];
    if (size == 1) continue;
    if (out.sizes()[d] == 1) {
      red.push_back({size, self.strides()[d], 0});
    } else {
      kept.push_back({size, self.strides()[d], out.strides()[d]});
    }
  }
  SortAndMerge(red);
  SortAndMerge(kept);
  const int64_t num_out = Count(kept);
  const int64_t red_n = Count(red);
  auto finalize = [&](Acc acc) -> O {
    if constexpr (std::is_floating_point_v<Acc>) {
      if (mean) acc /= static_cast<Acc>(red_n);
    }
    return CastTo<O>(acc);
  };
  const int64_t run_stride = red.empty() ? 1 : red.back().in;
  // Reduces the linear range [b, e) of the reduced index space at `base`.
  auto reduce_range = [&](const T* base, int64_t b, int64_t e) {
    if (red.size() <= 1) return ReduceRun<R>(base + b * run_stride, e - b, run_stride);
    Acc acc = R::Identity();
    ForRuns(red, b, e, [&](int64_t off, int64_t n) {
      acc = R::Combine(acc, ReduceRun<R>(base + off, n, run_stride));
    });
    return acc;
  };

  const bool outer = !kept.empty() && !red.empty() && kept.back().in == 1 && run_stride > 1;
  if (outer) {
    // Outer reduction (Note [CPU reduction strategy]).
    const Dim col = kept.back();
    Dims rows(kept.begin(), kept.end() - 1);
    const int64_t num_rows = Count(rows);
    const int64_t chunks = (col.size + kColumns - 1) / kColumns;
    const int64_t grain =
        std::max<int64_t>(1, kDefaultGrainSize / (red_n * std::min(col.size, kColumns)));
    parallel_for(0, num_rows * chunks, grain, [&](int64_t begin, int64_t end) {
      Walker w(rows);
      Acc l1[kColumns], l2[kColumns], l3[kColumns];
      for (int64_t item = begin; item < end; ++item) {
        w.Seek(item / chunks);
        const int64_t c0 = (item % chunks) * kColumns;
        const int64_t nc = std::min(kColumns, col.size - c0);
        const T* base = x + w.in() + c0;
        for (int64_t c = 0; c < nc; ++c) l1[c] = l2[c] = l3[c] = R::Identity();
        int64_t steps = 0, flushes = 0;
        ForRuns(red, 0, red_n, [&](int64_t off, int64_t n) {
          for (int64_t r = 0; r < n; ++r) {
            const T* row = base + off + r * run_stride;
            for (int64_t c = 0; c < nc; ++c) l1[c] = R::Combine(l1[c], R::Load(row[c]));
            if (++steps == 64) {
              steps = 0;
              for (int64_t c = 0; c < nc; ++c) {
                l2[c] = R::Combine(l2[c], l1[c]);
                l1[c] = R::Identity();
              }
              if (++flushes == 64) {
                flushes = 0;
                for (int64_t c = 0; c < nc; ++c) {
                  l3[c] = R::Combine(l3[c], l2[c]);
                  l2[c] = R::Identity();
                }
              }
            }
          }
        });
        O* dst = y + w.out() + c0 * col.out;
        for (int64_t c = 0; c < nc; ++c) {
          dst[c * col.out] = finalize(R::Combine(l3[c], R::Combine(l2[c], l1[c])));
        }
      }
    });
    return;
  }

  // Inner reduction.
  if (num_out <= 16 && red_n >= 4 * kBlock) {
    // Few, long outputs: fixed blocks of each, reduced in parallel.
    const int64_t blocks = (red_n + kBlock - 1) / kBlock;
    std::vector<Acc> partial(blocks);
    Walker w(kept);
    w.Seek(0);
    for (int64_t o = 0; o < num_out; ++o, w.Next()) {
      const T* base = x + w.in();
      parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          partial[b] = reduce_range(base, b * kBlock, std::min(red_n, (b + 1) * kBlock));
        }
      });
      y[w.out()] = finalize(FoldPairwise<R>(partial));
    }
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kDefaultGrainSize / red_n);
  parallel_for(0, num_out, grain, [&](int64_t begin, int64_t end) {
    Walker w(kept);
    w.Seek(begin);
    for (int64_t o = begin; o < end; ++o, w.Next()) {
      y[w.out()] = finalize(reduce_range(x + w.in(), 0, red_n));
    }
  });
}

template <template <typename> class R, typename T>
void ReduceWithOutput(const Tensor& out, const Tensor& self, bool mean) {
  if (out.dtype() == self.dtype()) {
    ReduceTyped<R<T>, T, T>(out, self, mean);
  } else if constexpr (!std::is_floating_point_v<OpMath<T>>) {
    EMBER_INTERNAL_ASSERT(out.dtype() == kInt64, "reduce_out: integer inputs reduce into int64");
    ReduceTyped<R<T>, T, int64_t>(out, self, mean);
  } else {
    EMBER_INTERNAL_ASSERT(false, "reduce_out: output dtype ", dtype_name(out.dtype()),
                          " for input dtype ", dtype_name(self.dtype()));
  }
}

void ReduceOut(ReduceOp op, const Tensor& out, const Tensor& self, IntArrayRef dims) {
  EMBER_INTERNAL_ASSERT(out.dim() == self.dim(), "reduce_out: out must have the keepdim shape");
  if (out.numel() == 0 || self.numel() == 0) return;
  VisitDtype(self.dtype(), [&]<typename T>() {
    switch (op) {
      case ReduceOp::kSum:
        ReduceWithOutput<SumReducer, T>(out, self, false);
        break;
      case ReduceOp::kMean:
        if constexpr (std::is_floating_point_v<OpMath<T>>) {
          ReduceWithOutput<SumReducer, T>(out, self, true);
        } else {
          EMBER_FAIL("mean: unsupported dtype ", dtype_name(self.dtype()));
        }
        break;
      case ReduceOp::kProd:
        ReduceWithOutput<ProdReducer, T>(out, self, false);
        break;
      case ReduceOp::kAmax:
        ReduceTyped<MaxReducer<T>, T, T>(out, self, false);
        break;
      case ReduceOp::kAmin:
        ReduceTyped<MinReducer<T>, T, T>(out, self, false);
        break;
      default:
        EMBER_FAIL("reduce_out: ", ReduceOpName(op), " is not a value reduction");
    }
  });
}

// --- max(dim) / min(dim) ---------------------------------------------------------

// Whether `v` replaces the current best `best`: strictly better, or the first
// NaN (NaN is the max and the min, as in torch; ties keep the first index).
template <bool kMax, typename A>
inline bool Better(A v, A best) {
  if (IsNan(best)) return false;
  if (IsNan(v)) return true;
  return kMax ? v > best : v < best;
}

template <bool kMax, typename T>
void ArgReduceTyped(const Tensor& values, const Tensor& indices, const Tensor& self, int64_t dim) {
  using A = OpMath<T>;
  const T* x = static_cast<const T*>(self.raw_data());
  T* vals = static_cast<T*>(values.raw_data());
  int64_t* idxs = indices.data_ptr<int64_t>();
  const int64_t n = self.sizes()[dim];
  const int64_t s = self.strides()[dim];
  // Kept dims with input and value strides; index strides are tracked apart.
  Dims kept, kept_idx;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (d == dim || self.sizes()[d] == 1) continue;
    kept.push_back({self.sizes()[d], self.strides()[d], values.strides()[d]});
    kept_idx.push_back({self.sizes()[d], 0, indices.strides()[d]});
  }
  const int64_t num_out = Count(kept);
  const bool outer = !kept.empty() && kept.back().in == 1 && s > 1 && n > 1;
  if (outer) {
    // Scan whole input rows against a chunk of contiguous outputs.
    const Dim col = kept.back();
    const Dim col_idx = kept_idx.back();
    Dims rows(kept.begin(), kept.end() - 1), rows_idx(kept_idx.begin(), kept_idx.end() - 1);
    const int64_t num_rows = Count(rows);
    const int64_t chunks = (col.size + kColumns - 1) / kColumns;
    const int64_t grain =
        std::max<int64_t>(1, kDefaultGrainSize / (n * std::min(col.size, kColumns)));
    parallel_for(0, num_rows * chunks, grain, [&](int64_t begin, int64_t end) {
      Walker w(rows), wi(rows_idx);
      A best[kColumns];
      int64_t where[kColumns];
      for (int64_t item = begin; item < end; ++item) {
        w.Seek(item / chunks);
        wi.Seek(item / chunks);
        const int64_t c0 = (item % chunks) * kColumns;
        const int64_t nc = std::min(kColumns, col.size - c0);
        const T* base = x + w.in() + c0;
        for (int64_t c = 0; c < nc; ++c) {
          best[c] = static_cast<A>(base[c]);
          where[c] = 0;
        }
        for (int64_t i = 1; i < n; ++i) {
          const T* row = base + i * s;
          for (int64_t c = 0; c < nc; ++c) {
            A v = static_cast<A>(row[c]);
            if (Better<kMax>(v, best[c])) {
              best[c] = v;
              where[c] = i;
            }
          }
        }
        for (int64_t c = 0; c < nc; ++c) {
          vals[w.out() + (c0 + c) * col.out] = static_cast<T>(best[c]);
          idxs[wi.out() + (c0 + c) * col_idx.out] = where[c];
        }
      }
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kDefaultGrainSize / n);
  parallel_for(0, num_out, grain, [&](int64_t begin, int64_t end) {
    Walker w(kept), wi(kept_idx);
    w.Seek(begin);
    wi.Seek(begin);
    for (int64_t o = begin; o < end; ++o, w.Next(), wi.Next()) {
      const T* p = x + w.in();
      A best = static_cast<A>(p[0]);
      int64_t where = 0;
      for (int64_t i = 1; i < n && !IsNan(best); ++i) {
        A v = static_cast<A>(p[i * s]);
        if (Better<kMax>(v, best)) {
          best = v;
          where = i;
        }
      }
      vals[w.out()] = static_cast<T>(best);
      idxs[wi.out()] = where;
    }
  });
}

void ArgReduceOut(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& self,
                  int64_t dim) {
  EMBER_INTERNAL_ASSERT(op == ReduceOp::kArgmax || op == ReduceOp::kArgmin);
  if (values.numel() == 0) return;
  VisitDtype(self.dtype(), [&]<typename T>() {
    if (op == ReduceOp::kArgmax) {
      ArgReduceTyped<true, T>(values, indices, self, dim);
    } else {
      ArgReduceTyped<false, T>(values, indices, self, dim);
    }
  });
}

// --- softmax / log_softmax ---------------------------------------------------------

// One row: out = exp(x - max) / sum, or x - max - log(sum). `buf` holds the
// row in the compute type.
template <typename T>
void SoftmaxRow(const T* x, int64_t sx, T* y, int64_t sy, int64_t n, bool log,
                std::vector<OpMath<T>>& buf) {
  using A = OpMath<T>;
  buf.resize(n);
  A* v = buf.data();
  if (sx == 1) {
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<A>(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<A>(x[i * sx]);
  }
  A max = v[0];
  for (int64_t i = 1; i < n; ++i) max = (v[i] > max || std::isnan(v[i])) ? v[i] : max;
  A sum = 0;
  if (log) {
    for (int64_t i = 0; i < n; ++i) sum += std::exp(v[i] - max);
    // (x - max) - log(sum): folding max into the shift first would lose
    // the small log(sum) against a large max.
    const A log_sum = std::log(sum);
    for (int64_t i = 0; i < n; ++i) v[i] = (v[i] - max) - log_sum;
  } else {
    for (int64_t i = 0; i < n; ++i) {
      v[i] = std::exp(v[i] - max);
      sum += v[i];
    }
    const A inv = A(1) / sum;
    for (int64_t i = 0; i < n; ++i) v[i] *= inv;
  }
  if (sy == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(v[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i * sy] = static_cast<T>(v[i]);
  }
}

void SoftmaxOut(const Tensor& out, const Tensor& self, int64_t dim, bool log) {
  if (out.numel() == 0) return;
  VisitFloatingDtype(self.dtype(), log ? "log_softmax" : "softmax", [&]<typename T>() {
    const T* x = static_cast<const T*>(self.raw_data());
    T* y = static_cast<T*>(out.raw_data());
    const int64_t n = self.sizes()[dim];
    Dims rows;
    for (int64_t d = 0; d < self.dim(); ++d) {
      if (d == dim || self.sizes()[d] == 1) continue;
      rows.push_back({self.sizes()[d], self.strides()[d], out.strides()[d]});
    }
    const int64_t num_rows = Count(rows);
    const int64_t grain = std::max<int64_t>(1, 4096 / n);
    parallel_for(0, num_rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<OpMath<T>> buf;
      Walker w(rows);
      w.Seek(begin);
      for (int64_t r = begin; r < end; ++r, w.Next()) {
        SoftmaxRow<T>(x + w.in(), self.strides()[dim], y + w.out(), out.strides()[dim], n, log,
                      buf);
      }
    });
  });
}

EMBER_REGISTER_KERNEL(reduce_out, kCPU, &ReduceOut);
EMBER_REGISTER_KERNEL(arg_reduce_out, kCPU, &ArgReduceOut);
EMBER_REGISTER_KERNEL(softmax_out, kCPU, &SoftmaxOut);

}  // namespace
}  // namespace ember::cpu
