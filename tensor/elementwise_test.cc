// Tests of the elementwise ops: unary, binary, where and clamp (out of place
// and in place), every dtype, type promotion, broadcasting, non-contiguous,
// empty and 0-dim inputs, and the error messages. Expected values are
// hand-computed literals or a double-precision reference loop in this file.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"

namespace ember {
namespace {

using ::testing::HasSubstr;
using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Relative tolerance of one rounding in `dtype`.
double Tol(Dtype dtype) {
  switch (dtype) {
    case kFloat64: return 1e-12;
    case kFloat32: return 2e-6;
    case kFloat16: return 2e-3;
    case kBFloat16: return 1.6e-2;
    default: return 0;
  }
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i << ": got " << got[i];
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], rtol * std::max(1.0, std::abs(want[i]))) << what << " at " << i;
    }
  }
}

void ExpectValues(const Tensor& t, const std::vector<double>& want, const std::string& what = "") {
  ExpectNear(Values(t), want, Tol(t.dtype()), what);
}

constexpr Dtype kFloatDtypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};
constexpr Dtype kIntDtypes[] = {kInt64, kInt32, kInt16, kInt8, kUInt8};

// --- Unary -----------------------------------------------------------------------

struct UnaryCase {
  UnaryOp op;
  double (*ref)(double);
  std::vector<double> inputs;
};

const std::vector<UnaryCase>& FloatUnaryCases() {
  static const std::vector<double> kAny = {-2.5, -1.0, -0.5, 0.0, 0.25, 1.0, 1.5, 3.0};
  static const std::vector<double> kPositive = {0.125, 0.5, 1.0, 1.5, 2.0, 4.0, 10.0};
  static const std::vector<double> kSmall = {-1.25, -0.5, 0.0, 0.25, 0.5, 1.0};
  static const std::vector<UnaryCase> cases = {
      {UnaryOp::kNeg, [](double x) { return -x; }, kAny},
      {UnaryOp::kAbs, [](double x) { return std::fabs(x); }, kAny},
      {UnaryOp::kExp, [](double x) { return std::exp(x); }, kAny},
      {UnaryOp::kExpm1, [](double x) { return std::expm1(x); }, kAny},
      {UnaryOp::kLog, [](double x) { return std::log(x); }, kPositive},
      {UnaryOp::kLog1p, [](double x) { return std::log1p(x); }, kPositive},
      {UnaryOp::kLog2, [](double x) { return std::log2(x); }, kPositive},
      {UnaryOp::kSqrt, [](double x) { return std::sqrt(x); }, kPositive},
      {UnaryOp::kRsqrt, [](double x) { return 1.0 / std::sqrt(x); }, kPositive},
      {UnaryOp::kSin, [](double x) { return std::sin(x); }, kAny},
      {UnaryOp::kCos, [](double x) { return std::cos(x); }, kAny},
      {UnaryOp::kTan, [](double x) { return std::tan(x); }, kSmall},
      {UnaryOp::kTanh, [](double x) { return std::tanh(x); }, kAny},
      {UnaryOp::kSigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, kAny},
      {UnaryOp::kRelu, [](double x) { return x > 0 ? x : 0.0; }, kAny},
      {UnaryOp::kGelu, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); },
       kAny},
      {UnaryOp::kErf, [](double x) { return std::erf(x); }, kAny},
      {UnaryOp::kReciprocal, [](double x) { return 1.0 / x; }, kPositive},
      {UnaryOp::kSign, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }, kAny},
      {UnaryOp::kFloor, [](double x) { return std::floor(x); }, kAny},
      {UnaryOp::kCeil, [](double x) { return std::ceil(x); }, kAny},
      {UnaryOp::kSquare, [](double x) { return x * x; }, kAny},
  };
  return cases;
}

TEST(UnaryTest, EveryFloatOpOnEveryFloatDtypeMatchesDoubleReference) {
  for (Dtype dtype : kFloatDtypes) {
    for (const UnaryCase& c : FloatUnaryCases()) {
      std::string what = std::string(UnaryOpName(c.op)) + " " + std::string(dtype_name(dtype));
      Tensor x = Make(c.inputs, dtype);
      std::vector<double> exact = Values(x);  // Inputs are exact in every dtype.
      std::vector<double> want;
      for (double v : exact) want.push_back(c.ref(v));
      Tensor y = ops::unary(c.op, x);
      EXPECT_EQ(y.dtype(), dtype) << what;
      EXPECT_EQ(y.sizes(), x.sizes()) << what;
      ExpectNear(Values(y), want, 2 * Tol(dtype), what);
    }
  }
}

TEST(UnaryTest, PromotingOpsOnIntegersAndBoolGiveFloat32) {
  for (Dtype dtype : kIntDtypes) {
    Tensor x = Make({0, 1, 2, 4}, dtype);
    Tensor e = x.exp();
    EXPECT_EQ(e.dtype(), kFloat32) << dtype;
    ExpectValues(e, {1.0, std::exp(1.0), std::exp(2.0), std::exp(4.0)});
    Tensor s = x.sqrt();
    EXPECT_EQ(s.dtype(), kFloat32);
    ExpectValues(s, {0.0, 1.0, std::sqrt(2.0), 2.0});
    EXPECT_EQ(x.sigmoid().dtype(), kFloat32);
    ExpectValues(x.reciprocal(), {kInf, 1.0, 0.5, 0.25});
  }
  Tensor b = tensor({true, false});
  Tensor e = b.exp();
  EXPECT_EQ(e.dtype(), kFloat32);
  ExpectValues(e, {std::exp(1.0), 1.0});
  ExpectValues(b.log(), {0.0, -kInf});
}

TEST(UnaryTest, IntegerOpsKeepTheDtype) {
  for (Dtype dtype : {kInt64, kInt32, kInt16, kInt8}) {
    Tensor x = Make({-3, -1, 0, 2, 5}, dtype);
    std::string what(dtype_name(dtype));
    for (Tensor y : {x.neg(), x.abs(), x.relu(), x.sign(), x.square(), x.floor(), x.ceil(),
                     x.round()}) {
      EXPECT_EQ(y.dtype(), dtype) << what;
    }
    ExpectValues(x.neg(), {3, 1, 0, -2, -5}, what);
    ExpectValues(x.abs(), {3, 1, 0, 2, 5}, what);
    ExpectValues(x.relu(), {0, 0, 0, 2, 5}, what);
    ExpectValues(x.sign(), {-1, -1, 0, 1, 1}, what);
    ExpectValues(x.square(), {9, 1, 0, 4, 25}, what);
    ExpectValues(x.floor(), {-3, -1, 0, 2, 5}, what);
    ExpectValues(x.ceil(), {-3, -1, 0, 2, 5}, what);
    ExpectValues(x.round(), {-3, -1, 0, 2, 5}, what);
    ExpectValues(-x, {3, 1, 0, -2, -5}, what);
  }
  Tensor u = Make({0, 1, 200}, kUInt8);
  ExpectValues(u.neg(), {0, 255, 56});  // Wraps, as torch.
  ExpectValues(u.abs(), {0, 1, 200});
  ExpectValues(u.sign(), {0, 1, 1});
  ExpectValues(u.square(), {0, 1, 64});  // 40000 mod 256.
  // Signed overflow wraps instead of being undefined.
  Tensor big = Make({-128, 127}, kInt8);
  ExpectValues(big.neg(), {-128, -127});
  ExpectValues(big.abs(), {-128, 127});
  Tensor i64 = tensor(std::vector<int64_t>{std::numeric_limits<int64_t>::min()});
  EXPECT_EQ(i64.neg().item<int64_t>(), std::numeric_limits<int64_t>::min());
}

TEST(UnaryTest, SpecialValues) {
  Tensor r = Make({0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, -2.6});
  ExpectValues(r.round(), {0, 2, 2, -0.0, -2, -2, 2, -3});  // Half to even.
  ExpectValues(Make({0.0, -0.0, kNaN, -kInf, kInf}).sign(), {0, 0, 0, -1, 1});
  ExpectValues(Make({1.0, -1.0, 0.0}).gelu(), {0.8413447460685429, -0.15865525393145707, 0.0});
  ExpectValues(Make({kNaN, -1.0}).relu(), {kNaN, 0.0});
  ExpectValues(Make({-1.0, 0.0}).sqrt(), {kNaN, 0.0});
  ExpectValues(Make({0.0}).log(), {-kInf});
  ExpectValues(Make({-100.0, 100.0}, kFloat32).sigmoid(), {0.0, 1.0});
}

TEST(UnaryTest, BoolInputs) {
  Tensor b = tensor({true, false, true});
  EXPECT_THAT(ErrorOf([&] { b.neg(); }),
              HasSubstr("negation, the `-` operator, on a bool tensor is not supported. If you "
                        "are trying to invert a mask, use logical_not() instead"));
  EXPECT_THAT(ErrorOf([&] { -b; }), HasSubstr("on a bool tensor is not supported"));
  EXPECT_THAT(ErrorOf([&] { b.abs(); }), HasSubstr("abs: not supported for bool"));
  EXPECT_THAT(ErrorOf([&] { b.relu(); }), HasSubstr("relu: not supported for bool"));
  EXPECT_THAT(ErrorOf([&] { b.floor(); }), HasSubstr("floor: not supported for bool"));
  Tensor s = b.sign();
  EXPECT_EQ(s.dtype(), kBool);
  ExpectValues(s, {1, 0, 1});
  Tensor sq = b.square();
  EXPECT_EQ(sq.dtype(), kInt64);  // As torch.pow(bool, 2).
  ExpectValues(sq, {1, 0, 1});
}

TEST(UnaryTest, LogicalNotOfEveryDtypeIsBool) {
  for (Dtype dtype : kAllDtypes) {
    Tensor x = Make({0, 1, 0, 1}, dtype);
    Tensor y = x.logical_not();
    EXPECT_EQ(y.dtype(), kBool) << dtype;
    ExpectValues(y, {1, 0, 1, 0}, std::string(dtype_name(dtype)));
    ExpectValues(!x, {1, 0, 1, 0});
  }
  ExpectValues(Make({kNaN, -0.0, 2.5}).logical_not(), {0, 1, 0});  // NaN is true.
}

TEST(UnaryTest, NonContiguousEmptyAndZeroDim) {
  Tensor base = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32);
  ExpectValues(base.t().neg(), {-1, -4, -2, -5, -3, -6});
  EXPECT_EQ(base.t().neg().sizes(), (SizeVector{3, 2}));
  ExpectValues(base.slice(1, 0, 3, 2).square(), {1, 9, 16, 36});
  ExpectValues(Make({2}).expand({2, 3}).exp(), std::vector<double>(6, std::exp(2.0)));
  Tensor e = empty({0, 3});
  Tensor ee = e.exp();
  EXPECT_EQ(ee.sizes(), (SizeVector{0, 3}));
  EXPECT_EQ(ee.dtype(), kFloat32);
  EXPECT_EQ(Make({}, {0}, kInt64).exp().dtype(), kFloat32);
  Tensor z = scalar_tensor(-2.0);
  Tensor za = z.abs();
  EXPECT_EQ(za.dim(), 0);
  EXPECT_EQ(za.item<double>(), 2.0);
}

TEST(UnaryTest, InPlace) {
  Tensor x = Make({-1, 2, -3, 4}, {2, 2}, kFloat32);
  uint32_t v = x.version();
  Tensor r = x.neg_();
  EXPECT_TRUE(r.is_same(x));
  EXPECT_GT(x.version(), v);
  ExpectValues(x, {1, -2, 3, -4});
  // Through a non-contiguous view: writes reach the base.
  x.t().abs_();
  ExpectValues(x, {1, 2, 3, 4});
  Tensor col = x.select(1, 0);  // [1, 3], stride 2.
  col.relu_();
  col.exp_();
  ExpectValues(x, {std::exp(1.0), 2, std::exp(3.0), 4});
  Tensor p = Make({0.25, 4.0}, kFloat16);
  p.sqrt_();
  EXPECT_EQ(p.dtype(), kFloat16);
  ExpectValues(p, {0.5, 2.0});
  Tensor s = Make({0.0}, kFloat64);
  s.sigmoid_();
  ExpectValues(s, {0.5});
  s.tanh_();
  ExpectValues(s, {std::tanh(0.5)});
  s.log_();
  ExpectValues(s, {std::log(std::tanh(0.5))});

  Tensor ints = Make({-2, 3}, kInt32);
  ints.abs_();
  ExpectValues(ints, {2, 3});
  EXPECT_THAT(ErrorOf([&] { ints.exp_(); }),
              HasSubstr("exp_: result type float32 can't be cast to the desired output type int32"));
  ExpectValues(ints, {2, 3});  // Untouched.
  EXPECT_THAT(ErrorOf([&] { tensor({true}).neg_(); }), HasSubstr("on a bool tensor"));
  EXPECT_THAT(ErrorOf([&] { Make({1}).expand({3}).neg_(); }),
              HasSubstr("more than one element of the written-to tensor"));
  // logical_not through the in-place op: bool result cast back.
  Tensor f = Make({0, 2});
  ops::unary_(UnaryOp::kLogicalNot, f);
  EXPECT_EQ(f.dtype(), kFloat32);
  ExpectValues(f, {1, 0});
  Tensor empty_t = empty({0});
  v = empty_t.version();
  empty_t.exp_();
  EXPECT_GT(empty_t.version(), v);
}

// --- Binary ----------------------------------------------------------------------

struct BinaryCase {
  BinaryOp op;
  double (*ref)(double, double);
  bool returns_bool;
};

const std::vector<BinaryCase>& BinaryCases() {
  static const std::vector<BinaryCase> cases = {
      {BinaryOp::kAdd, [](double x, double y) { return x + y; }, false},
      {BinaryOp::kSub, [](double x, double y) { return x - y; }, false},
      {BinaryOp::kMul, [](double x, double y) { return x * y; }, false},
      {BinaryOp::kDiv, [](double x, double y) { return x / y; }, false},
      {BinaryOp::kPow, [](double x, double y) { return std::pow(x, y); }, false},
      {BinaryOp::kMaximum, [](double x, double y) { return std::max(x, y); }, false},
      {BinaryOp::kMinimum, [](double x, double y) { return std::min(x, y); }, false},
      {BinaryOp::kEq, [](double x, double y) { return double(x == y); }, true},
      {BinaryOp::kNe, [](double x, double y) { return double(x != y); }, true},
      {BinaryOp::kLt, [](double x, double y) { return double(x < y); }, true},
      {BinaryOp::kLe, [](double x, double y) { return double(x <= y); }, true},
      {BinaryOp::kGt, [](double x, double y) { return double(x > y); }, true},
      {BinaryOp::kGe, [](double x, double y) { return double(x >= y); }, true},
      {BinaryOp::kLogicalAnd, [](double x, double y) { return double(x != 0 && y != 0); }, true},
      {BinaryOp::kLogicalOr, [](double x, double y) { return double(x != 0 || y != 0); }, true},
      {BinaryOp::kLogicalXor, [](double x, double y) { return double((x != 0) != (y != 0)); },
       true},
  };
  return cases;
}

TEST(BinaryTest, EveryOpOnEveryDtypeMatchesDoubleReference) {
  // Small non-negative values keep every op exact or within one rounding, and
  // in range for uint8.
  const std::vector<double> xs = {0, 1, 3, 3, 5, 4, 0, 7};
  const std::vector<double> ys = {1, 1, 3, 2, 2, 3, 0, 1};
  for (Dtype dtype : kAllDtypes) {
    for (const BinaryCase& c : BinaryCases()) {
      std::string what = std::string(BinaryOpName(c.op)) + " " + std::string(dtype_name(dtype));
      Tensor a = Make(xs, {2, 4}, dtype), b = Make(ys, {2, 4}, dtype);
      if (dtype == kBool && (c.op == BinaryOp::kSub || c.op == BinaryOp::kPow)) {
        EXPECT_THAT(ErrorOf([&] { ops::binary(c.op, a, b); }), HasSubstr("bool")) << what;
        continue;
      }
      Tensor out = ops::binary(c.op, a, b);
      Dtype want_dtype = c.returns_bool                                   ? kBool
                         : (c.op == BinaryOp::kDiv && !is_floating_point(dtype)) ? kFloat32
                                                                              : dtype;
      EXPECT_EQ(out.dtype(), want_dtype) << what;
      EXPECT_EQ(out.sizes(), (SizeVector{2, 4})) << what;
      std::vector<double> va = Values(a), vb = Values(b), want;
      for (size_t i = 0; i < va.size(); ++i) {
        double r = c.ref(va[i], vb[i]);
        if (dtype == kBool && !c.returns_bool && c.op != BinaryOp::kDiv) r = r != 0;
        if (dtype == kUInt8 && !c.returns_bool && r < 0) r += 256;  // 0 - 1 wraps.
        want.push_back(r);
      }
      ExpectNear(Values(out), want, 2 * Tol(out.dtype()), what);
    }
  }
}

TEST(BinaryTest, TypePromotion) {
  auto dtype_of = [](const Tensor& a, const Tensor& b) { return a.add(b).dtype(); };
  EXPECT_EQ(dtype_of(Make({1}, kInt32), Make({1}, kFloat16)), kFloat16);
  EXPECT_EQ(dtype_of(Make({1}, kUInt8), Make({1}, kInt8)), kInt16);
  EXPECT_EQ(dtype_of(Make({1}, kFloat16), Make({1}, kBFloat16)), kFloat32);
  EXPECT_EQ(dtype_of(Make({1}, kBool), Make({1}, kInt8)), kInt8);
  EXPECT_EQ(dtype_of(Make({1}, kInt64), Make({1}, kFloat64)), kFloat64);
  // Plain numbers only matter when of a higher category.
  EXPECT_EQ(Make({1}, kInt32).add(1).dtype(), kInt32);
  EXPECT_EQ(Make({1}, kInt64).add(2.5).dtype(), kFloat32);
  EXPECT_EQ(Make({1}, kFloat16).mul(3.0).dtype(), kFloat16);
  EXPECT_EQ(Make({1}, kUInt8).add(1000).dtype(), kUInt8);
  EXPECT_EQ(Make({1}, kBool).add(1).dtype(), kInt64);
  // 0-dim tensors rank below dimensioned ones.
  EXPECT_EQ(dtype_of(Make({1}, kFloat32), scalar_tensor(1.0, kFloat64)), kFloat32);
  EXPECT_EQ(dtype_of(Make({1}, kInt32), scalar_tensor(1.0, kFloat64)), kFloat64);
  EXPECT_EQ(dtype_of(scalar_tensor(1, kInt16), scalar_tensor(1, kInt64)), kInt64);
  EXPECT_EQ(dtype_of(scalar_tensor(1, kInt16), Make({1}, kInt8)), kInt8);
  ExpectValues(Make({1, 2}, kInt64).add(2.5), {3.5, 4.5});
  ExpectValues(2.5 - Make({1, 2}, kInt32), {1.5, 0.5});
  ExpectValues(10 / Make({4, 8}, kInt32), {2.5, 1.25});
  // Comparisons compare in the promoted dtype.
  ExpectValues(Make({1, 2, 3}, kInt64).lt(2.5), {1, 1, 0});
  ExpectValues(Make({1, 2, 3}, kInt64).eq(2.0), {0, 1, 0});
  ExpectValues(Make({255}, kUInt8).eq(Make({-1}, kInt8)), {0});  // In int16: 255 != -1.
}

TEST(BinaryTest, DivisionAndPower) {
  Tensor a = Make({7, -7, 1, 0}, kInt64), b = Make({2, 2, 0, 0}, kInt64);
  Tensor q = a / b;
  EXPECT_EQ(q.dtype(), kFloat32);
  ExpectValues(q, {3.5, -3.5, kInf, kNaN});
  ExpectValues(Make({1, 2}, kBool).div(Make({1, 1}, kBool)), {1, 1});
  EXPECT_EQ(Make({1}, kBool).div(Make({1}, kBool)).dtype(), kFloat32);
  // Integer powers.
  Tensor base = Make({2, -3, 10, 0}, kInt32);
  Tensor p = base.pow(3);
  EXPECT_EQ(p.dtype(), kInt32);
  ExpectValues(p, {8, -27, 1000, 0});
  EXPECT_THAT(ErrorOf([&] { base.pow(-1); }),
              HasSubstr("Integers to negative integer powers are not allowed."));
  EXPECT_THAT(ErrorOf([&] { base.pow_(-2); }),
              HasSubstr("Integers to negative integer powers are not allowed."));
  ExpectValues(base.pow(-1.0), {0.5, -1.0 / 3, 0.1, kInf});  // Float exponent: float32.
  // A tensor of negative integer exponents: 0 except for bases 1 and -1.
  ExpectValues(Make({2, 1, -1, -1}, kInt64).pow(Make({-1, -5, -3, -2}, kInt64)), {0, 1, -1, 1});
  ExpectValues(Make({2.0, 4.0}).pow(0.5), {std::sqrt(2.0), 2.0});
  ExpectValues(Make({-8.0}).pow(Make({1.0 / 3})), {kNaN});
  Tensor f = Make({1.5, 2.0}, kFloat64);
  f.pow_(2);
  ExpectValues(f, {2.25, 4.0});
}

TEST(BinaryTest, BoolArithmetic) {
  Tensor a = tensor({true, true, false, false}), b = tensor({true, false, true, false});
  Tensor s = a + b;
  EXPECT_EQ(s.dtype(), kBool);
  ExpectValues(s, {1, 1, 1, 0});
  ExpectValues(a * b, {1, 0, 0, 0});
  ExpectValues(maximum(a, b), {1, 1, 1, 0});
  ExpectValues(minimum(a, b), {1, 0, 0, 0});
  EXPECT_THAT(ErrorOf([&] { a - b; }),
              HasSubstr("Subtraction, the `-` operator, with two bool tensors is not supported. "
                        "Use the `^` or `logical_xor()` operator instead."));
  EXPECT_THAT(ErrorOf([&] { a.sub(true); }), HasSubstr("Subtraction"));
  ExpectValues(a - 1, {0, 0, -1, -1});  // int64.
}

TEST(BinaryTest, MaximumMinimumPropagateNaN) {
  Tensor a = Make({1.0, kNaN, 3.0, kNaN, -kInf});
  Tensor b = Make({2.0, 1.0, kNaN, kNaN, 0.0});
  ExpectValues(maximum(a, b), {2.0, kNaN, kNaN, kNaN, 0.0});
  ExpectValues(minimum(a, b), {1.0, kNaN, kNaN, kNaN, -kInf});
  for (Dtype dtype : {kFloat16, kBFloat16, kFloat64}) {
    ExpectValues(maximum(a.to(dtype), b.to(dtype)), {2.0, kNaN, kNaN, kNaN, 0.0});
  }
  ExpectValues(maximum(Make({-5, 7}, kInt8), Make({3, -9}, kInt8)), {3, 7});
}

TEST(BinaryTest, ComparisonsAndLogicalOpsWithNaNAndNonzero) {
  Tensor a = Make({kNaN, 1.0, 0.0, -2.0});
  Tensor b = Make({kNaN, 1.0, 0.5, 0.0});
  ExpectValues(a == b, {0, 1, 0, 0});
  ExpectValues(a != b, {1, 0, 1, 1});
  ExpectValues(a < b, {0, 0, 1, 1});
  ExpectValues(a >= b, {0, 1, 0, 0});
  ExpectValues(a.logical_and(b), {1, 1, 0, 0});
  ExpectValues(a.logical_or(b), {1, 1, 1, 1});
  ExpectValues(a.logical_xor(b), {0, 0, 1, 1});
  ExpectValues(Make({0, 3, -1}, kInt32) && Make({2, 0, 5}, kInt64), {0, 0, 1});
  ExpectValues(Make({0, 3, 0}, kInt16) || tensor({false, false, true}), {0, 1, 1});
}

TEST(BinaryTest, IntegerOverflowWraps) {
  Tensor a = Make({127, -128}, kInt8), b = Make({1, 1}, kInt8);
  ExpectValues(a + b, {-128, -127});
  ExpectValues(a - b, {126, 127});
  ExpectValues(a * Make({2, 2}, kInt8), {-2, 0});
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Tensor big = tensor(std::vector<int64_t>{kMax});
  EXPECT_EQ(big.add(1).item<int64_t>(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Make({200}, kUInt8).add(Make({100}, kUInt8)).item<int64_t>(), 44);
}

TEST(BinaryTest, Broadcasting) {
  Tensor a = Make({1, 2, 3, 4, 5, 6}, {2, 1, 3}, kFloat32);
  Tensor b = Make({10, 20, 30, 40}, {4, 1}, kFloat32);
  Tensor c = a + b;
  EXPECT_EQ(c.sizes(), (SizeVector{2, 4, 3}));
  std::vector<double> want;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 3; ++k) want.push_back((i * 3 + k + 1) + 10.0 * (j + 1));
    }
  }
  ExpectValues(c, want);
  ExpectValues(b - a, [&] {
    std::vector<double> w(want.size());
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 4; ++j) {
        for (int k = 0; k < 3; ++k) w[(i * 4 + j) * 3 + k] = 10.0 * (j + 1) - (i * 3 + k + 1);
      }
    }
    return w;
  }());
  EXPECT_THAT(ErrorOf([&] { Make({1, 2, 3}) + Make({1, 2}); }),
              HasSubstr("add: shapes [3] and [2] are not broadcastable"));
  EXPECT_THAT(ErrorOf([&] { Make({1, 2, 3}).lt(Make({1, 2, 3, 4}, {2, 2}, kFloat32)); }),
              HasSubstr("lt: shapes [3] and [2, 2] are not broadcastable"));
  // A 0-dim tensor and a [1, 3]: [1, 3].
  Tensor s = scalar_tensor(2.0) * Make({1, 2, 3}, {1, 3}, kFloat32);
  EXPECT_EQ(s.sizes(), (SizeVector{1, 3}));
  ExpectValues(s, {2, 4, 6});
}

TEST(BinaryTest, NonContiguousOperands) {
  Tensor base = Make({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4}, kFloat64);
  Tensor t = base.t();                     // [4, 3], transposed.
  Tensor s = base.slice(1, 0, 4, 2);       // [3, 2], step 2.
  Tensor e = Make({100, 200, 300}, kFloat64).unsqueeze(0).expand({4, 3});  // Stride 0.
  ExpectValues(t + e, {101, 205, 309, 102, 206, 310, 103, 207, 311, 104, 208, 312});
  ExpectValues(s * s, {1, 9, 25, 49, 81, 121});
  // Rows 1 and 3 of t minus a [2, 3] corner of base (row stride 4).
  ExpectValues(t.slice(0, 1, 4, 2) - base.slice(1, 0, 3).slice(0, 0, 2),
               {2 - 1, 6 - 2, 10 - 3, 4 - 5, 8 - 6, 12 - 7});
  // Mixed dtypes and layouts.
  Tensor ti = t.to(kInt32);
  ExpectValues(ti.t() > Make({6.5}), {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
}

TEST(BinaryTest, EmptyAndZeroDim) {
  Tensor e = empty({0, 3});
  Tensor r = e + Make({1, 2, 3});
  EXPECT_EQ(r.sizes(), (SizeVector{0, 3}));
  EXPECT_EQ((Make({}, {0}, kInt64) / Make({}, {0}, kInt64)).dtype(), kFloat32);
  Tensor z = scalar_tensor(3, kInt64) * scalar_tensor(4, kInt64);
  EXPECT_EQ(z.dim(), 0);
  EXPECT_EQ(z.item<int64_t>(), 12);
  EXPECT_EQ(scalar_tensor(3.0).gt(2).item<bool>(), true);
}

TEST(BinaryTest, AlphaValuesAndDtypes) {
  Tensor a = Make({1, 2, 3}, kFloat32);
  ExpectValues(a.add(Make({1, 1, 1}, kFloat32), 2.5), {3.5, 4.5, 5.5});
  ExpectValues(a.sub(Make({1, 2, 4}, kFloat32), -2), {3, 6, 11});
  // Broadcast other, mixed dtypes: float32 self, int64 other -> float32.
  Tensor m = Make({1, 2, 3, 4}, {2, 2}, kFloat32);
  Tensor r = m.add(Make({10, 20}, kInt64), 0.5);
  EXPECT_EQ(r.dtype(), kFloat32);
  ExpectValues(r, {6, 12, 8, 14});
  // Integers stay exact (a float multiply of 2^53 + 1 would round).
  const int64_t big = (int64_t{1} << 53) + 1;
  Tensor i = Make({0, 0}, kInt64);
  i.add_(tensor(std::vector<int64_t>{big, -big}), 3);
  EXPECT_EQ(i.select(0, 0).item<int64_t>(), 3 * big);
  EXPECT_EQ(i.select(0, 1).item<int64_t>(), -3 * big);
  Tensor small = Make({100, -100}, kInt8).sub(Make({1, 1}, kInt8), 28);  // Wraps, as torch.
  ExpectValues(small, {72, -128});
  // 16-bit floats compute in float.
  Tensor h = Make({1, 2}, kFloat16);
  h.sub_(Make({0.5, 0.5}, kFloat16), 2);
  EXPECT_EQ(h.dtype(), kFloat16);
  ExpectValues(h, {0, 1});
  // Bool: any non-zero integer alpha is true.
  ExpectValues(tensor({false, true}).add(tensor({true, false}), true), {1, 1});
  ExpectValues(tensor({false, true}).add(tensor({true, false}), 0), {0, 1});
}

TEST(BinaryTest, AlphaMustSuitTheResultDtype) {
  Tensor i = Make({1, 2}, kInt64);
  EXPECT_THAT(ErrorOf([&] { i.add(Make({1, 2}, kInt64), 2.5); }),
              HasSubstr("add: For integral input tensors, argument alpha must not be a floating "
                        "point number (alpha 2.5, result dtype int64)"));
  EXPECT_THAT(ErrorOf([&] { i.sub_(Make({1, 2}, kInt64), 1.0); }),
              HasSubstr("sub: For integral input tensors, argument alpha must not be a floating"));
  EXPECT_THAT(ErrorOf([&] { Make({1.0}).add(Make({1.0}), true); }),
              HasSubstr("add: Boolean alpha only supported for Boolean results"));
  ExpectValues(i, {1, 2});  // Nothing written.
  // In place: the result dtype must still be castable to self's.
  EXPECT_THAT(ErrorOf([&] { i.add_(Make({0.5, 0.5}), 2); }),
              HasSubstr("add_: result type float32 can't be cast to the desired output type int64"));
}

TEST(BinaryTest, InPlaceAlphaAllocatesNoTemporary) {
  // 1 MiB operands: a temporary for alpha * other would be a large CPU block,
  // which the allocator's counters see.
  Tensor a = zeros({1 << 18});
  Tensor b = ones({1 << 18});
  CpuCacheStats before = get_cpu_cache_stats();
  a.add_(b, 0.25);
  a.sub_(b, -0.5);
  CpuCacheStats after = get_cpu_cache_stats();
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);
  EXPECT_EQ(a.select(0, 0).item<float>(), 0.75f);
  EXPECT_EQ(a.select(0, (1 << 18) - 1).item<float>(), 0.75f);
}

TEST(BinaryTest, InPlace) {
  Tensor a = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32);
  uint32_t v = a.version();
  Tensor r = a.add_(Make({10, 20, 30}));
  EXPECT_TRUE(r.is_same(a));
  EXPECT_GT(a.version(), v);
  ExpectValues(a, {11, 22, 33, 14, 25, 36});
  a.sub_(1);
  a.mul_(2);
  a.div_(Make({2}, {1, 1}, kFloat32));
  ExpectValues(a, {10, 21, 32, 13, 24, 35});
  a.add_(Make({1, 1, 1, 1, 1, 1}, {2, 3}, kFloat32), /*alpha=*/-3);
  ExpectValues(a, {7, 18, 29, 10, 21, 32});
  Tensor aa = a;
  aa += 1;
  aa -= Make({1});
  aa *= 2;
  aa /= 2;
  ExpectValues(a, {7, 18, 29, 10, 21, 32});
  // Shape rule: the broadcast result must have self's shape.
  EXPECT_THAT(ErrorOf([&] { Make({1, 2, 3}).add_(Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32)); }),
              HasSubstr("add_: output with shape [3] doesn't match the broadcast shape [2, 3]"));
  // Castability: no float into int, no int into bool.
  Tensor i = Make({1, 2}, kInt64);
  EXPECT_THAT(ErrorOf([&] { i.add_(0.5); }),
              HasSubstr("add_: result type float32 can't be cast to the desired output type int64"));
  EXPECT_THAT(ErrorOf([&] { i.div_(2); }),
              HasSubstr("div_: result type float32 can't be cast to the desired output type int64"));
  EXPECT_THAT(ErrorOf([&] { tensor({true}).add_(1); }),
              HasSubstr("result type int64 can't be cast to the desired output type bool"));
  ExpectValues(i, {1, 2});
  // Narrower destinations: computed in the promoted dtype, cast back.
  Tensor i32 = Make({1, 2}, kInt32);
  i32.add_(Make({1000000000000LL, 3}, kInt64).sub(Make({1000000000000LL, 0}, kInt64)));
  ExpectValues(i32, {1, 5});
  Tensor h = Make({1.0, 2.0}, kFloat16);
  h.mul_(Make({0.5, 0.25}, kFloat64));
  EXPECT_EQ(h.dtype(), kFloat16);
  ExpectValues(h, {0.5, 0.5});
  Tensor fl = Make({1.5, 2.5});
  fl.add_(Make({1, 2}, kInt64));
  ExpectValues(fl, {2.5, 4.5});
  // Overlap: the transposed self is read before being overwritten.
  Tensor m = Make({0, 1, 2, 3}, {2, 2}, kFloat32);
  m.add_(m.t());
  ExpectValues(m, {0, 3, 3, 6});
  Tensor n = Make({1, 2, 3}, kInt64);
  n.add_(n);  // Same layout.
  ExpectValues(n, {2, 4, 6});
  Tensor row = Make({1, 2, 3, 4}, {2, 2}, kFloat32);
  row.mul_(row.select(0, 1));  // [3, 4] broadcast over both rows, overlapping row 1.
  ExpectValues(row, {3, 8, 9, 16});
  // Non-contiguous self.
  Tensor base = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32);
  base.t().add_(Make({10, 20}));
  ExpectValues(base, {11, 12, 13, 24, 25, 26});
  base.slice(1, 0, 3, 2).mul_(0);
  ExpectValues(base, {0, 12, 0, 0, 25, 0});
  EXPECT_THAT(ErrorOf([&] { Make({1}).expand({3}).add_(1); }),
              HasSubstr("add_: unsupported operation: more than one element"));
  // Bool destinations accept bool results.
  Tensor bb = tensor({true, false});
  bb.add_(tensor({false, true}));
  ExpectValues(bb, {1, 1});
  Tensor empty_t = empty({0});
  v = empty_t.version();
  empty_t.add_(1);
  EXPECT_GT(empty_t.version(), v);
}

// --- where -----------------------------------------------------------------------

TEST(WhereTest, EveryDtypeBroadcastingAndPromotion) {
  Tensor cond = tensor({true, false, true});
  for (Dtype dtype : kAllDtypes) {
    Tensor a = Make({1, 1, 1}, dtype), b = Make({0, 0, 0}, dtype);
    Tensor w = where(cond, a, b);
    EXPECT_EQ(w.dtype(), dtype);
    ExpectValues(w, {1, 0, 1}, std::string(dtype_name(dtype)));
  }
  // cond [3], a [2, 1], b 0-dim: [2, 3], promoted to float32.
  Tensor a = Make({1, 2}, {2, 1}, kInt64);
  Tensor w = where(cond, a, scalar_tensor(-0.5));
  EXPECT_EQ(w.sizes(), (SizeVector{2, 3}));
  EXPECT_EQ(w.dtype(), kFloat32);
  ExpectValues(w, {1, -0.5, 1, 2, -0.5, 2});
  // A 0-dim float64 tensor against a dimensioned int tensor: float64.
  EXPECT_EQ(where(cond, Make({1, 2, 3}, kInt32), scalar_tensor(1.0, kFloat64)).dtype(), kFloat64);
  EXPECT_EQ(where(cond, Make({1, 2, 3}, kInt16), Make({1, 2, 3}, kUInt8)).dtype(), kInt16);
  // Non-contiguous inputs.
  Tensor base = Make({1, 2, 3, 4}, {2, 2}, kFloat32);
  Tensor c2 = tensor({true, false, false, true}).view({2, 2}).t();
  ExpectValues(where(c2, base.t(), base.neg()), {1, -2, -3, 4});
  Tensor e = where(tensor({true}).slice(0, 0, 0), Make({1}), Make({2}));
  EXPECT_EQ(e.sizes(), (SizeVector{0}));
  EXPECT_THAT(ErrorOf([&] { where(Make({1, 0, 1}, kInt64), Make({1}), Make({2})); }),
              HasSubstr("where: expected condition to be a bool tensor, got int64"));
  EXPECT_THAT(ErrorOf([&] { where(cond, Make({1, 2}), Make({2})); }),
              HasSubstr("where: shapes [3] and [2] are not broadcastable"));
}

// Runs longer than the loop's chunk (cpu/loops.h) with an operand broadcast
// along them, in each position: every element against its own formula.
TEST(WhereTest, LongRunsWithABroadcastOperand) {
  const int64_t n = 1000;
  std::vector<double> xs(n), ys(n), cs(n);
  for (int64_t i = 0; i < n; ++i) {
    xs[i] = static_cast<double>(i);
    ys[i] = -static_cast<double>(i) - 1;
    cs[i] = (i * 7) % 3 == 0 ? 1 : 0;
  }
  Tensor x = tensor(xs), y = tensor(ys);
  Tensor c = tensor(cs).gt(0.5);
  Tensor s = scalar_tensor(0.5, kFloat64);
  const std::vector<double> a = Values(where(c, x, s)), b = Values(where(c, s, y)),
                            m = Values(x * s), d = Values(s - x);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i], cs[i] ? xs[i] : 0.5) << i;
    ASSERT_EQ(b[i], cs[i] ? 0.5 : ys[i]) << i;
    ASSERT_EQ(m[i], xs[i] * 0.5) << i;
    ASSERT_EQ(d[i], 0.5 - xs[i]) << i;
  }
}

// --- clamp -----------------------------------------------------------------------

TEST(ClampTest, BoundsEveryDtypeAndNaN) {
  for (Dtype dtype : kAllDtypes) {
    if (dtype == kBool) continue;
    std::string what(dtype_name(dtype));
    Tensor x = Make({0, 1, 2, 3, 4, 5}, dtype);
    Tensor both = x.clamp(1, 3);
    EXPECT_EQ(both.dtype(), dtype) << what;
    ExpectValues(both, {1, 1, 2, 3, 3, 3}, what);
    ExpectValues(x.clamp(2, std::nullopt), {2, 2, 2, 3, 4, 5}, what);
    ExpectValues(x.clamp(std::nullopt, 2), {0, 1, 2, 2, 2, 2}, what);
    ExpectValues(x.clamp(4, 1), {1, 1, 1, 1, 1, 1}, what);  // min > max: max.
  }
  // A float bound makes an integer tensor float32.
  Tensor i = Make({-2, 0, 2}, kInt64);
  Tensor c = i.clamp(-0.5, 1.5);
  EXPECT_EQ(c.dtype(), kFloat32);
  ExpectValues(c, {-0.5, 0, 1.5});
  // Bounds outside an integer dtype's range clamp nothing.
  ExpectValues(Make({0, 200}, kUInt8).clamp(-1, 1000), {0, 200});
  ExpectValues(Make({-100, 100}, kInt8).clamp(-1000, 50), {-100, 50});
  ExpectValues(Make({kNaN, -kInf, kInf, 0.5}).clamp(0, 1), {kNaN, 0, 1, 0.5});
  ExpectValues(Make({kNaN, 5.0}, kFloat16).clamp(std::nullopt, 1), {kNaN, 1});
  ExpectValues(Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32).t().clamp(2, 5), {2, 4, 2, 5, 3, 5});
  EXPECT_EQ(empty({0, 2}).clamp(0, 1).sizes(), (SizeVector{0, 2}));
  EXPECT_EQ(scalar_tensor(7.0).clamp(0, 1).item<double>(), 1.0);
  EXPECT_THAT(ErrorOf([&] { i.clamp(std::nullopt, std::nullopt); }),
              HasSubstr("At least one of 'min' or 'max' must not be None"));
  EXPECT_THAT(ErrorOf([&] { tensor({true}).clamp(false, true); }),
              HasSubstr("clamp: not supported for bool"));
}

TEST(ClampTest, InPlace) {
  Tensor x = Make({-3, 0, 3, 6}, {2, 2}, kFloat32);
  uint32_t v = x.version();
  Tensor r = x.clamp_(-1, 4);
  EXPECT_TRUE(r.is_same(x));
  EXPECT_GT(x.version(), v);
  ExpectValues(x, {-1, 0, 3, 4});
  x.t().select(0, 1).clamp_(std::nullopt, 1);  // Column 1: elements 1 and 3.
  ExpectValues(x, {-1, 0, 3, 1});
  Tensor i = Make({-3, 5}, kInt32);
  i.clamp_(0, 2);
  ExpectValues(i, {0, 2});
  EXPECT_THAT(ErrorOf([&] { i.clamp_(0.5, std::nullopt); }),
              HasSubstr("clamp_: result type float32 can't be cast to the desired output type "
                        "int32"));
  EXPECT_THAT(ErrorOf([&] { Make({1}).expand({2}).clamp_(0, 1); }),
              HasSubstr("clamp_: unsupported operation"));
}

TEST(ElementwiseTest, LargeTensorsUseEveryPathOfTheLoops) {
  // Big enough to be split over the thread pool, with a broadcast operand.
  const int64_t n = 1 << 18;
  Tensor a = arange(n).to(kFloat32).view({512, 512});
  Tensor b = arange(512).to(kFloat32);
  Tensor c = a + b;  // Row broadcast.
  Tensor d = a.t() * 2;  // Transposed.
  std::vector<double> vc = Values(c), vd = Values(d);
  for (int64_t i = 0; i < 512; ++i) {
    for (int64_t j = 0; j < 512; j += 37) {
      ASSERT_EQ(vc[i * 512 + j], static_cast<double>(i * 512 + j + j));
      ASSERT_EQ(vd[i * 512 + j], 2.0 * static_cast<double>(j * 512 + i));
    }
  }
}

}  // namespace
}  // namespace ember
