#include "nn/attention.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/attention_kernels.h"
#include "nn/dropout.h"
#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;
using internal::kKeyBlock;
using internal::kQueryBlock;

constexpr char kOp[] = "scaled_dot_product_attention";

// --- Block products ------------------------------------------------------------------

// C[m x n] = alpha * op(A) op(B) + beta * C, row-major, on the calling thread.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : c[i * ldc + j] * beta;
    }
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  }
}

// --- Row kernels -----------------------------------------------------------------------

// The softmax's per-row work on a block of scores: the row maximum, and
// x = exp(x - shift) with the row's sum. float rows take glibc's vector
// exponentials (libmvec, the x86-64 vector function ABI: 16 lanes on
// AVX-512, 8 on AVX2) where the CPU has them; double rows and other CPUs
// the scalar std::exp. Either way a row's result does not depend on the
// thread that computes it.
extern "C" __m512 _ZGVeN16v_expf(__m512);
extern "C" __m256 _ZGVdN8v_expf(__m256);

enum class Isa { kScalar, kAvx2, kAvx512 };

std::atomic<int> g_max_vector_bits{512};  // internal::set_max_vector_bits

Isa CpuIsa() {
  static const Isa detected = __builtin_cpu_supports("avx512f") ? Isa::kAvx512
                              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                  ? Isa::kAvx2
                                  : Isa::kScalar;
  const int cap = g_max_vector_bits.load(std::memory_order_relaxed);
  const Isa allowed = cap >= 512 ? Isa::kAvx512 : cap >= 256 ? Isa::kAvx2 : Isa::kScalar;
  return std::min(detected, allowed);
}

// GCC 12 flags the undefined pass-through operand inside its own AVX-512
// intrinsics (_mm512_max_ps) as uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f"))) float RowMaxAvx512(const float* x, int64_t n) {
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) best = _mm512_max_ps(best, _mm512_loadu_ps(x + i));
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    best = _mm512_mask_max_ps(best, tail, best, _mm512_maskz_loadu_ps(tail, x + i));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, best);
  return *std::max_element(lanes, lanes + 16);
}

__attribute__((target("avx512f"))) float ExpShiftAvx512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(
        tail, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), s)));
    _mm512_mask_storeu_ps(x + i, tail, e);
    sum = _mm512_add_ps(sum, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return std::accumulate(lanes, lanes + 16, 0.0f);
}

#pragma GCC diagnostic pop

__attribute__((target("avx2,fma"))) float HorizontalAvx2(__m256 v, bool max) {
  __m128 x = max ? _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))
                 : _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 y = _mm_movehl_ps(x, x);
  x = max ? _mm_max_ps(x, y) : _mm_add_ps(x, y);
  y = _mm_shuffle_ps(x, x, 1);
  x = max ? _mm_max_ss(x, y) : _mm_add_ss(x, y);
  return _mm_cvtss_f32(x);
}

__attribute__((target("avx2,fma"))) float RowMaxAvx2(const float* x, int64_t n) {
  __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) best = _mm256_max_ps(best, _mm256_loadu_ps(x + i));
  float m = HorizontalAvx2(best, /*max=*/true);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

__attribute__((target("avx2,fma"))) float ExpShiftAvx2(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = HorizontalAvx2(sum, /*max=*/false);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    total += x[i];
  }
  return total;
}

template <typename T>
T RowMax(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (CpuIsa() == Isa::kAvx512) return RowMaxAvx512(x, n);
    if (CpuIsa() == Isa::kAvx2) return RowMaxAvx2(x, n);
  }
  T best = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

// x[i] = exp(x[i] - shift) for i < n; returns their sum.
template <typename T>
T ExpShift(T* x, int64_t n, T shift) {
  if constexpr (std::is_same_v<T, float>) {
    if (CpuIsa() == Isa::kAvx512) return ExpShiftAvx512(x, n, shift);
    if (CpuIsa() == Isa::kAvx2) return ExpShiftAvx2(x, n, shift);
  }
  T sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// --- Masks ---------------------------------------------------------------------------

// An attention mask read in place through its strides: `base[bh]` is the
// offset of (batch x head) bh's [L, S] matrix, row_stride and col_stride its
// strides (0 where the mask broadcasts).
template <typename T>
struct MaskView {
  const bool* bools = nullptr;
  const T* floats = nullptr;
  std::vector<int64_t> base;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  bool causal = false;

  // Masks the block of scores s[nr x nc] (leading dim ld) of bh's rows
  // i0.. and columns j0..: causal and false entries become -inf, float
  // entries are added.
  void Apply(T* s, int64_t ld, int64_t bh, int64_t i0, int64_t nr, int64_t j0, int64_t nc) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    for (int64_t r = 0; r < nr; ++r) {
      T* row = s + r * ld;
      const int64_t i = i0 + r;
      if (causal) {
        for (int64_t c = std::max<int64_t>(0, i + 1 - j0); c < nc; ++c) row[c] = kNegInf;
      }
      if (bools != nullptr) {
        const bool* m = bools + base[bh] + i * row_stride + j0 * col_stride;
        for (int64_t c = 0; c < nc; ++c) {
          if (!m[c * col_stride]) row[c] = kNegInf;
        }
      } else if (floats != nullptr) {
        const T* m = floats + base[bh] + i * row_stride + j0 * col_stride;
        for (int64_t c = 0; c < nc; ++c) row[c] += m[c * col_stride];
      }
    }
  }
};

// `mask` is undefined or has shape [batch..., L, S] with prod(batch) == bh.
template <typename T>
MaskView<T> MakeMaskView(const Tensor& mask, int64_t bh, bool causal) {
  MaskView<T> view;
  view.causal = causal;
  if (!mask.defined()) return view;
  const int64_t nd = mask.dim();
  if (mask.dtype() == kBool) {
    view.bools = mask.data_ptr<bool>();
  } else {
    view.floats = mask.data_ptr<T>();
  }
  view.row_stride = mask.stride(nd - 2);
  view.col_stride = mask.stride(nd - 1);
  view.base.resize(bh);
  for (int64_t flat = 0; flat < bh; ++flat) {
    int64_t rest = flat, offset = 0;
    for (int64_t d = nd - 3; d >= 0; --d) {
      offset += (rest % mask.size(d)) * mask.stride(d);
      rest /= mask.size(d);
    }
    view.base[flat] = offset;
  }
  return view;
}

// The rows [S, X] of one key or value head, transposed a block of kKeyBlock
// rows at a time: block j is [X, kKeyBlock] (row-major, leading dim
// kKeyBlock), so the products with it (q k^T, dO v^T) are plain row-major
// products, which BLAS runs faster than ones with a transposed operand. A
// worker keeps the head it transposed last and transposes again only when
// the head changes.
template <typename T>
class TransposedHead {
 public:
  // `id` names the rows (x, rows, cols) across calls.
  void Load(int64_t id, const T* x, int64_t rows, int64_t cols) {
    if (id == id_) return;
    id_ = id;
    cols_ = cols;
    data_.resize(((rows + kKeyBlock - 1) / kKeyBlock) * kKeyBlock * cols);
    for (int64_t j0 = 0; j0 < rows; j0 += kKeyBlock) {
      T* block = data_.data() + j0 * cols;
      const int64_t nc = std::min(kKeyBlock, rows - j0);
      for (int64_t c = 0; c < nc; ++c) {
        const T* row = x + (j0 + c) * cols;
        for (int64_t e = 0; e < cols; ++e) block[e * kKeyBlock + c] = row[e];
      }
    }
  }
  // Block of rows j0.. (j0 a multiple of kKeyBlock): [cols, kKeyBlock].
  const T* block(int64_t j0) const { return data_.data() + j0 * cols_; }

 private:
  std::vector<T> data_;
  int64_t id_ = -1;
  int64_t cols_ = 0;
};

// --- The fused kernels (Note [Fused attention on the CPU]) ---------------------------

struct Dims {
  int64_t batch, heads, kv_heads, L, S, E, Ev;
  int64_t group() const { return heads / kv_heads; }
  int64_t query_blocks() const { return (L + kQueryBlock - 1) / kQueryBlock; }
  int64_t key_blocks() const { return (S + kKeyBlock - 1) / kKeyBlock; }
  // The keys query rows [i0, i0 + nr) may attend.
  int64_t key_end(bool causal, int64_t i0, int64_t nr) const {
    return causal ? std::min(S, i0 + nr) : S;
  }
};

// out [B, H, L, Ev], lse [B, H, L] (+inf for rows with nothing to attend).
template <typename T>
void ForwardKernel(const Dims& d, const T* q, const T* k, const T* v, const MaskView<T>& mask,
                   T scale, T* out, T* lse) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t tasks = d.batch * d.heads * d.query_blocks();
  parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> s(kQueryBlock * kKeyBlock), acc(kQueryBlock * d.Ev);
    std::vector<T> m(kQueryBlock), l(kQueryBlock);
    TransposedHead<T> kt;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / d.query_blocks(), i0 = (t % d.query_blocks()) * kQueryBlock;
      const int64_t b = bh / d.heads, h = bh % d.heads, hk = h / d.group();
      const int64_t nr = std::min(kQueryBlock, d.L - i0);
      const T* qp = q + (bh * d.L + i0) * d.E;
      const T* vp = v + (b * d.kv_heads + hk) * d.S * d.Ev;
      kt.Load(b * d.kv_heads + hk, k + (b * d.kv_heads + hk) * d.S * d.E, d.S, d.E);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t key_end = d.key_end(mask.causal, i0, nr);
      for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
        const int64_t nc = std::min(kKeyBlock, key_end - j0);
        Gemm<T>(false, false, nr, nc, d.E, scale, qp, std::max<int64_t>(1, d.E), kt.block(j0),
                kKeyBlock, T(0), s.data(), kKeyBlock);
        mask.Apply(s.data(), kKeyBlock, bh, i0, nr, j0, nc);
        for (int64_t r = 0; r < nr; ++r) {
          T* row = s.data() + r * kKeyBlock;
          const T m_new = std::max(m[r], RowMax(row, nc));
          if (m_new == kNegInf) {  // Nothing to attend yet in this row.
            std::fill(row, row + nc, T(0));
            continue;
          }
          const T alpha = std::exp(m[r] - m_new);  // 0 while m[r] is -inf.
          l[r] = l[r] * alpha + ExpShift(row, nc, m_new);
          m[r] = m_new;
          if (alpha != T(1)) {
            T* a = acc.data() + r * d.Ev;
            for (int64_t e = 0; e < d.Ev; ++e) a[e] *= alpha;
          }
        }
        Gemm<T>(false, false, nr, d.Ev, nc, T(1), s.data(), kKeyBlock, vp + j0 * d.Ev,
                std::max<int64_t>(1, d.Ev), T(1), acc.data(), std::max<int64_t>(1, d.Ev));
      }
      T* op = out + (bh * d.L + i0) * d.Ev;
      T* lp = lse + bh * d.L + i0;
      for (int64_t r = 0; r < nr; ++r) {
        const bool empty = l[r] == T(0);
        const T inv = empty ? T(0) : T(1) / l[r];
        for (int64_t e = 0; e < d.Ev; ++e) op[r * d.Ev + e] = acc[r * d.Ev + e] * inv;
        lp[r] = empty ? std::numeric_limits<T>::infinity() : m[r] + std::log(l[r]);
      }
    }
  });
}

// Recomputes the probabilities of a block from the logsumexp: s holds the
// masked scores on entry and P on return.
template <typename T>
void Probabilities(T* s, int64_t nr, int64_t nc, const T* lse) {
  for (int64_t r = 0; r < nr; ++r) {
    T* row = s + r * kKeyBlock;
    const T shift = lse[r];
    if (shift == std::numeric_limits<T>::infinity()) {
      std::fill(row, row + nc, T(0));
      continue;
    }
    ExpShift(row, nc, shift);
  }
}

// dS = P * (dP - D), in place in dp.
template <typename T>
void ScoreGradients(const T* p, T* dp, int64_t nr, int64_t nc, const T* delta) {
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t i = r * kKeyBlock + c;
      dp[i] = p[i] * (dp[i] - delta[r]);
    }
  }
}

// dq [B, H, L, E], dk [B, Hk, S, E], dv [B, Hk, S, Ev] (each may be null).
template <typename T>
void BackwardKernel(const Dims& d, const T* q, const T* k, const T* v, const T* out, const T* grad,
                    const T* lse, const MaskView<T>& mask, T scale, T* dq, T* dk, T* dv) {
  // D = rowsum(dO * O), once per row.
  std::vector<T> delta(d.batch * d.heads * d.L);
  parallel_for(0, d.batch * d.heads * d.L, std::max<int64_t>(1, kDefaultGrainSize / (d.Ev + 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t row = begin; row < end; ++row) {
                   T sum = 0;
                   for (int64_t e = 0; e < d.Ev; ++e) {
                     sum += grad[row * d.Ev + e] * out[row * d.Ev + e];
                   }
                   delta[row] = sum;
                 }
               });
  const int64_t ld_e = std::max<int64_t>(1, d.E), ld_ev = std::max<int64_t>(1, d.Ev);
  if (d.batch * d.kv_heads >= get_num_threads()) {
    // One pass per (batch, key/value head): each block of probabilities is
    // recomputed once and serves dV, dK and dQ; the task owns its heads' dQ
    // rows and its dK, dV rows. The sums run in the two-pass order (dK, dV
    // over the group's heads and query blocks, dQ over key blocks), so both
    // give the same bits.
    parallel_for(0, d.batch * d.kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> s(kQueryBlock * kKeyBlock), dp(kQueryBlock * kKeyBlock);
      std::vector<T> dq_acc(kQueryBlock * d.E), dk_acc(d.S * d.E), dv_acc(d.S * d.Ev);
      TransposedHead<T> kt, vt;
      for (int64_t bhk = begin; bhk < end; ++bhk) {
        const int64_t b = bhk / d.kv_heads, hk = bhk % d.kv_heads;
        const T* kp = k + bhk * d.S * d.E;
        kt.Load(bhk, kp, d.S, d.E);
        vt.Load(bhk, v + bhk * d.S * d.Ev, d.S, d.Ev);
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
          const int64_t bh = b * d.heads + h;
          for (int64_t i0 = 0; i0 < d.L; i0 += kQueryBlock) {
            const int64_t nr = std::min(kQueryBlock, d.L - i0);
            const T* qp = q + (bh * d.L + i0) * d.E;
            const T* gp = grad + (bh * d.L + i0) * d.Ev;
            std::fill(dq_acc.begin(), dq_acc.end(), T(0));
            const int64_t key_end = d.key_end(mask.causal, i0, nr);
            for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
              const int64_t nc = std::min(kKeyBlock, key_end - j0);
              Gemm<T>(false, false, nr, nc, d.E, scale, qp, ld_e, kt.block(j0), kKeyBlock, T(0),
                      s.data(), kKeyBlock);
              mask.Apply(s.data(), kKeyBlock, bh, i0, nr, j0, nc);
              Probabilities(s.data(), nr, nc, lse + bh * d.L + i0);
              Gemm<T>(true, false, nc, d.Ev, nr, T(1), s.data(), kKeyBlock, gp, ld_ev, T(1),
                      dv_acc.data() + j0 * d.Ev, ld_ev);
              Gemm<T>(false, false, nr, nc, d.Ev, T(1), gp, ld_ev, vt.block(j0), kKeyBlock, T(0),
                      dp.data(), kKeyBlock);
              ScoreGradients(s.data(), dp.data(), nr, nc, delta.data() + bh * d.L + i0);
              Gemm<T>(true, false, nc, d.E, nr, scale, dp.data(), kKeyBlock, qp, ld_e, T(1),
                      dk_acc.data() + j0 * d.E, ld_e);
              if (dq != nullptr) {
                Gemm<T>(false, false, nr, d.E, nc, scale, dp.data(), kKeyBlock, kp + j0 * d.E,
                        ld_e, T(1), dq_acc.data(), ld_e);
              }
            }
            if (dq != nullptr) {
              std::copy(dq_acc.begin(), dq_acc.begin() + nr * d.E, dq + (bh * d.L + i0) * d.E);
            }
          }
        }
        if (dk != nullptr) std::copy(dk_acc.begin(), dk_acc.end(), dk + bhk * d.S * d.E);
        if (dv != nullptr) std::copy(dv_acc.begin(), dv_acc.end(), dv + bhk * d.S * d.Ev);
      }
    });
    return;
  }
  // Fewer (batch, key/value head) pairs than threads: two passes over blocks.
  if (dk != nullptr || dv != nullptr) {
    // Pass 1: dK and dV per (batch, key/value head, key block).
    const int64_t tasks = d.batch * d.kv_heads * d.key_blocks();
    parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> s(kQueryBlock * kKeyBlock), dp(kQueryBlock * kKeyBlock);
      std::vector<T> dk_acc(kKeyBlock * d.E), dv_acc(kKeyBlock * d.Ev);
      TransposedHead<T> kt, vt;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t bhk = t / d.key_blocks(), j0 = (t % d.key_blocks()) * kKeyBlock;
        const int64_t b = bhk / d.kv_heads, hk = bhk % d.kv_heads;
        const int64_t nc = std::min(kKeyBlock, d.S - j0);
        const T* kp = k + (bhk * d.S + j0) * d.E;
        kt.Load(t, kp, nc, d.E);
        vt.Load(t, v + (bhk * d.S + j0) * d.Ev, nc, d.Ev);
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
          const int64_t bh = b * d.heads + h;
          // Under the causal mask rows before j0 see none of these keys.
          const int64_t i_start = mask.causal ? (j0 / kQueryBlock) * kQueryBlock : 0;
          for (int64_t i0 = i_start; i0 < d.L; i0 += kQueryBlock) {
            const int64_t nr = std::min(kQueryBlock, d.L - i0);
            const T* qp = q + (bh * d.L + i0) * d.E;
            const T* gp = grad + (bh * d.L + i0) * d.Ev;
            Gemm<T>(false, false, nr, nc, d.E, scale, qp, ld_e, kt.block(0), kKeyBlock, T(0),
                    s.data(), kKeyBlock);
            mask.Apply(s.data(), kKeyBlock, bh, i0, nr, j0, nc);
            Probabilities(s.data(), nr, nc, lse + bh * d.L + i0);
            Gemm<T>(true, false, nc, d.Ev, nr, T(1), s.data(), kKeyBlock, gp, ld_ev, T(1),
                    dv_acc.data(), ld_ev);
            Gemm<T>(false, false, nr, nc, d.Ev, T(1), gp, ld_ev, vt.block(0), kKeyBlock, T(0),
                    dp.data(), kKeyBlock);
            ScoreGradients(s.data(), dp.data(), nr, nc, delta.data() + bh * d.L + i0);
            Gemm<T>(true, false, nc, d.E, nr, scale, dp.data(), kKeyBlock, qp, ld_e, T(1),
                    dk_acc.data(), ld_e);
          }
        }
        if (dk != nullptr)
          std::copy(dk_acc.begin(), dk_acc.begin() + nc * d.E, dk + (bhk * d.S + j0) * d.E);
        if (dv != nullptr) {
          std::copy(dv_acc.begin(), dv_acc.begin() + nc * d.Ev, dv + (bhk * d.S + j0) * d.Ev);
        }
      }
    });
  }
  if (dq != nullptr) {
    // Pass 2: dQ per (batch, head, query block).
    const int64_t tasks = d.batch * d.heads * d.query_blocks();
    parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> s(kQueryBlock * kKeyBlock), dp(kQueryBlock * kKeyBlock);
      std::vector<T> dq_acc(kQueryBlock * d.E);
      TransposedHead<T> kt, vt;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t bh = t / d.query_blocks(), i0 = (t % d.query_blocks()) * kQueryBlock;
        const int64_t b = bh / d.heads, h = bh % d.heads, hk = h / d.group();
        const int64_t nr = std::min(kQueryBlock, d.L - i0);
        const T* qp = q + (bh * d.L + i0) * d.E;
        const T* gp = grad + (bh * d.L + i0) * d.Ev;
        const int64_t bhk = b * d.kv_heads + hk;
        const T* kp = k + bhk * d.S * d.E;
        kt.Load(bhk, kp, d.S, d.E);
        vt.Load(bhk, v + bhk * d.S * d.Ev, d.S, d.Ev);
        std::fill(dq_acc.begin(), dq_acc.end(), T(0));
        const int64_t key_end = d.key_end(mask.causal, i0, nr);
        for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
          const int64_t nc = std::min(kKeyBlock, key_end - j0);
          Gemm<T>(false, false, nr, nc, d.E, scale, qp, ld_e, kt.block(j0), kKeyBlock, T(0),
                  s.data(), kKeyBlock);
          mask.Apply(s.data(), kKeyBlock, bh, i0, nr, j0, nc);
          Probabilities(s.data(), nr, nc, lse + bh * d.L + i0);
          Gemm<T>(false, false, nr, nc, d.Ev, T(1), gp, ld_ev, vt.block(j0), kKeyBlock, T(0),
                  dp.data(), kKeyBlock);
          ScoreGradients(s.data(), dp.data(), nr, nc, delta.data() + bh * d.L + i0);
          Gemm<T>(false, false, nr, d.E, nc, scale, dp.data(), kKeyBlock, kp + j0 * d.E, ld_e, T(1),
                  dq_acc.data(), ld_e);
        }
        std::copy(dq_acc.begin(), dq_acc.begin() + nr * d.E, dq + (bh * d.L + i0) * d.E);
      }
    });
  }
}

template <typename F>
void VisitFloat(Dtype dtype, F&& f) {
  if (dtype == kFloat32) {
    f.template operator()<float>();
  } else {
    EMBER_INTERNAL_ASSERT(dtype == kFloat64, "fused attention on ", dtype_name(dtype));
    f.template operator()<double>();
  }
}

Dims DimsOf(const Tensor& q, const Tensor& k, const Tensor& v) {
  return Dims{.batch = q.size(0),
              .heads = q.size(1),
              .kv_heads = k.size(1),
              .L = q.size(2),
              .S = k.size(2),
              .E = q.size(3),
              .Ev = v.size(3)};
}

// --- The composed path ---------------------------------------------------------------

// softmax(q k^T * scale + mask) in recorded tensor ops, rows with nothing to
// attend set to 0. q [B, H, L, E], k [B, H, S, E]; mask undefined or
// broadcastable to [B, H, L, S].
Tensor ComposedProbabilities(const Tensor& q, const Tensor& k, const Tensor& mask, bool causal,
                             double scale) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  Tensor s = q.matmul(k.transpose(-2, -1)) * scale;
  if (causal) {
    const TensorOptions index = TensorOptions(kInt64).device(q.device());
    Tensor above = arange(k.size(2), index).unsqueeze(0).gt(arange(q.size(2), index).unsqueeze(1));
    s = s.masked_fill(above, neg_inf);
  }
  if (mask.defined()) {
    s = mask.dtype() == kBool ? s.masked_fill(mask.logical_not(), neg_inf) : s + mask;
  }
  Tensor dead;
  {
    autograd::NoGradGuard no_grad;
    dead = s.detach().amax({-1}, /*keepdim=*/true).eq(neg_inf);
  }
  return s.masked_fill(dead, 0.0).softmax(-1).masked_fill(dead, 0.0);
}

// The gradients of attention from the composed probabilities, in tensor ops
// (recorded under create_graph, so they have gradients of their own).
internal::AttentionGrads ComposedGradients(const internal::AttentionCall& c, const Tensor& grad,
                                           const std::array<bool, 3>& needs) {
  const int64_t heads = c.q.size(1), kv_heads = c.k.size(1);
  Tensor k_rep = internal::RepeatHeads(c.k, heads), v_rep = internal::RepeatHeads(c.v, heads);
  Tensor m4 = c.mask.defined() ? c.mask.reshape({c.q.size(0), heads, c.q.size(2), c.k.size(2)})
                               : c.mask;
  Tensor p = ComposedProbabilities(c.q, k_rep, m4, c.causal, c.scale);
  internal::AttentionGrads g;
  if (needs[2]) g.dv = internal::SumHeadGroups(p.transpose(-2, -1).matmul(grad), kv_heads);
  if (needs[0] || needs[1]) {
    Tensor dp = grad.matmul(v_rep.transpose(-2, -1));
    Tensor ds = p * (dp - (dp * p).sum({-1}, /*keepdim=*/true));
    if (needs[0]) g.dq = ds.matmul(k_rep) * c.scale;
    if (needs[1]) g.dk = internal::SumHeadGroups(ds.transpose(-2, -1).matmul(c.q) * c.scale, kv_heads);
  }
  return g;
}

// --- The CPU's kernels (Note [Fused attention on the CPU]) ---------------------------

// float32 and float64 (the layer computes float16 and bfloat16 in float32);
// stats: the per-row logsumexp [B, H, L] in the input's dtype.
bool AttentionForwardCpu(const internal::AttentionCall& c, Tensor* out, Tensor* stats) {
  if (c.q.dtype() != kFloat32 && c.q.dtype() != kFloat64) return false;
  const Dims d = DimsOf(c.q, c.k, c.v);
  *out = empty({d.batch, d.heads, d.L, d.Ev}, c.q.options());
  *stats = empty({d.batch, d.heads, d.L}, c.q.options());
  VisitFloat(c.q.dtype(), [&]<typename T>() {
    const MaskView<T> view = MakeMaskView<T>(c.mask, d.batch * d.heads, c.causal);
    ForwardKernel<T>(d, c.q.data_ptr<T>(), c.k.data_ptr<T>(), c.v.data_ptr<T>(), view,
                     static_cast<T>(c.scale), out->data_ptr<T>(), stats->data_ptr<T>());
  });
  return true;
}

bool AttentionBackwardCpu(const internal::AttentionCall& c, const Tensor& out,
                          const Tensor& stats, const Tensor& grad,
                          const std::array<bool, 3>& needs, internal::AttentionGrads* grads) {
  const Dims d = DimsOf(c.q, c.k, c.v);
  grads->dq = needs[0] ? empty_like(c.q) : Tensor();
  grads->dk = needs[1] || needs[2] ? empty_like(c.k) : Tensor();
  grads->dv = needs[1] || needs[2] ? empty_like(c.v) : Tensor();
  VisitFloat(c.q.dtype(), [&]<typename T>() {
    const MaskView<T> view = MakeMaskView<T>(c.mask, d.batch * d.heads, c.causal);
    BackwardKernel<T>(d, c.q.data_ptr<T>(), c.k.data_ptr<T>(), c.v.data_ptr<T>(),
                      out.data_ptr<T>(), grad.data_ptr<T>(), stats.data_ptr<T>(), view,
                      static_cast<T>(c.scale), needs[0] ? grads->dq.data_ptr<T>() : nullptr,
                      grads->dk.defined() ? grads->dk.data_ptr<T>() : nullptr,
                      grads->dv.defined() ? grads->dv.data_ptr<T>() : nullptr);
  });
  return true;
}

// --- The kernels' Function -----------------------------------------------------------

// What a device's forward kernel returned for the call.
struct KernelResult {
  Tensor out, stats;
};

// q, k, v as the kernel's call had them (not detached: the Function records
// them); the kernel has run, so forward only keeps its results. backward
// asks the same device's backward kernel, and differentiates the composed
// probabilities where it declines or under create_graph (Note [Attention
// kernels decline] in nn/attention_kernels.h).
struct KernelAttention : autograd::Function<KernelAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const KernelResult& result, const Tensor& mask, bool causal,
                        double scale) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["out"] = result.out;
    ctx->saved_data["stats"] = result.stats;
    ctx->saved_data["mask"] = mask;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    return result.out;
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> saved = ctx->get_saved_variables();
    internal::AttentionCall call{.q = saved[0],
                                 .k = saved[1],
                                 .v = saved[2],
                                 .mask = std::get<Tensor>(ctx->saved_data["mask"]),
                                 .causal = std::get<bool>(ctx->saved_data["causal"]),
                                 .scale = std::get<double>(ctx->saved_data["scale"])};
    const std::array<bool, 3> needs = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                       ctx->needs_input_grad(2)};
    const Tensor& grad = grad_outputs[0];
    internal::AttentionGrads g;
    bool ran = false;
    if (!autograd::GradMode::is_enabled()) {
      const Tensor& out = std::get<Tensor>(ctx->saved_data["out"]);
      const Tensor& stats = std::get<Tensor>(ctx->saved_data["stats"]);
      call.q = call.q.detach();
      call.k = call.k.detach();
      call.v = call.v.detach();
      ran = internal::attention_backward(call.q.device())(call, out, stats, grad.contiguous(),
                                                          needs, &g);
    }
    if (!ran) g = ComposedGradients(call, grad, needs);
    // One per forward argument: q, k, v, then result, mask, causal, scale.
    return {needs[0] ? g.dq : Tensor(), needs[1] ? g.dk : Tensor(), needs[2] ? g.dv : Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

SizeVector Prefix(const Tensor& t, int64_t keep_trailing) {
  return SizeVector(t.sizes().begin(), t.sizes().end() - keep_trailing);
}

int64_t Product(const SizeVector& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

}  // namespace

namespace internal {

void set_max_vector_bits(int bits) { g_max_vector_bits.store(bits, std::memory_order_relaxed); }

constinit DeviceKernel<AttentionForwardFn> attention_forward{"scaled_dot_product_attention"};
constinit DeviceKernel<AttentionBackwardFn> attention_backward{
    "scaled_dot_product_attention backward"};
EMBER_REGISTER_NN_KERNEL(attention_forward, DeviceType::kCPU, &AttentionForwardCpu);
EMBER_REGISTER_NN_KERNEL(attention_backward, DeviceType::kCPU, &AttentionBackwardCpu);

Tensor RepeatHeads(const Tensor& k, int64_t heads) {
  const int64_t kv_heads = k.size(1);
  if (kv_heads == heads) return k;
  const int64_t group = heads / kv_heads;
  return k.unsqueeze(2)
      .expand({k.size(0), kv_heads, group, k.size(2), k.size(3)})
      .reshape({k.size(0), heads, k.size(2), k.size(3)});
}

Tensor SumHeadGroups(const Tensor& g, int64_t kv_heads) {
  const int64_t heads = g.size(1);
  if (kv_heads == heads) return g;
  return g.reshape({g.size(0), kv_heads, heads / kv_heads, g.size(2), g.size(3)}).sum({2});
}

}  // namespace internal

namespace functional {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const ScaledDotProductAttentionOptions& options) {
  // A float attn_mask is cast with query, key and value.
  auto with_mask = [&options](const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& mask) {
    ScaledDotProductAttentionOptions cast_options = options;
    cast_options.attn_mask = mask;
    return scaled_dot_product_attention(q, k, v, cast_options);
  };
  if (auto cast = ember::internal::MaybeAutocast(kOp, with_mask, query, key, value,
                                                 options.attn_mask)) {
    return *std::move(cast);
  }
  EMBER_CHECK(query.defined() && key.defined() && value.defined(), kOp,
              ": query, key and value must be defined tensors");
  EMBER_CHECK(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2,
              "Expected query, key, and value to all be at least 2 dimensional, but got "
              "query.dim: ",
              query.dim(), " key.dim: ", key.dim(), " and value.dim: ", value.dim(), " instead.");
  EMBER_CHECK(query.dtype() == key.dtype() && query.dtype() == value.dtype(),
              "Expected query, key, and value to have the same dtype, but got query.dtype: ",
              dtype_name(query.dtype()), " key.dtype: ", dtype_name(key.dtype()),
              " and value.dtype: ", dtype_name(value.dtype()), " instead.");
  EMBER_CHECK(query.device() == key.device() && query.device() == value.device(),
              "Expected query, key, and value to have the same device type, but got query.device: ",
              query.device().str(), " key.device: ", key.device().str(),
              " and value.device: ", value.device().str(), " instead.");
  EMBER_CHECK(query.is_floating_point(), kOp, ": expected floating point query, key and value, ",
              "but got ", dtype_name(query.dtype()), "; convert them with .to(ember::kFloat32)");
  const int64_t L = query.size(-2), E = query.size(-1), S = key.size(-2), Ev = value.size(-1);
  EMBER_CHECK(key.size(-1) == E, kOp, ": the last dim of query (", E, ") and key (", key.size(-1),
              ") must match: query ", ShapeToString(query.sizes()), ", key ",
              ShapeToString(key.sizes()));
  EMBER_CHECK(value.size(-2) == S, kOp,
              ": key and value must have the same sequence length (dim "
              "-2), but got key ",
              ShapeToString(key.sizes()), " and value ", ShapeToString(value.sizes()));
  EMBER_CHECK(options.dropout_p >= 0.0 && options.dropout_p <= 1.0,
              "dropout probability has to be between 0 and 1, but got ", options.dropout_p);
  const Tensor& mask = options.attn_mask;
  EMBER_CHECK(!(mask.defined() && options.is_causal),
              "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
              "is_causal=True");
  if (mask.defined()) {
    EMBER_CHECK(mask.dtype() == kBool || mask.dtype() == query.dtype(),
                "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                "attn_mask.dtype: ",
                dtype_name(mask.dtype()), " and query.dtype: ", dtype_name(query.dtype()),
                " instead.");
    EMBER_CHECK(mask.device() == query.device(), kOp, ": expected attn_mask on ",
                query.device().str(), " (the query's device), but it is on ", mask.device().str());
  }

  // Heads of a GQA group (dim -3), and the batch dims that broadcast.
  bool grouped = false;
  if (options.enable_gqa && query.dim() >= 3 && key.dim() >= 3 && value.dim() >= 3) {
    const int64_t hq = query.size(-3), hk = key.size(-3), hv = value.size(-3);
    EMBER_CHECK(hq % hk == 0 && hq % hv == 0,
                "Number of heads in key and value must divide the number of heads in query: "
                "query has ",
                hq, ", key ", hk, ", value ", hv);
    EMBER_CHECK(hk == hv, kOp,
                ": with enable_gqa, key and value must have the same number of "
                "heads (dim -3), but got ",
                hk, " and ", hv);
    grouped = hk != hq;
  }
  const int64_t trailing = grouped ? 3 : 2;
  SizeVector outer =
      BroadcastShapes(BroadcastShapes(Prefix(query, trailing), Prefix(key, trailing), kOp),
                      Prefix(value, trailing), kOp);
  const int64_t heads = grouped ? query.size(-3) : 1, kv_heads = grouped ? key.size(-3) : 1;
  const int64_t batch = Product(outer);
  auto full = [&](SizeVector tail) {
    SizeVector s = outer;
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  SizeVector q_shape = grouped ? full({heads, L, E}) : full({L, E});
  SizeVector k_shape = grouped ? full({kv_heads, S, E}) : full({S, E});
  SizeVector v_shape = grouped ? full({kv_heads, S, Ev}) : full({S, Ev});
  SizeVector out_shape = grouped ? full({heads, L, Ev}) : full({L, Ev});
  SizeVector mask_shape = grouped ? full({heads, L, S}) : full({L, S});

  Tensor m;
  if (mask.defined()) {
    bool fits = mask.dim() <= static_cast<int64_t>(mask_shape.size());
    for (int64_t i = 1; fits && i <= mask.dim(); ++i) {
      const int64_t got = mask.size(-i), want = mask_shape[mask_shape.size() - i];
      fits = got == want || got == 1;
    }
    EMBER_CHECK(fits, kOp, ": attn_mask of shape ", ShapeToString(mask.sizes()),
                " doesn't broadcast to the attention weights' shape ", ShapeToString(mask_shape),
                " ([..., L, S])");
    m = mask.expand(mask_shape);
  }

  Tensor q4 = query.expand(q_shape).reshape({batch, heads, L, E});
  Tensor k4 = key.expand(k_shape).reshape({batch, kv_heads, S, E});
  Tensor v4 = value.expand(v_shape).reshape({batch, kv_heads, S, Ev});
  const double scale =
      options.scale.has_value() ? *options.scale : 1.0 / std::sqrt(static_cast<double>(E));

  const Dtype dtype = query.dtype();
  const Device device = query.device();
  // Note [Attention kernels decline]: the device's kernel first, where there
  // is no dropout and no mask gradient; the composed path otherwise.
  const bool mask_needs_grad = m.defined() && m.requires_grad() && autograd::GradMode::is_enabled();
  // float16 and bfloat16 on the CPU compute in float32 (recorded casts).
  bool widen = false;
  if (options.dropout_p == 0.0 && !mask_needs_grad &&
      internal::attention_forward.has(device.type())) {
    widen = query.is_cpu() && (dtype == kFloat16 || dtype == kBFloat16);
    q4 = (widen ? q4.to(kFloat32) : q4).contiguous();
    k4 = (widen ? k4.to(kFloat32) : k4).contiguous();
    v4 = (widen ? v4.to(kFloat32) : v4).contiguous();
    if (m.defined()) m = (widen && m.dtype() != kBool ? m.to(kFloat32) : m).detach();
    const internal::AttentionCall call{.q = q4.detach(),
                                       .k = k4.detach(),
                                       .v = v4.detach(),
                                       .mask = m,
                                       .causal = options.is_causal,
                                       .scale = scale};
    KernelResult result;
    bool ran;
    {
      autograd::NoGradGuard no_grad;
      ran = internal::attention_forward(device)(call, &result.out, &result.stats);
    }
    if (ran) {
      Tensor out = KernelAttention::apply(q4, k4, v4, result, m, options.is_causal, scale);
      return (widen ? out.to(dtype) : out).reshape(out_shape);
    }
    // Declined: the composed path below takes the same (contiguous) operands.
  }
  Tensor m4 = m.defined() ? m.reshape({batch, heads, L, S}) : m;
  Tensor p = ComposedProbabilities(q4, internal::RepeatHeads(k4, heads), m4, options.is_causal,
                                   scale);
  if (options.dropout_p > 0.0) p = dropout(p, options.dropout_p, true, options.generator);
  Tensor out = p.matmul(internal::RepeatHeads(v4, heads));
  return (widen ? out.to(dtype) : out).reshape(out_shape);
}

}  // namespace functional
}  // namespace ember::nn
