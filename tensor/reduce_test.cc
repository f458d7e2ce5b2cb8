// Reductions: sum, prod, mean, amax/amin, max(dim)/min(dim), argmax/argmin,
// var/std/norm, softmax and log_softmax. Expected values are hand-computed or
// come from plain double-precision loops over the inputs read through their
// sizes and strides.
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
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

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::HasSubstr;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

double Item(const Tensor& t) { return Values(t).at(0); }

// Reference reduction of a row-major [rows, cols] matrix of doubles.
std::vector<double> RefSumRows(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> out(rows, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i] += v[i * cols + j];
  return out;
}
std::vector<double> RefSumCols(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> out(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j] += v[i * cols + j];
  return out;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                double atol = 0.0) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << "at " << i;
  }
}

TEST(ReduceTest, SumFloat32MatchesDoubleReference) {
  manual_seed(1);
  Tensor x = randn({123, 457});
  std::vector<double> v = Values(x);
  double total = std::accumulate(v.begin(), v.end(), 0.0);
  Tensor s = x.sum();
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.dtype(), kFloat32);
  EXPECT_NEAR(Item(s), total, 1e-5 * 123 * 457);
  ExpectNear(Values(x.sum({1})), RefSumRows(v, 123, 457), 1e-5, 1e-4);
  ExpectNear(Values(x.sum({0})), RefSumCols(v, 123, 457), 1e-5, 1e-4);
  ExpectNear(Values(x.sum({-1})), RefSumRows(v, 123, 457), 1e-5, 1e-4);
  ExpectNear(Values(x.sum({-2, 1})), {total}, 1e-5, 1e-3);
  // Transposed: the same sums, with inner and outer roles swapped.
  ExpectNear(Values(x.t().sum({0})), RefSumRows(v, 123, 457), 1e-5, 1e-4);
  ExpectNear(Values(x.t().sum({1})), RefSumCols(v, 123, 457), 1e-5, 1e-4);
}

TEST(ReduceTest, LargeSumIsAccurateAndDeterministic) {
  // Over 4 blocks of the parallel path, with a ragged tail; all values
  // positive so that the relative error is meaningful.
  manual_seed(2);
  const int64_t n = 3 * 65536 * 4 + 12345;
  Tensor x = rand({n});
  std::vector<double> v = Values(x);
  double total = std::accumulate(v.begin(), v.end(), 0.0);
  Tensor s = x.sum();
  EXPECT_NEAR(Item(s), total, 2e-6 * total);
  float bits = s.item<float>();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(x.sum().item<float>(), bits);
  // The chunking does not depend on the number of threads.
  int threads = get_num_threads();
  set_num_threads(1);
  EXPECT_EQ(x.sum().item<float>(), bits);
  set_num_threads(3);
  EXPECT_EQ(x.sum().item<float>(), bits);
  set_num_threads(threads);
  // Mean and a few long rows (the few-outputs path).
  EXPECT_NEAR(x.mean().item<double>(), total / n, 2e-6);
  Tensor rows = rand({2, 400000});
  std::vector<double> want = RefSumRows(Values(rows), 2, 400000);
  ExpectNear(Values(rows.sum({1})), want, 2e-6);
  // Long outer reductions (column chunks) and long strided runs.
  Tensor tall = rand({200000, 3});
  std::vector<double> tv = Values(tall);
  ExpectNear(Values(tall.sum({0})), RefSumCols(tv, 200000, 3), 2e-6);
  ExpectNear(Values(tall.t().sum({1})), RefSumCols(tv, 200000, 3), 2e-6);
  Tensor column = tall.select(1, 2);  // Stride 3.
  ExpectNear({Item(column.sum())}, {RefSumCols(tv, 200000, 3)[2]}, 2e-6);
  // A long sum of float16 still accumulates in float.
  Tensor ones16 = ones({100000}, kFloat16);
  EXPECT_EQ(ones16.sum().dtype(), kFloat16);
  EXPECT_EQ(Item(ones16.to(kFloat32).sum()), 100000.0);
  EXPECT_EQ(Item(ones({4000}, kFloat16).sum()), 4000.0);
  EXPECT_EQ(Item(ones({3000}, kBFloat16).mean()), 1.0);
}

TEST(ReduceTest, SumAndProdEveryDtype) {
  std::vector<double> vals = {1, 2, 3, 0, 4, 5};
  for (Dtype dt : kAllDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor x = Make(vals, {2, 3}, dt);
    const bool fp = is_floating_point(dt);
    Dtype want = fp ? dt : kInt64;
    Tensor s = x.sum();
    EXPECT_EQ(s.dtype(), want);
    EXPECT_EQ(Item(s), dt == kBool ? 5 : 15);
    Tensor s1 = x.sum({1});
    EXPECT_EQ(s1.dtype(), want);
    EXPECT_EQ(Values(s1), (dt == kBool ? std::vector<double>{3, 2} : std::vector<double>{6, 9}));
    EXPECT_EQ(Values(x.sum({0}, true)),
              (dt == kBool ? std::vector<double>{1, 2, 2} : std::vector<double>{1, 6, 8}));
    Tensor p = x.prod(1);
    EXPECT_EQ(p.dtype(), want);
    EXPECT_EQ(Values(p), (dt == kBool ? std::vector<double>{1, 0} : std::vector<double>{6, 0}));
    EXPECT_EQ(Item(x.narrow(1, 0, 2).prod()), dt == kBool ? 0 : 0);
    EXPECT_EQ(Item(Make({1, 2, 3, 4}, {4}, dt).prod()), dt == kBool ? 1 : 24);
    // Contiguous inner runs of every dtype (the lanes of the vector loop).
    Tensor big = Make(std::vector<double>(1000, 1.0), {1000}, dt);
    EXPECT_EQ(Item(big.sum()), 1000);
    if (fp) {
      Tensor m = x.mean({1});
      EXPECT_EQ(m.dtype(), dt);
      EXPECT_EQ(Values(m), (std::vector<double>{2, 3}));
    } else {
      EXPECT_THAT(ErrorOf([&] { x.mean(); }),
                  HasSubstr("mean(): could not infer the output dtype"));
      EXPECT_THAT(ErrorOf([&] { x.mean(); }), HasSubstr(std::string(dtype_name(dt))));
    }
  }
  // int64 sums wrap as in torch; uint8 sums do not overflow (int64 result).
  EXPECT_EQ(Item(full({300}, 255, kUInt8).sum()), 300 * 255);
  EXPECT_EQ(Item(full({200}, -128, kInt8).sum()), -25600);
  Tensor big = tensor({std::numeric_limits<int64_t>::max(), int64_t{1}});
  EXPECT_EQ(big.sum().item<int64_t>(), std::numeric_limits<int64_t>::min());
}

TEST(ReduceTest, DtypeArgumentConvertsTheInput) {
  Tensor x = tensor({1.5f, 2.25f, 3.0f});
  Tensor d = x.sum(/*dims=*/{}, false, kFloat64);
  EXPECT_EQ(d.dtype(), kFloat64);
  EXPECT_EQ(Item(d), 6.75);
  Tensor i = tensor({1, 2, 3});
  Tensor f = i.sum({}, false, kFloat32);
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(Item(f), 6);
  // As torch: the input is converted first, so 1.5 -> 1 in int32.
  Tensor t = x.sum({}, false, kInt32);
  EXPECT_EQ(t.dtype(), kInt32);
  EXPECT_EQ(Item(t), 6);
  Tensor m = ops::reduce(ReduceOp::kMean, i, {}, false, kFloat64);
  EXPECT_EQ(m.dtype(), kFloat64);
  EXPECT_EQ(Item(m), 2);
  EXPECT_THAT(ErrorOf([&] { ops::reduce(ReduceOp::kMean, x, {}, false, kInt64); }),
              HasSubstr("int64"));
}

TEST(ReduceTest, KeepdimNegativeAndRepeatedDims) {
  Tensor x = arange(24).view({2, 3, 4});
  Tensor s = x.sum({0, 2}, true);
  EXPECT_EQ(s.sizes(), (IntArrayRef{1, 3, 1}));
  // Plane j holds 4j..4j+3 and 12+4j..12+4j+3.
  EXPECT_EQ(Values(s), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(x.sum({-1, -3}).sizes(), (IntArrayRef{3}));
  EXPECT_EQ(Values(x.sum({-1, -3})), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(x.sum({1}, true).sizes(), (IntArrayRef{2, 1, 4}));
  EXPECT_EQ(Values(x.sum({1})), (std::vector<double>{12, 15, 18, 21, 48, 51, 54, 57}));
  EXPECT_EQ(x.sum({}, true).sizes(), (IntArrayRef{1, 1, 1}));
  EXPECT_EQ(x.amax({1}, true).sizes(), (IntArrayRef{2, 1, 4}));
  EXPECT_THAT(ErrorOf([&] { x.sum({1, -2}); }), HasSubstr("appears multiple times"));
  EXPECT_THAT(ErrorOf([&] { x.sum({3}); }), HasSubstr("dimension out of range"));
  EXPECT_THAT(ErrorOf([&] { x.amax({0, 0}); }), HasSubstr("appears multiple times"));
}

TEST(ReduceTest, NonContiguousInputs) {
  Tensor base = arange(60).view({3, 4, 5}).to(kFloat32);
  std::vector<double> v = Values(base);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return v[i * 20 + j * 5 + k]; };
  // Permuted: [5, 3, 4] view with no contiguous dim at the end.
  Tensor p = base.permute({2, 0, 1});
  std::vector<double> want(5, 0.0);
  for (int64_t k = 0; k < 5; ++k)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) want[k] += at(i, j, k);
  EXPECT_EQ(Values(p.sum({1, 2})), want);
  // Stepped slice: columns 0, 2, 4 of each [4, 5] plane.
  Tensor st = base.slice(2, 0, std::nullopt, 2);
  std::vector<double> want2(12, 0.0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) want2[i * 4 + j] = at(i, j, 0) + at(i, j, 2) + at(i, j, 4);
  EXPECT_EQ(Values(st.sum({2})), want2);
  EXPECT_EQ(Item(st.sum()), std::accumulate(want2.begin(), want2.end(), 0.0));
  std::vector<double> want3(3, 0.0);  // amax over the slice's dims 1 and 2.
  for (int64_t i = 0; i < 3; ++i) want3[i] = at(i, 3, 4);
  EXPECT_EQ(Values(st.amax({1, 2})), want3);
  // Expanded (stride 0): summing a broadcast dim multiplies.
  Tensor col = tensor({1.0f, 2.0f, 3.0f}).view({3, 1}).expand({3, 1000});
  EXPECT_EQ(Values(col.sum({1})), (std::vector<double>{1000, 2000, 3000}));
  EXPECT_EQ(Values(col.sum({0})), std::vector<double>(1000, 6.0));
  EXPECT_EQ(Item(col.sum()), 6000);
  EXPECT_EQ(Values(col.prod(0)), std::vector<double>(1000, 6.0));
  // Outer reduction over a large strided matrix (the column-chunk path),
  // including a middle reduced dim.
  manual_seed(3);
  Tensor m = randn({300, 700});
  std::vector<double> mv = Values(m);
  ExpectNear(Values(m.sum({0})), RefSumCols(mv, 300, 700), 1e-5, 1e-4);
  Tensor m3 = m.view({30, 10, 700});
  std::vector<double> want4(30 * 700, 0.0);
  for (int64_t a = 0; a < 30; ++a)
    for (int64_t b = 0; b < 10; ++b)
      for (int64_t c = 0; c < 700; ++c) want4[a * 700 + c] += mv[(a * 10 + b) * 700 + c];
  ExpectNear(Values(m3.sum({1})), want4, 1e-5, 1e-5);
  std::vector<double> colmax(700, -1e300);
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 700; ++j) colmax[j] = std::max(colmax[j], mv[i * 700 + j]);
  EXPECT_EQ(Values(m.amax({0})), colmax);
}

TEST(ReduceTest, EmptyAndZeroDimTensors) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(Item(e.sum()), 0);
  EXPECT_EQ(Values(e.sum({0})), std::vector<double>(3, 0.0));
  EXPECT_EQ(e.sum({1}).sizes(), (IntArrayRef{0}));
  EXPECT_EQ(Values(e.prod(0)), std::vector<double>(3, 1.0));
  EXPECT_TRUE(std::isnan(Item(e.mean())));
  EXPECT_EQ(zeros({0}, kInt32).sum().dtype(), kInt64);
  EXPECT_EQ(e.amax({1}).sizes(), (IntArrayRef{0}));
  EXPECT_THAT(ErrorOf([&] { e.amax({0}); }),
              HasSubstr("amax(): Expected reduction dim 0 to have non-zero size"));
  EXPECT_THAT(ErrorOf([&] { e.amin({}); }),
              HasSubstr("amin(): Expected reduction dim 0 to have non-zero size"));
  EXPECT_THAT(ErrorOf([&] { e.max(0); }),
              HasSubstr("max(): Expected reduction dim 0 to have non-zero size"));
  EXPECT_THAT(ErrorOf([&] { e.min(-2); }),
              HasSubstr("min(): Expected reduction dim 0 to have non-zero size"));
  EXPECT_EQ(e.max(1).values.sizes(), (IntArrayRef{0}));
  EXPECT_THAT(ErrorOf([&] { e.max(); }), HasSubstr("max()"));
  // 0-dim: reductions over "all dims" or dim 0 / -1 give the value itself.
  Tensor z = scalar_tensor(2.5);
  EXPECT_EQ(z.sum().dim(), 0);
  EXPECT_EQ(Item(z.sum()), 2.5);
  EXPECT_EQ(Item(z.sum({0})), 2.5);
  EXPECT_EQ(Item(z.sum({-1}, true)), 2.5);
  EXPECT_EQ(z.sum({0}, true).dim(), 0);
  EXPECT_EQ(Item(z.amax({})), 2.5);
  EXPECT_EQ(Item(z.mean()), 2.5);
  MinMaxResult r = z.max(0);
  EXPECT_EQ(r.values.dim(), 0);
  EXPECT_EQ(r.indices.item<int64_t>(), 0);
  EXPECT_EQ(Item(z.max()), 2.5);
  EXPECT_THAT(ErrorOf([&] { z.sum({1}); }), HasSubstr("dimension out of range"));
}

TEST(ReduceTest, AmaxAminEveryDtypeAndNan) {
  std::vector<double> vals = {3, 7, 1, 0, 5, 9, 2, 8};
  for (Dtype dt : kAllDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor x = Make(vals, {2, 4}, dt);
    Tensor mx = x.amax({});
    EXPECT_EQ(mx.dtype(), dt);
    EXPECT_EQ(Item(mx), dt == kBool ? 1 : 9);
    EXPECT_EQ(Item(x.amin({})), 0);
    EXPECT_EQ(Values(x.amax({1})),
              (dt == kBool ? std::vector<double>{1, 1} : std::vector<double>{7, 9}));
    EXPECT_EQ(Values(x.amin({0})),
              (dt == kBool ? std::vector<double>{1, 1, 1, 0} : std::vector<double>{3, 7, 1, 0}));
    EXPECT_EQ(Item(x.max()), Item(mx));
    EXPECT_EQ(Item(x.min()), 0);
  }
  EXPECT_EQ(Item(tensor({-5, -3, -9}).to(kInt8).amax({})), -3);
  Tensor n = tensor({1.0f, NAN, 3.0f, -1.0f});
  EXPECT_TRUE(std::isnan(Item(n.amax({}))));
  EXPECT_TRUE(std::isnan(Item(n.amin({}))));
  // NaN late in a long contiguous run (the lane loop) still propagates.
  std::vector<double> longv(999, 1.0);
  longv[997] = kNan;
  EXPECT_TRUE(std::isnan(Item(tensor(longv).amax({}))));
  EXPECT_TRUE(std::isnan(Item(tensor(longv).to(kFloat16).amin({}))));
  EXPECT_TRUE(std::isnan(Item(tensor(longv).sum())));
  Tensor inf = tensor({-INFINITY, -INFINITY});
  EXPECT_EQ(Item(inf.amax({})), -INFINITY);
}

TEST(ReduceTest, MaxMinDimValuesIndicesArgmax) {
  // Ties keep the first index.
  Tensor x = tensor(std::vector<float>{1, 5, 5, 2, 0, 0, 3, 0, 7, 7, 1, 7}, SizeVector{3, 4});
  MinMaxResult mx = x.max(1);
  EXPECT_EQ(mx.values.dtype(), kFloat32);
  EXPECT_EQ(mx.indices.dtype(), kInt64);
  EXPECT_EQ(Values(mx.values), (std::vector<double>{5, 3, 7}));
  EXPECT_EQ(Values(mx.indices), (std::vector<double>{1, 2, 0}));
  MinMaxResult mn = x.min(1, true);
  EXPECT_EQ(mn.values.sizes(), (IntArrayRef{3, 1}));
  EXPECT_EQ(Values(mn.values), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(Values(mn.indices), (std::vector<double>{0, 0, 2}));
  MinMaxResult c = x.max(0);  // Down the columns (the column-chunk path).
  EXPECT_EQ(Values(c.values), (std::vector<double>{7, 7, 5, 7}));
  EXPECT_EQ(Values(c.indices), (std::vector<double>{2, 2, 0, 2}));
  EXPECT_EQ(Values(x.min(-2).indices), (std::vector<double>{1, 1, 2, 1}));
  EXPECT_EQ(Values(x.t().max(1).indices), (std::vector<double>{2, 2, 0, 2}));
  EXPECT_EQ(Values(x.t().max(0).indices), (std::vector<double>{1, 2, 0}));
  EXPECT_EQ(x.argmax().item<int64_t>(), 8);
  EXPECT_EQ(x.argmin().item<int64_t>(), 4);
  EXPECT_EQ(Values(x.argmax(1)), (std::vector<double>{1, 2, 0}));
  EXPECT_EQ(x.argmax(0, true).sizes(), (IntArrayRef{1, 4}));
  // NaN is the max and the min; the first NaN's index is returned.
  Tensor n = tensor(std::vector<double>{1.0, kNan, 5.0, kNan});
  EXPECT_TRUE(std::isnan(Item(n.max(0).values)));
  EXPECT_EQ(n.argmax().item<int64_t>(), 1);
  EXPECT_EQ(n.argmin().item<int64_t>(), 1);
  Tensor ncol = tensor(std::vector<double>{1.0, 2.0, kNan, 0.0, 3.0, kNan}).view({3, 2});
  EXPECT_EQ(Values(ncol.argmax(0)), (std::vector<double>{1, 2}));
  // Every dtype, along a strided dim and a contiguous one.
  std::vector<double> vals = {4, 1, 6, 6, 0, 3};
  for (Dtype dt : kAllDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor t = Make(vals, {2, 3}, dt);
    MinMaxResult r = t.max(1);
    EXPECT_EQ(r.values.dtype(), dt);
    if (dt == kBool) {
      EXPECT_EQ(Values(r.indices), (std::vector<double>{0, 0}));
      EXPECT_EQ(Values(t.min(0).indices), (std::vector<double>{0, 1, 0}));
    } else {
      EXPECT_EQ(Values(r.values), (std::vector<double>{6, 6}));
      EXPECT_EQ(Values(r.indices), (std::vector<double>{2, 0}));
      EXPECT_EQ(Values(t.min(0).values), (std::vector<double>{4, 0, 3}));
      EXPECT_EQ(Values(t.min(0).indices), (std::vector<double>{0, 1, 1}));
    }
  }
  // A larger matrix against a reference loop.
  manual_seed(4);
  Tensor big = randn({200, 300}, kFloat64);
  std::vector<double> bv = Values(big);
  std::vector<double> col_idx(300, 0), row_idx(200, 0);
  for (int64_t j = 0; j < 300; ++j)
    for (int64_t i = 1; i < 200; ++i)
      if (bv[i * 300 + j] > bv[static_cast<int64_t>(col_idx[j]) * 300 + j]) col_idx[j] = i;
  for (int64_t i = 0; i < 200; ++i)
    for (int64_t j = 1; j < 300; ++j)
      if (bv[i * 300 + j] < bv[i * 300 + static_cast<int64_t>(row_idx[i])]) row_idx[i] = j;
  EXPECT_EQ(Values(big.argmax(0)), col_idx);
  EXPECT_EQ(Values(big.argmin(1)), row_idx);
  EXPECT_THAT(ErrorOf([&] { x.max(2); }), HasSubstr("dimension out of range"));
}

// var, std and norm are built on elementwise ops (sub, mul, sqrt, abs, pow).
TEST(ReduceTest, VarStdNorm) {
  Tensor x = tensor({1.0, 2.0, 3.0, 4.0, 10.0, 20.0}).view({2, 3});
  // Row 0: mean 2, squared deviations 1 + 0 + 1 = 2. Row 1: mean 34/3.
  double m1 = 34.0 / 3, ss1 = (4 - m1) * (4 - m1) + (10 - m1) * (10 - m1) + (20 - m1) * (20 - m1);
  ExpectNear(Values(x.var({1})), {1.0, ss1 / 2}, 1e-12);
  ExpectNear(Values(x.var({1}, 0)), {2.0 / 3, ss1 / 3}, 1e-12);
  ExpectNear(Values(x.std({1})), {1.0, std::sqrt(ss1 / 2)}, 1e-12);
  EXPECT_EQ(x.var({1}, 1, true).sizes(), (IntArrayRef{2, 1}));
  double all_mean = 40.0 / 6, all_ss = 0;
  for (double v : {1.0, 2.0, 3.0, 4.0, 10.0, 20.0}) all_ss += (v - all_mean) * (v - all_mean);
  EXPECT_NEAR(Item(x.var()), all_ss / 5, 1e-12);
  ExpectNear(Values(x.var({0})), {4.5, 32.0, 144.5}, 1e-12);
  EXPECT_NEAR(Item(x.to(kFloat16).var()), all_ss / 5, 0.05);
  EXPECT_EQ(x.to(kBFloat16).var().dtype(), kBFloat16);
  // No degrees of freedom left: nan.
  EXPECT_TRUE(std::isnan(Item(tensor({5.0f}).var())));
  EXPECT_TRUE(std::isnan(Item(tensor({1.0f, 2.0f}).var({}, 2))));
  EXPECT_TRUE(std::isnan(Item(zeros({0}).var())));
  EXPECT_THAT(ErrorOf([] { arange(4).var(); }), HasSubstr("int64"));
  // Large offset: the two-pass algorithm keeps precision.
  Tensor off = tensor({1e6f + 1, 1e6f + 2, 1e6f + 3});
  EXPECT_NEAR(Item(off.var()), 1.0, 1e-3);
  // norm.
  Tensor v = tensor({3.0f, -4.0f});
  EXPECT_NEAR(Item(v.norm()), 5.0, 1e-6);
  EXPECT_NEAR(Item(v.norm(1)), 7.0, 1e-6);
  EXPECT_NEAR(Item(v.norm(INFINITY)), 4.0, 1e-6);
  EXPECT_NEAR(Item(v.norm(3)), std::cbrt(27.0 + 64.0), 1e-5);
  ExpectNear(Values(x.norm(2, {1})), {std::sqrt(14.0), std::sqrt(516.0)}, 1e-12);
}

// Reference softmax of a row in double.
std::vector<double> RefSoftmax(const std::vector<double>& row) {
  double mx = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (double v : row) sum += std::exp(v - mx);
  std::vector<double> out;
  for (double v : row) out.push_back(std::exp(v - mx) / sum);
  return out;
}

TEST(ReduceTest, SoftmaxAndLogSoftmax) {
  manual_seed(5);
  std::vector<double> v = Values(randn({7, 33}));
  for (double& e : v) e *= 3.0;  // Spread the logits.
  Tensor x = tensor(v, SizeVector{7, 33}).to(kFloat32);
  v = Values(x);
  Tensor s = x.softmax(1);
  EXPECT_EQ(s.dtype(), kFloat32);
  std::vector<double> sv = Values(s), lv = Values(x.log_softmax(-1));
  for (int64_t i = 0; i < 7; ++i) {
    std::vector<double> row(v.begin() + i * 33, v.begin() + (i + 1) * 33);
    std::vector<double> want = RefSoftmax(row);
    double total = 0;
    for (int64_t j = 0; j < 33; ++j) {
      EXPECT_NEAR(sv[i * 33 + j], want[j], 1e-6);
      EXPECT_NEAR(lv[i * 33 + j], std::log(want[j]), 1e-5);
      total += sv[i * 33 + j];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
  ExpectNear(Values(s.sum({1})), std::vector<double>(7, 1.0), 1e-5);
  // Along dim 0 (strided rows) equals the transposed softmax along dim 1.
  ExpectNear(Values(x.t().softmax(0).t()), sv, 1e-7, 1e-7);
  ExpectNear(Values(x.t().contiguous().log_softmax(0).t()), lv, 1e-6, 1e-6);
  // Large inputs do not overflow (max subtracted first).
  Tensor big = tensor({1000.0f, 1001.0f, 1002.0f});
  std::vector<double> want = RefSoftmax({0, 1, 2});
  ExpectNear(Values(big.softmax(0)), want, 1e-6);
  ExpectNear(Values(big.log_softmax(0)), {std::log(want[0]), std::log(want[1]), std::log(want[2])},
             1e-5);
  // Other floating dtypes, 0-dim and empty.
  ExpectNear(Values(tensor({0.0, 0.0}).to(kFloat16).softmax(0)), {0.5, 0.5}, 1e-3);
  ExpectNear(Values(tensor({1.0, 2.0}).to(kBFloat16).log_softmax(0)),
             {std::log(RefSoftmax({1, 2})[0]), std::log(RefSoftmax({1, 2})[1])}, 1e-2);
  Tensor dbl = tensor({1.0, 2.0, 3.0});
  EXPECT_EQ(dbl.softmax(0).dtype(), kFloat64);
  ExpectNear(Values(dbl.softmax(0)), RefSoftmax({1, 2, 3}), 1e-15);
  EXPECT_EQ(Item(scalar_tensor(3.0).softmax(0)), 1.0);
  EXPECT_EQ(Item(scalar_tensor(3.0).log_softmax(-1)), 0.0);
  EXPECT_EQ(zeros({0, 4}).softmax(1).sizes(), (IntArrayRef{0, 4}));
  EXPECT_TRUE(std::isnan(Values(tensor({1.0f, NAN}).softmax(0))[0]));
  EXPECT_THAT(ErrorOf([] { arange(3).softmax(0); }),
              HasSubstr("softmax: expected a floating point tensor, got int64"));
  EXPECT_THAT(ErrorOf([] { arange(3).log_softmax(0); }), HasSubstr("log_softmax"));
  EXPECT_THAT(ErrorOf([&] { x.softmax(2); }), HasSubstr("dimension out of range"));
}

TEST(ReduceTest, ReduceOutKernelDirect) {
  // reduce_out writes into a preallocated keepdim-shaped output, here a
  // strided column of a larger buffer.
  Tensor x = arange(12).view({3, 4}).to(kFloat64);
  Tensor buf = zeros({3, 2}, kFloat64);
  Tensor out = buf.narrow(1, 1, 1);  // [3, 1], stride 2.
  int64_t dims[] = {1};
  ops::reduce_out(ReduceOp::kSum, out, x, dims);
  EXPECT_EQ(Values(buf), (std::vector<double>{0, 6, 0, 22, 0, 38}));
}

}  // namespace
}  // namespace ember
