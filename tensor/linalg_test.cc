// Matrix products: mm, bmm, addmm, dot, matmul (1-D, 2-D, batched and
// broadcast), outer and the gemm_out kernel. Expected values come from a plain
// triple loop in double precision over the inputs' values.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"
#include "tensor/thread_pool.h"

namespace ember {
namespace {

using ::testing::HasSubstr;
using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;

// Row-major product of [b, n, k] and [b, k, m] value arrays.
std::vector<double> RefBmm(const std::vector<double>& a, const std::vector<double>& b,
                           int64_t batch, int64_t n, int64_t k, int64_t m) {
  std::vector<double> c(batch * n * m, 0.0);
  for (int64_t q = 0; q < batch; ++q)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a[(q * n + i) * k + p] * b[(q * k + p) * m + j];
        c[(q * n + i) * m + j] = s;
      }
  return c;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << i;
  }
}

// Small integers as `dtype` (exact in every dtype but bool).
Tensor SmallInts(IntArrayRef sizes, Dtype dtype) {
  return dtype == kUInt8 ? randint(0, 5, sizes).to(dtype) : randint(-4, 5, sizes).to(dtype);
}

TEST(LinalgTest, MmMatchesReferenceFloat) {
  manual_seed(10);
  for (Dtype dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor a = randn({37, 53}, dt), b = randn({53, 29}, dt);
    Tensor c = a.mm(b);
    EXPECT_EQ(c.dtype(), dt);
    EXPECT_EQ(c.sizes(), (IntArrayRef{37, 29}));
    std::vector<double> want = RefBmm(Values(a), Values(b), 1, 37, 53, 29);
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    ExpectNear(Values(c), want, tol);
    ExpectNear(Values(mm(a, b)), want, tol);
    ExpectNear(Values(a.matmul(b)), want, tol);
    // Transposed operands are passed to BLAS as they are.
    Tensor at = a.t().contiguous().t(), bt = b.t().contiguous().t();
    EXPECT_FALSE(at.is_contiguous());
    ExpectNear(Values(at.mm(b)), want, tol);
    ExpectNear(Values(a.mm(bt)), want, tol);
    ExpectNear(Values(at.mm(bt)), want, tol);
    // Row slices of a wider matrix (leading dimension > cols), and stepped
    // columns that need a copy.
    Tensor wide = randn({37, 80}, dt);
    Tensor sub = wide.narrow(1, 5, 53);
    ExpectNear(Values(sub.mm(b)), RefBmm(Values(sub), Values(b), 1, 37, 53, 29), tol);
    Tensor stepped = randn({37, 106}, dt).slice(1, 0, std::nullopt, 2);
    ExpectNear(Values(stepped.mm(b)), RefBmm(Values(stepped), Values(b), 1, 37, 53, 29), tol);
    // Expanded (stride 0) operand.
    Tensor row = randn({1, 53}, dt).expand({37, 53});
    ExpectNear(Values(row.mm(b)), RefBmm(Values(row), Values(b), 1, 37, 53, 29), tol);
    // Vectors as matrices: n = 1 and m = 1.
    Tensor v = randn({1, 53}, dt);
    ExpectNear(Values(v.mm(b)), RefBmm(Values(v), Values(b), 1, 1, 53, 29), tol);
    Tensor w = randn({53, 1}, dt);
    ExpectNear(Values(a.mm(w)), RefBmm(Values(a), Values(w), 1, 37, 53, 1), tol);
  }
}

TEST(LinalgTest, MmEveryDtype) {
  manual_seed(11);
  for (Dtype dt : kAllDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    if (dt == kBool) {
      Tensor t = ones({2, 2}, kBool);
      EXPECT_THAT(ErrorOf([&] { t.mm(t); }), HasSubstr("not implemented for bool"));
      continue;
    }
    Tensor a = SmallInts({5, 6}, dt), b = SmallInts({6, 4}, dt);
    Tensor c = a.mm(b);
    EXPECT_EQ(c.dtype(), dt);
    // Products of small integers are exact in every dtype (|c| <= 6 * 16;
    // int8 results fit too).
    EXPECT_EQ(Values(c), RefBmm(Values(a), Values(b), 1, 5, 6, 4));
    Tensor ta = a.t().contiguous().t();  // Column-major.
    EXPECT_EQ(Values(ta.mm(b.t().contiguous().t())), RefBmm(Values(a), Values(b), 1, 5, 6, 4));
    Tensor x = SmallInts({6}, dt), y = SmallInts({6}, dt);
    std::vector<double> xv = Values(x), yv = Values(y);
    double d = 0;
    for (int i = 0; i < 6; ++i) d += xv[i] * yv[i];
    Tensor r = x.dot(y);
    EXPECT_EQ(r.dim(), 0);
    EXPECT_EQ(r.dtype(), dt);
    EXPECT_EQ(Values(r)[0], d);
    Tensor ba = SmallInts({3, 2, 5}, dt), bb = SmallInts({3, 5, 4}, dt);
    EXPECT_EQ(Values(ba.bmm(bb)), RefBmm(Values(ba), Values(bb), 3, 2, 5, 4));
  }
  // Integer products wrap as int64 arithmetic does.
  Tensor big = full({1, 1}, int64_t{1} << 62);
  Tensor four = full({1, 1}, 4);
  EXPECT_EQ(big.mm(four).item<int64_t>(), 0);
  Tensor i8 = full({1, 3}, 100, kInt8), i8b = full({3, 1}, 1, kInt8);
  EXPECT_EQ(i8.mm(i8b).item<int64_t>(), static_cast<int8_t>(300));
  // float16 accumulates in float: 3000 ones sum exactly.
  Tensor h = ones({1, 3000}, kFloat16), hb = ones({3000, 1}, kFloat16);
  EXPECT_EQ(h.mm(hb).item<double>(), 3000.0);
}

TEST(LinalgTest, MmErrors) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  EXPECT_THAT(ErrorOf([&] { a.mm(b); }),
              HasSubstr("mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"));
  EXPECT_THAT(ErrorOf([&] { a.mm(zeros({3})); }),
              HasSubstr("mm: expected mat2 to be a 2-D tensor"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 3, 1}).mm(a); }), HasSubstr("expected mat1 to be a 2-D"));
  EXPECT_THAT(ErrorOf([&] { a.mm(zeros({3, 2}, kFloat64)); }),
              HasSubstr("expected both matrices to have the same dtype, but found float32 and "
                        "float64"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 3, 4}).bmm(zeros({3, 4, 5})); }),
              HasSubstr("same batch size"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 3, 4}).bmm(zeros({2, 5, 5})); }),
              HasSubstr("cannot be multiplied (3x4 and 5x5"));
  EXPECT_THAT(ErrorOf([&] { a.bmm(a); }), HasSubstr("bmm: expected batch1 to be a 3-D tensor"));
  EXPECT_THAT(ErrorOf([&] { zeros({3}).dot(zeros({3}, kInt64)); }),
              HasSubstr("dot: expected both vectors to have same dtype, but found float32 and "
                        "int64"));
  EXPECT_THAT(ErrorOf([&] { zeros({3}).dot(zeros({4})); }), HasSubstr("inconsistent tensor size"));
  EXPECT_THAT(ErrorOf([&] { a.dot(a); }), HasSubstr("1D tensors expected, but got 2D and 2D"));
  EXPECT_THAT(ErrorOf([&] { ones({2}, kBool).dot(ones({2}, kBool)); }), HasSubstr("bool"));
  EXPECT_THAT(ErrorOf([&] { zeros({3}).matmul(zeros({4})); }), HasSubstr("inconsistent"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 3}).matmul(zeros({4})); }),
              HasSubstr("cannot be multiplied"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 2, 3}).matmul(zeros({2, 4, 5})); }),
              HasSubstr("cannot be multiplied"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 2, 3}).matmul(zeros({3, 3, 5})); }),
              HasSubstr("broadcastable"));
}

TEST(LinalgTest, BmmAndBatchedMatmulBroadcasting) {
  manual_seed(12);
  Tensor a = randn({4, 3, 5}), b = randn({4, 5, 2});
  std::vector<double> av = Values(a), bv = Values(b);
  ExpectNear(Values(a.bmm(b)), RefBmm(av, bv, 4, 3, 5, 2), 1e-5);
  ExpectNear(Values(bmm(a, b)), RefBmm(av, bv, 4, 3, 5, 2), 1e-5);
  ExpectNear(Values(a.matmul(b)), RefBmm(av, bv, 4, 3, 5, 2), 1e-5);
  // Transposed batches.
  Tensor at = a.transpose(1, 2).contiguous().transpose(1, 2);
  ExpectNear(Values(at.bmm(b)), RefBmm(av, bv, 4, 3, 5, 2), 1e-5);
  Tensor perm = a.permute({1, 0, 2}).contiguous().permute({1, 0, 2});  // Batch stride 5.
  ExpectNear(Values(perm.bmm(b)), RefBmm(av, bv, 4, 3, 5, 2), 1e-5);
  // A shared right operand (batch stride 0, folded into one call).
  Tensor w = randn({5, 2});
  std::vector<double> wv = Values(w), wrep;
  for (int i = 0; i < 4; ++i) wrep.insert(wrep.end(), wv.begin(), wv.end());
  ExpectNear(Values(a.bmm(w.unsqueeze(0).expand({4, 5, 2}))), RefBmm(av, wrep, 4, 3, 5, 2), 1e-5);
  Tensor am = a.matmul(w);  // [4, 3, 5] @ [5, 2]
  EXPECT_EQ(am.sizes(), (IntArrayRef{4, 3, 2}));
  ExpectNear(Values(am), RefBmm(av, wrep, 4, 3, 5, 2), 1e-5);
  // ... also when the rows are not evenly spaced (a sliced batch).
  Tensor sliced = randn({4, 4, 5}).narrow(1, 0, 3);
  ExpectNear(Values(sliced.matmul(w)), RefBmm(Values(sliced), wrep, 4, 3, 5, 2), 1e-5);
  // [2, 5] @ [4, 5, 3]: the left operand is shared.
  Tensor l = randn({2, 5}), r = randn({4, 5, 3});
  std::vector<double> lv = Values(l), lrep;
  for (int i = 0; i < 4; ++i) lrep.insert(lrep.end(), lv.begin(), lv.end());
  Tensor lr = l.matmul(r);
  EXPECT_EQ(lr.sizes(), (IntArrayRef{4, 2, 3}));
  ExpectNear(Values(lr), RefBmm(lrep, Values(r), 4, 2, 5, 3), 1e-5);
  // Broadcast batch dims: [2, 1, 3, 4] @ [5, 4, 2] -> [2, 5, 3, 2].
  Tensor p = randn({2, 1, 3, 4}), q = randn({5, 4, 2});
  Tensor pq = p.matmul(q);
  EXPECT_EQ(pq.sizes(), (IntArrayRef{2, 5, 3, 2}));
  std::vector<double> pv = Values(p), qv = Values(q), got = Values(pq);
  for (int64_t x = 0; x < 2; ++x)
    for (int64_t y = 0; y < 5; ++y)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 2; ++j) {
          double s = 0;
          for (int64_t t = 0; t < 4; ++t) s += pv[(x * 3 + i) * 4 + t] * qv[(y * 4 + t) * 2 + j];
          EXPECT_NEAR(got[((x * 5 + y) * 3 + i) * 2 + j], s, 1e-5);
        }
  // 1-D operands in batched products: [3, 4, 5] @ [5] and [4] @ [3, 4, 5].
  Tensor bat = randn({3, 4, 5}), vec5 = randn({5}), vec4 = randn({4});
  Tensor bv5 = bat.matmul(vec5);
  EXPECT_EQ(bv5.sizes(), (IntArrayRef{3, 4}));
  std::vector<double> batv = Values(bat), v5 = Values(vec5), v4 = Values(vec4);
  std::vector<double> v5rep, v4rep;
  for (int i = 0; i < 3; ++i) {
    v5rep.insert(v5rep.end(), v5.begin(), v5.end());
    v4rep.insert(v4rep.end(), v4.begin(), v4.end());
  }
  ExpectNear(Values(bv5), RefBmm(batv, v5rep, 3, 4, 5, 1), 1e-5);
  Tensor v4b = vec4.matmul(bat);
  EXPECT_EQ(v4b.sizes(), (IntArrayRef{3, 5}));
  ExpectNear(Values(v4b), RefBmm(v4rep, batv, 3, 1, 4, 5), 1e-5);
  // Empty batch.
  EXPECT_EQ(zeros({0, 3, 4}).bmm(zeros({0, 4, 2})).sizes(), (IntArrayRef{0, 3, 2}));
}

TEST(LinalgTest, MatmulOneAndTwoDims) {
  Tensor a = tensor({1.0f, 2.0f, 3.0f});
  Tensor b = tensor({4.0f, -5.0f, 6.0f});
  Tensor d = a.matmul(b);
  EXPECT_EQ(d.dim(), 0);
  EXPECT_EQ(d.item<float>(), 4 - 10 + 18);
  EXPECT_EQ(dot(a, b).item<float>(), 12);
  Tensor m = tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, SizeVector{2, 3});
  Tensor mv = m.matmul(a);  // [2, 3] @ [3]
  EXPECT_EQ(mv.sizes(), (IntArrayRef{2}));
  EXPECT_EQ(Values(mv), (std::vector<double>{14, 32}));
  Tensor vm = tensor({1.0f, -1.0f}).matmul(m);  // [2] @ [2, 3]
  EXPECT_EQ(vm.sizes(), (IntArrayRef{3}));
  EXPECT_EQ(Values(vm), (std::vector<double>{-3, -3, -3}));
  EXPECT_EQ(Values(matmul(m, m.t())), (std::vector<double>{14, 32, 32, 77}));
  // A strided vector.
  Tensor strided = tensor({1.0f, 9.0f, 2.0f, 9.0f, 3.0f, 9.0f}).slice(0, 0, std::nullopt, 2);
  EXPECT_EQ(strided.dot(b).item<float>(), 12);
  EXPECT_EQ(Values(m.matmul(strided)), (std::vector<double>{14, 32}));
  // Empty inner dimension: zeros; empty outer: an empty result.
  Tensor z = zeros({3, 0}).mm(zeros({0, 4}));
  EXPECT_EQ(z.sizes(), (IntArrayRef{3, 4}));
  EXPECT_EQ(Values(z), std::vector<double>(12, 0.0));
  EXPECT_EQ(Values(zeros({3, 0}, kInt32).mm(zeros({0, 2}, kInt32))), std::vector<double>(6, 0.0));
  EXPECT_EQ(zeros({0, 3}).mm(zeros({3, 4})).sizes(), (IntArrayRef{0, 4}));
  EXPECT_EQ(zeros({0}).dot(zeros({0})).item<float>(), 0.0f);
}

// A Linear's weight and bias gradients: out = a @ b and the column sums of b.
TEST(LinalgTest, GemmBiasGradOutIsTheProductAndTheColumnSums) {
  manual_seed(14);
  Tensor a = randn({4, 6}).t(), b = randn({4, 5});  // a: a transposed view, as input^T
  Tensor out = empty({6, 5}), bias_grad = empty({5});
  ops::gemm_bias_grad_out(out, bias_grad, a, b, /*of_a=*/false);
  ExpectNear(Values(out), RefBmm(Values(a.contiguous()), Values(b), 1, 6, 4, 5), 1e-5);
  const std::vector<double> bv = Values(b);
  std::vector<double> sums(5, 0.0);
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 5; ++j) sums[j] += bv[p * 5 + j];
  ExpectNear(Values(bias_grad), sums, 1e-5);
}

// A Linear and its activation: out = act(a @ b + bias), pre = a @ b + bias.
TEST(LinalgTest, GemmBiasActOutAppliesTheActivationAfterTheBias) {
  manual_seed(16);
  Tensor a = randn({5, 4}), b = randn({4, 3}), bias = randn({3});
  std::vector<double> z = RefBmm(Values(a), Values(b), 1, 5, 4, 3);
  const std::vector<double> bv = Values(bias);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) z[i * 3 + j] += bv[j];
  std::vector<double> relu(z.size()), gelu(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    relu[i] = z[i] > 0 ? z[i] : 0;
    const double u = std::sqrt(2 / M_PI) * (z[i] + 0.044715 * z[i] * z[i] * z[i]);
    gelu[i] = 0.5 * z[i] * (1 + std::tanh(u));
  }
  Tensor out = empty({5, 3}), pre = empty({5, 3});
  ops::gemm_bias_act_out(out, Tensor(), a, b, bias, static_cast<int64_t>(GemmActivation::kReLU));
  ExpectNear(Values(out), relu, 1e-5);
  ops::gemm_bias_act_out(out, pre, a, b, bias, static_cast<int64_t>(GemmActivation::kGeluTanh));
  ExpectNear(Values(out), gelu, 1e-5);
  ExpectNear(Values(pre), z, 1e-5);
  EXPECT_THROW(ops::gemm_bias_act_out(out, pre, a, b, bias, 7), Error);
}

// nn::Linear's weight and bias gradients: out = g^T @ x and the row sums of
// g^T (over k, the batch), the bias gradient.
TEST(LinalgTest, GemmBiasGradOutOfASumsTheRowsOfA) {
  manual_seed(15);
  Tensor g = randn({4, 6}), x = randn({4, 5});
  Tensor a = g.t();  // [6, 4], a transposed view
  Tensor out = empty({6, 5}), bias_grad = empty({6});
  ops::gemm_bias_grad_out(out, bias_grad, a, x, /*of_a=*/true);
  ExpectNear(Values(out), RefBmm(Values(a.contiguous()), Values(x), 1, 6, 4, 5), 1e-5);
  const std::vector<double> gv = Values(g);
  std::vector<double> sums(6, 0.0);
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 6; ++j) sums[j] += gv[p * 6 + j];
  ExpectNear(Values(bias_grad), sums, 1e-5);
}

TEST(LinalgTest, Addmm) {
  manual_seed(13);
  Tensor m1 = randn({4, 6}), m2 = randn({6, 5});
  std::vector<double> prod = RefBmm(Values(m1), Values(m2), 1, 4, 6, 5);
  Tensor bias = randn({5});  // Broadcast over the rows.
  std::vector<double> bv = Values(bias);
  Tensor r = addmm(bias, m1, m2, 0.5, 2.0);
  EXPECT_EQ(r.sizes(), (IntArrayRef{4, 5}));
  std::vector<double> want(20);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) want[i * 5 + j] = 0.5 * bv[j] + 2.0 * prod[i * 5 + j];
  ExpectNear(Values(r), want, 1e-5);
  // A full [4, 5] self, transposed storage.
  Tensor self = randn({5, 4}).t();
  std::vector<double> sv = Values(self);
  for (int i = 0; i < 20; ++i) want[i] = sv[i] + prod[i];
  ExpectNear(Values(addmm(self, m1, m2)), want, 1e-5);
  // beta = 0 ignores self, NaNs included.
  Tensor nan_self = full({4, 5}, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> got = Values(addmm(nan_self, m1, m2, 0, 1));
  ExpectNear(got, prod, 1e-5);
  // Integer addmm.
  Tensor i1 = tensor(std::vector<int64_t>{1, 2, 3, 4}, SizeVector{2, 2});
  Tensor ib = tensor({10, 20});
  EXPECT_EQ(Values(addmm(ib, i1, i1, 2, 3)),
            (std::vector<double>{20 + 3 * 7, 40 + 3 * 10, 20 + 3 * 15, 40 + 3 * 22}));
  EXPECT_EQ(Values(addmm(ib.to(kInt16), i1.to(kInt16), i1.to(kInt16), 0, 1)),
            (std::vector<double>{7, 10, 15, 22}));
  // float16.
  Tensor h = addmm(ib.to(kFloat16), i1.to(kFloat16), i1.to(kFloat16), 1, 1);
  EXPECT_EQ(h.dtype(), kFloat16);
  EXPECT_EQ(Values(h), (std::vector<double>{17, 30, 25, 42}));
  // Empty inner dimension: beta * self.
  EXPECT_EQ(Values(addmm(ib.to(kFloat32), zeros({2, 0}), zeros({0, 2}), 3, 1)),
            (std::vector<double>{30, 60, 30, 60}));
  EXPECT_THAT(ErrorOf([&] { addmm(ib, i1, i1, 0.5, 1); }), HasSubstr("must be integers"));
  EXPECT_THAT(ErrorOf([&] { addmm(zeros({3}), m1, m2); }), HasSubstr("not broadcastable"));
  EXPECT_THAT(ErrorOf([&] { addmm(zeros({2, 4, 5}), m1, m2); }),
              HasSubstr("addmm: self of shape [2, 4, 5] cannot be broadcast to the result shape "
                        "[4, 5]"));
  EXPECT_THAT(ErrorOf([&] { addmm(zeros({5}, kFloat64), m1, m2); }),
              HasSubstr("float64 and float32"));
  EXPECT_THAT(ErrorOf([&] { addmm(bias, m1, m1); }),
              HasSubstr("addmm: mat1 and mat2 shapes cannot be multiplied (4x6 and 4x6)"));
}

TEST(LinalgTest, GemmOutIntoStridedOutputs) {
  manual_seed(14);
  Tensor a = randn({2, 3, 4}), b = randn({2, 4, 5});
  std::vector<double> want = RefBmm(Values(a), Values(b), 2, 3, 4, 5);
  // Column-major output (a transposed view): BLAS writes it directly.
  Tensor buf = zeros({2, 5, 3});
  Tensor out = buf.transpose(1, 2);
  ops::gemm_out(out, a, b, 0, 1);
  ExpectNear(Values(out), want, 1e-5);
  // An output with a stepped inner dim goes through a temporary; beta keeps
  // its old values.
  Tensor buf2 = ones({2, 3, 10});
  Tensor out2 = buf2.slice(2, 0, std::nullopt, 2);
  ops::gemm_out(out2, a, b, 2, 1);
  std::vector<double> want2 = want;
  for (double& v : want2) v += 2;
  ExpectNear(Values(out2), want2, 1e-5);
  std::vector<double> all = Values(buf2);
  for (int64_t i = 1; i < 60; i += 2) EXPECT_EQ(all[i], 1.0);  // Untouched gaps.
  // Integer kernel with strided output.
  Tensor ia = SmallInts({2, 3, 4}, kInt32), ib = SmallInts({2, 4, 5}, kInt32);
  Tensor ibuf = zeros({2, 5, 3}, kInt32);
  ops::gemm_out(ibuf.transpose(1, 2), ia, ib, 0, 1);
  EXPECT_EQ(Values(ibuf.transpose(1, 2)), RefBmm(Values(ia), Values(ib), 2, 3, 4, 5));
}

// Products large enough to split over the intra-op pool (Note [BLAS on the
// team]): by rows when C is tall, by columns when it is wide, each with
// transposed operands, a column-major output and beta != 0, on sizes that
// leave a partial block at the end.
TEST(LinalgTest, LargeProductsSplitOverThreads) {
  manual_seed(15);
  const int threads = get_num_threads();
  set_num_threads(3);
  struct Case {
    int64_t n, m, k;
  };
  for (Case cs : {Case{301, 40, 400}, Case{40, 301, 400}}) {
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(::testing::Message()
                   << cs.n << "x" << cs.k << " @ " << cs.k << "x" << cs.m << " " << dtype_name(dt));
      Tensor a = randn({cs.n, cs.k}, dt), b = randn({cs.k, cs.m}, dt);
      const std::vector<double> want = RefBmm(Values(a), Values(b), 1, cs.n, cs.k, cs.m);
      const double tol = dt == kFloat32 ? 1e-4 : 1e-12;
      Tensor at = a.t().contiguous().t(), bt = b.t().contiguous().t();
      for (const Tensor& x : {a, at}) {
        for (const Tensor& y : {b, bt}) {
          ExpectNear(Values(x.mm(y)), want, tol);
          // Column-major C, accumulated onto ones.
          Tensor out = ones({cs.m, cs.n}, dt).t();
          ops::gemm_out(out.unsqueeze(0), x.unsqueeze(0), y.unsqueeze(0), 1, 1);
          std::vector<double> plus_one = want;
          for (double& v : plus_one) v += 1;
          ExpectNear(Values(out), plus_one, tol);
        }
      }
    }
  }
  set_num_threads(threads);
}

// outer is unsqueeze + mul (an elementwise op).
TEST(LinalgTest, Outer) {
  Tensor a = tensor({1.0f, 2.0f}), b = tensor({3.0f, 4.0f, 5.0f});
  Tensor o = a.outer(b);
  EXPECT_EQ(o.sizes(), (IntArrayRef{2, 3}));
  EXPECT_EQ(Values(o), (std::vector<double>{3, 4, 5, 6, 8, 10}));
  EXPECT_EQ(Values(outer(tensor({2, 3}), tensor({4}))), (std::vector<double>{8, 12}));
  EXPECT_THAT(ErrorOf([&] { o.outer(a); }), HasSubstr("outer: expected 1-D tensors"));
}

}  // namespace
}  // namespace ember
