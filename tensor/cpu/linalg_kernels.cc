// CPU kernel of gemm_out: out[b] = beta * out[b] + alpha * (a[b] @ b[b]) for
// out [B, n, m], a [B, n, k], b [B, k, m] (a batch stride may be 0).
//
// float32 / float64 go to OpenBLAS (cblas_sgemm / cblas_dgemm). Operands whose
// matrices are row- or column-major with a usable leading dimension (a
// transposed view, a slice of rows) are passed as they are, with the
// transpose flag and leading dimension describing them; others are copied to
// contiguous first. A batch whose second operand is shared (batch stride 0,
// as in a [B, n, k] @ [k, m] matmul) and whose first operand and output rows
// are evenly spaced is folded into one (B*n) x k @ k x m call. Each OpenBLAS
// call runs on one thread; large products are split over the intra-op pool
// (Note [BLAS on the team]).
// float16 / bfloat16 are computed in float32 through sgemm (as torch
// accumulates them in float) and rounded once at the end. Integer dtypes use a
// plain row-by-row loop accumulating in 64 bits (wrapping as int64 does).
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <type_traits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/ops.h"

namespace ember::cpu {
namespace {

using Layout = BlasMatrixLayout;

bool FitsBlasInt(int64_t v) { return v <= INT_MAX; }

// Note [BLAS on the team]
// Debian's OpenBLAS is the pthread build: with several threads it keeps a
// pool of its own, whose workers spin (sched_yield) for up to 2^28 cycles
// after every call (OPENBLAS_THREAD_TIMEOUT), on the cores the OpenMP team
// running every other op needs next (Note [One team for every op] in
// tensor/thread_pool.cc): a 2-thread training step that calls BLAS once
// runs the rest of its ops against that spin. So OpenBLAS runs on the
// calling thread (the intra-op pool sets it to one thread when it starts; a
// program that sets more itself gets one call on them), and a product of at
// least kGemmGrain multiply-adds per chunk is split into blocks of rows or
// columns of C (whichever C has more of) over parallel_for, one
// single-threaded call per block. The blocks are multiples of kGemmBlock
// rows or columns, so each call keeps whole vector tiles.
constexpr int64_t kGemmGrain = int64_t{1} << 21;
constexpr int64_t kGemmBlock = 16;

template <typename T>
void BlasCall(bool a_row_major, bool b_row_major, int64_t n, int64_t m, int64_t k, T alpha,
              const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = a_row_major ? CblasNoTrans : CblasTrans;
  const CBLAS_TRANSPOSE tb = b_row_major ? CblasNoTrans : CblasTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

template <typename T>
void BlasGemm(bool row_major_c, bool a_row_major, bool b_row_major, int64_t n, int64_t m, int64_t k,
              T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
              int64_t ldc) {
  EMBER_CHECK(FitsBlasInt(n) && FitsBlasInt(m) && FitsBlasInt(k) && FitsBlasInt(lda) &&
                  FitsBlasInt(ldb) && FitsBlasInt(ldc),
              "gemm: matrix dimensions (", n, "x", k, " @ ", k, "x", m,
              ") exceed what OpenBLAS can index");
  if (!row_major_c) {
    // A column-major C is the row-major C^T = B^T A^T; a transposed
    // operand's layout flips.
    BlasGemm<T>(true, !b_row_major, !a_row_major, m, n, k, alpha, b, ldb, a, lda, beta, c, ldc);
    return;
  }
  // One call on one thread, or on OpenBLAS's own threads where a program set
  // them (openblas_set_num_threads). get_num_threads() comes first: the
  // pool's start sets OpenBLAS to one thread.
  if (get_num_threads() == 1 || openblas_get_num_threads() > 1) {
    BlasCall<T>(a_row_major, b_row_major, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool by_rows = n >= m;
  const int64_t extent = by_rows ? n : m, other = by_rows ? m : n;
  const int64_t blocks = (extent + kGemmBlock - 1) / kGemmBlock;
  const int64_t per_block = kGemmBlock * other * k;
  const int64_t grain = (kGemmGrain + per_block - 1) / per_block;
  parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kGemmBlock, end = std::min(extent, last * kGemmBlock);
    if (by_rows) {
      // Rows [begin, end) of C take the same rows of A.
      const T* a_rows = a_row_major ? a + begin * lda : a + begin;
      BlasCall<T>(a_row_major, b_row_major, end - begin, m, k, alpha, a_rows, lda, b, ldb, beta,
                  c + begin * ldc, ldc);
    } else {
      // Columns [begin, end) of C take the same columns of B.
      const T* b_cols = b_row_major ? b + begin : b + begin * ldb;
      BlasCall<T>(a_row_major, b_row_major, n, end - begin, k, alpha, a, lda, b_cols, ldb, beta,
                  c + begin, ldc);
    }
  });
}

// out = beta * out (beta == 0 writes zeros, ignoring NaNs in out).
void ScaleOut(const Tensor& out, const Scalar& beta) {
  if (beta.to_double() == 0.0) {
    ops::fill_out(out, 0);
    return;
  }
  VisitDtype(out.dtype(), [&]<typename T>() {
    using A = OpMath<T>;
    const A s = beta.to<A>();
    Map<T, T>(out, {out}, [s](T v) { return CastTo<T>(static_cast<A>(v) * s); });
  });
}

template <typename T>
void GemmBlas(const Tensor& out_in, const Tensor& a_in, const Tensor& b_in, const Scalar& beta_s,
              const Scalar& alpha_s) {
  const int64_t batch = out_in.sizes()[0], n = out_in.sizes()[1], m = out_in.sizes()[2];
  const int64_t k = a_in.sizes()[2];
  const T beta = beta_s.to<T>(), alpha = alpha_s.to<T>();
  const BlasOperand a_op = AsBlasOperand(a_in, n, k), b_op = AsBlasOperand(b_in, k, m);
  const Tensor& a = a_op.tensor;
  const Tensor& b = b_op.tensor;
  const std::optional<Layout> la = a_op.layout, lb = b_op.layout;
  Tensor out = out_in;
  std::optional<Layout> lc = GetBlasMatrixLayout(n, m, out.strides()[1], out.strides()[2]);
  // An output BLAS cannot write (or whose elements overlap) goes through a
  // contiguous temporary.
  const bool temp_out = !lc.has_value();
  if (temp_out) {
    out = beta != T(0) ? out_in.contiguous() : EmptyTensor(out_in.sizes(), out_in.dtype(), kCPU);
    lc = GetBlasMatrixLayout(n, m, out.strides()[1], out.strides()[2]);
  }
  EMBER_INTERNAL_ASSERT(la && lb && lc, "gemm: no BLAS layout after making operands contiguous");
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());
  const int64_t sa = a.strides()[0], sb = b.strides()[0], sc = out.strides()[0];
  // Fold a shared second operand's batch into the rows (see the file comment).
  const bool fold = batch > 1 && sb == 0 && la->row_major && lc->row_major &&
                    (n == 1 || (sa == n * la->ld && sc == n * lc->ld)) && sa > 0 && sc > 0;
  if (fold) {
    const int64_t rows = batch * n;
    const int64_t lda = n == 1 ? sa : la->ld, ldc = n == 1 ? sc : lc->ld;
    if (lda >= std::max<int64_t>(k, 1) && ldc >= std::max<int64_t>(m, 1)) {
      BlasGemm<T>(true, true, lb->row_major, rows, m, k, alpha, pa, lda, pb, lb->ld, beta, pc, ldc);
      if (temp_out) ops::copy_out(out_in, out);
      return;
    }
  }
  for (int64_t i = 0; i < batch; ++i) {
    BlasGemm<T>(lc->row_major, la->row_major, lb->row_major, n, m, k, alpha, pa + i * sa, la->ld,
                pb + i * sb, lb->ld, beta, pc + i * sc, lc->ld);
  }
  if (temp_out) ops::copy_out(out_in, out);
}

// 16-bit floats: convert to float32, sgemm, round once.
void GemmViaFloat(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& beta,
                  const Scalar& alpha) {
  auto to_float = [](const Tensor& t) {
    Tensor f = EmptyTensor(t.sizes(), kFloat32, kCPU);
    ops::copy_out(f, t);
    return f;
  };
  Tensor out32 = beta.to_double() != 0.0 ? to_float(out) : EmptyTensor(out.sizes(), kFloat32, kCPU);
  GemmBlas<float>(out32, to_float(a), to_float(b), beta, alpha);
  ops::copy_out(out, out32);
}

// Integer dtypes: out row i = beta * out row i + alpha * sum_p a[i, p] * b[p, :],
// in uint64 (two's complement wrap-around, as int64 overflows).
template <typename T>
void GemmLoop(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& beta_s,
              const Scalar& alpha_s) {
  using A = uint64_t;
  const int64_t batch = out.sizes()[0], n = out.sizes()[1], m = out.sizes()[2];
  const int64_t k = a.sizes()[2];
  const A beta = static_cast<A>(beta_s.to<int64_t>());
  const A alpha = static_cast<A>(alpha_s.to<int64_t>());
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());
  const int64_t sa0 = a.strides()[0], sa1 = a.strides()[1], sa2 = a.strides()[2];
  const int64_t sb0 = b.strides()[0], sb1 = b.strides()[1], sb2 = b.strides()[2];
  const int64_t sc0 = out.strides()[0], sc1 = out.strides()[1], sc2 = out.strides()[2];
  const int64_t grain = std::max<int64_t>(1, kDefaultGrainSize / std::max<int64_t>(1, k * m));
  parallel_for(0, batch * n, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> acc(m);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t bi = row / n, i = row % n;
      std::fill(acc.begin(), acc.end(), A(0));
      const T* arow = pa + bi * sa0 + i * sa1;
      for (int64_t p = 0; p < k; ++p) {
        const A av = static_cast<A>(static_cast<int64_t>(arow[p * sa2]));
        const T* brow = pb + bi * sb0 + p * sb1;
        if (sb2 == 1) {
          for (int64_t j = 0; j < m; ++j) {
            acc[j] += av * static_cast<A>(static_cast<int64_t>(brow[j]));
          }
        } else {
          for (int64_t j = 0; j < m; ++j) {
            acc[j] += av * static_cast<A>(static_cast<int64_t>(brow[j * sb2]));
          }
        }
      }
      T* crow = pc + bi * sc0 + i * sc1;
      for (int64_t j = 0; j < m; ++j) {
        A r = alpha * acc[j];
        if (beta != 0) r += beta * static_cast<A>(static_cast<int64_t>(crow[j * sc2]));
        crow[j * sc2] = static_cast<T>(static_cast<int64_t>(r));
      }
    }
  });
}

void GemmOut(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& beta,
             const Scalar& alpha) {
  EMBER_INTERNAL_ASSERT(out.dim() == 3 && a.dim() == 3 && b.dim() == 3,
                        "gemm_out: expects 3-D out, a and b");
  if (out.numel() == 0) return;
  if (a.sizes()[2] == 0) {  // Empty inner dimension: the product is zero.
    ScaleOut(out, beta);
    return;
  }
  switch (out.dtype()) {
    case kFloat32:
      GemmBlas<float>(out, a, b, beta, alpha);
      return;
    case kFloat64:
      GemmBlas<double>(out, a, b, beta, alpha);
      return;
    case kFloat16:
    case kBFloat16:
      GemmViaFloat(out, a, b, beta, alpha);
      return;
    case kBool:
      EMBER_FAIL("gemm: not implemented for bool tensors");
    default:
      VisitDtype(out.dtype(), [&]<typename T>() {
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          GemmLoop<T>(out, a, b, beta, alpha);
        }
      });
  }
}

EMBER_REGISTER_KERNEL(gemm_out, kCPU, &GemmOut);

}  // namespace
}  // namespace ember::cpu
