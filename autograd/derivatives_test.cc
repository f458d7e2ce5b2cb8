// Gradients of single ops against the values PyTorch 1.13 computes (printed
// by /usr/bin/python3 with torch on the development machine): number
// operands that stay double through the backward formula (Note [Number
// operands] in derivatives.cc), and torch's subgradients where an op has a
// kink or a zero denominator.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/scatter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::DoubleEq;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::Pointwise;

// d f(x).sum() / dx for x = `values` in `dtype`.
std::vector<double> GradOf(const std::function<Tensor(const Tensor&)>& f,
                           const std::vector<double>& values, SizeVector shape = {},
                           Dtype dtype = kFloat64) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  Tensor x = Make(values, shape, dtype).requires_grad_();
  f(x).sum().backward();
  if (!x.grad().defined()) return {};
  return Values(x.grad());
}

// Within a few units in the last place of a double: a number rounded to
// float32 on the way (the bug this guards against) is ~1e-8 off.
auto NearDouble(double v) { return DoubleNear(v, std::abs(v) * 1e-14); }
// Within a few units in the last place of a float.
auto NearFloat(double v) { return DoubleNear(v, std::abs(v) * 5e-7); }

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- Number operands -------------------------------------------------------------------

TEST(NumberOperandTest, PowByADoubleUsesTheDoubleExponent) {
  // torch: 1.7 * 2^0.7. With the exponent rounded to float32 on the way to
  // exponent - 1 the result was 2.7616582388890665.
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(1.7); }, {2.0}),
              ElementsAre(DoubleEq(2.7616581476112003)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(1.7); }, {2.0, 3.0}),
              ElementsAre(NearDouble(2.7616581476112003), NearDouble(3.668037775956808)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(-0.3); }, {2.0, 3.0}),
              ElementsAre(NearDouble(-0.12183785945343531), NearDouble(-0.07192230933248643)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(3); }, {2.0, 3.0}), ElementsAre(12, 27));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(1.7).pow(1.3); }, {2.0, 3.0}),
              ElementsAre(NearDouble(5.112561772861369), NearDouble(8.350432924949446)));
  // x^0: a zero gradient, as torch.
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(0.0); }, {0.0, 2.0}), ElementsAre(0, 0));
}

TEST(NumberOperandTest, InPlacePowUsesTheDoubleExponent) {
  Tensor x = Make({2.0, 3.0}, kFloat64).requires_grad_();
  Tensor y = x * 1;
  y.pow_(1.7);
  y.sum().backward();
  EXPECT_THAT(Values(x.grad()),
              ElementsAre(NearDouble(2.7616581476112003), NearDouble(3.668037775956808)));
}

TEST(NumberOperandTest, SecondDerivativeOfPowByADouble) {
  // d2/dx2 x^1.7 = 1.7 * 0.7 * x^-0.3, at x = 2: 1.19 * 2^-0.3.
  Tensor x = Make({2.0}, kFloat64).requires_grad_();
  Tensor g = grad({x.pow(1.7)}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  Tensor gg = grad({g}, {x})[0];
  EXPECT_THAT(Values(gg), ElementsAre(NearDouble(1.7 * 0.7 * std::pow(2.0, -0.3))));
}

TEST(NumberOperandTest, Float32GradientsMatchTorch) {
  auto f32 = [](const std::function<Tensor(const Tensor&)>& f) {
    return GradOf(f, {2.0, 3.0}, {}, kFloat32);
  };
  EXPECT_THAT(f32([](const Tensor& x) { return x.pow(1.7); }),
              ElementsAre(NearFloat(2.761658191680908), NearFloat(3.6680378913879395)));
  EXPECT_THAT(f32([](const Tensor& x) { return x.pow(-0.3); }),
              ElementsAre(NearFloat(-0.12183786183595657), NearFloat(-0.07192230969667435)));
  EXPECT_THAT(f32([](const Tensor& x) { return ones_like(x).add(x, 0.1); }),
              ElementsAre(0.10000000149011612, 0.10000000149011612));
  EXPECT_THAT(f32([](const Tensor& x) { return x * 0.1; }),
              ElementsAre(0.10000000149011612, 0.10000000149011612));
  EXPECT_THAT(f32([](const Tensor& x) { return x / 0.3; }),
              ElementsAre(3.3333332538604736, 3.3333332538604736));
  EXPECT_THAT(f32([](const Tensor& x) { return x.norm(3); }),
              ElementsAre(NearFloat(0.37383610010147095), NearFloat(0.8411312103271484)));
}

TEST(NumberOperandTest, Float64AlphaMulDivAndNorm) {
  EXPECT_THAT(GradOf([](const Tensor& x) { return ones_like(x).add(x, 0.1); }, {2.0, 3.0}),
              ElementsAre(0.1, 0.1));
  EXPECT_THAT(GradOf([](const Tensor& x) { return ones_like(x).sub(x, 0.3); }, {2.0, 3.0}),
              ElementsAre(-0.3, -0.3));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x * 0.1; }, {2.0, 3.0}), ElementsAre(0.1, 0.1));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x / 0.3; }, {2.0, 3.0}),
              ElementsAre(3.3333333333333335, 3.3333333333333335));
  EXPECT_THAT(GradOf([](const Tensor& x) { return 0.3 / x; }, {2.0, 3.0}),
              ElementsAre(-0.075, NearDouble(-0.03333333333333333)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(3); }, {2.0, 3.0}),
              ElementsAre(NearDouble(0.37383614973583884), NearDouble(0.8411313369056374)));
  // torch 1.13's forward norm for p = 1.7 is 1e-8 off (3.8109492824239193
  // for 3.810949322484545); the gradient here is the exact formula's,
  // |x|^(p-1) / norm^(p-1).
  const double n = std::pow(std::pow(2.0, 1.7) + std::pow(3.0, 1.7), 1 / 1.7);
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(1.7); }, {2.0, 3.0}),
              ElementsAre(NearDouble(std::pow(2.0 / n, 0.7)), NearDouble(std::pow(3.0 / n, 0.7))));
}

// --- Subgradients ---------------------------------------------------------------------------

TEST(SubgradientTest, StdOfASliceWithNoSpreadIsZeroNotNan) {
  const std::vector<double> z = {1, 1, 1, 1, 2, 4};
  EXPECT_THAT(
      GradOf([](const Tensor& x) { return x.std({1}); }, z, {2, 3}),
      Pointwise(DoubleNear(1e-15), std::vector<double>{0.0, 0.0, 0.0, -0.43643578047198484,
                                                       -0.10910894511799625, 0.5455447255899809}));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.std(); }, {3, 3, 3}), ElementsAre(0, 0, 0));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.std({}, 0, /*keepdim=*/true); }, {2, 2}),
              ElementsAre(0, 0));
  // var needs no mask: its gradient at zero spread is zero already.
  EXPECT_THAT(
      GradOf([](const Tensor& x) { return x.var({1}); }, z, {2, 3}),
      Pointwise(DoubleNear(1e-15), std::vector<double>{0.0, 0.0, 0.0, -1.3333333333333335,
                                                       -0.3333333333333335, 1.6666666666666665}));
}

TEST(SubgradientTest, NormOfAZeroVectorIsZeroNotNan) {
  for (double p : {0.5, 1.0, 1.5, 2.0, 3.0, kInf, -kInf}) {
    EXPECT_THAT(GradOf([p](const Tensor& x) { return x.norm(p); }, {0, 0, 0}), ElementsAre(0, 0, 0))
        << "p = " << p;
  }
  // p = 0 counts non-zeros: no gradient at all, as torch (grad stays undefined).
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(0); }, {0, 1, 2}), ElementsAre());
}

TEST(SubgradientTest, NormGradientsMatchTorch) {
  const std::vector<double> v = {0, -2, 2};
  const double r = 0.7071067811865475;
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(); }, v),
              ElementsAre(0, NearDouble(-r), NearDouble(r)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(0.5); }, v),
              ElementsAre(0, NearDouble(-2), NearDouble(2)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(1); }, v), ElementsAre(0, -1, 1));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(1.5); }, v),
              ElementsAre(0, NearDouble(-0.7937005259840998), NearDouble(0.7937005259840998)));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(3); }, v),
              ElementsAre(0, NearDouble(-0.6299605249474365), NearDouble(0.6299605249474365)));
  // Ties share the gradient of an infinity norm.
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.norm(kInf); }, v), ElementsAre(0, -0.5, 0.5));
  // Over a dim, with one all-equal row.
  const std::vector<double> z = {1, 1, 1, 1, 2, 4};
  EXPECT_THAT(
      GradOf([](const Tensor& x) { return x.norm(2, {1}); }, z, {2, 3}),
      Pointwise(DoubleNear(1e-15),
                std::vector<double>{0.5773502691896258, 0.5773502691896258, 0.5773502691896258,
                                    0.2182178902359924, 0.4364357804719848, 0.8728715609439696}));
  EXPECT_THAT(
      GradOf([](const Tensor& x) { return x.norm(0.5, {1}, /*keepdim=*/true); }, z, {2, 3}),
      Pointwise(DoubleNear(1e-14), std::vector<double>{3.0, 3.0, 3.0, 4.414213562373095,
                                                       3.1213203435596424, 2.2071067811865475}));
  EXPECT_THAT(
      GradOf([](const Tensor& x) { return x.norm(kInf, {1}); }, z, {2, 3}),
      Pointwise(DoubleNear(1e-15), std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0, 1}));
  EXPECT_THAT(
      GradOf([](const Tensor& x) { return x.norm(-kInf, {1}); }, z, {2, 3}),
      Pointwise(DoubleNear(1e-15), std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3, 1, 0, 0}));
}

TEST(SubgradientTest, KinksTakeTorchsConventions) {
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.abs(); }, {0, -1, 1}), ElementsAre(0, -1, 1));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.relu(); }, {0, -1, 1}), ElementsAre(0, 0, 1));
  // The bounds belong to the pass-through region.
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.clamp(0, 1); }, {0, -1, 1, 0.5, 2}),
              ElementsAre(1, 0, 1, 1, 0));
  // Full max/min and amax split among ties; max(dim) picks its index.
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.max(); }, {1, 3, 3}), ElementsAre(0, 0.5, 0.5));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.amax({0}); }, {1, 3, 3}),
              ElementsAre(0, 0.5, 0.5));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.max(0).values; }, {1, 3, 3}),
              ElementsAre(0, 1, 0));
  EXPECT_THAT(GradOf(
                  [](const Tensor& x) {
                    return maximum(x, Make({1, 0, 3}, kFloat64));
                  },
                  {1, 3, 3}),
              ElementsAre(0.5, 1, 0.5));
  // No subgradient where torch has none: sqrt and pow below 1 at 0 are infinite.
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.sqrt(); }, {0, 1}), ElementsAre(kInf, 0.5));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.pow(0.5); }, {0, 1}), ElementsAre(kInf, 0.5));
  EXPECT_THAT(GradOf([](const Tensor& x) { return x.prod(); }, {0, 2, 3}), ElementsAre(6, 0, 0));
}

TEST(SubgradientTest, StdAndNormRecordTheirOwnNode) {
  Tensor x = Make({1, 2, 3}).requires_grad_();
  EXPECT_EQ(x.std().grad_fn()->name(), "StdBackward");
  EXPECT_EQ(x.norm().grad_fn()->name(), "NormBackward");
  // Second derivatives through the formulas.
  Tensor g = grad({x.norm()}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  EXPECT_TRUE(g.requires_grad());
  NoGradGuard no_grad;
  EXPECT_FALSE(x.std().requires_grad());
}

// --- Scatter-adds on any device (autograd/scatter.h) -----------------------------------

// The device-generic paths run on the CPU here; a CUDA gradient takes them
// with the same ops on its device.
// A Linear's backward takes the fused gemm_bias_grad_out outside
// create_graph and the recorded formula under it; both give the bias's
// column sums and the weight's x^T g, computed here with mm and sum.
TEST(AddmmBackwardTest, ABiasRowGivesTheSameGradientsFusedAndRecorded) {
  manual_seed(21);
  const Tensor x0 = randn({7, 3}), w0 = randn({4, 3}), b0 = randn({4}), g = randn({7, 4});
  for (bool create_graph : {false, true}) {
    Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
           b = b0.clone().requires_grad_(true);
    Tensor y = addmm(b, x, w.t());
    variable_list grads = grad({y}, {b, x, w}, {g}, std::nullopt, create_graph);
    const std::string what = create_graph ? "recorded" : "fused";
    EXPECT_THAT(Values(grads[0]), Pointwise(DoubleNear(1e-5), Values(g.sum(std::vector<int64_t>{0}))))
        << what;
    EXPECT_THAT(Values(grads[1]), Pointwise(DoubleNear(1e-5), Values(g.mm(w0)))) << what;
    EXPECT_THAT(Values(grads[2]), Pointwise(DoubleNear(1e-5), Values(g.t().mm(x0)))) << what;
    EXPECT_EQ(grads[2].sizes(), w0.sizes()) << what;
  }
}

TEST(ScatterTest, IndexAddByGatherAddsRepeatedAndNegativeIndices) {
  const Tensor grad = randn({3, 4, 5}, TensorOptions(kFloat64));
  const Tensor index = Make({2, -1, 2, 0}, {4}, kInt64);  // -1 is row 5; 2 twice
  const SizeVector sizes = {3, 6, 5};
  // Expected, element by element.
  std::vector<double> expected(3 * 6 * 5, 0.0);
  const std::vector<double> g = Values(grad);
  const int64_t rows[4] = {2, 5, 2, 0};
  for (int64_t o = 0; o < 3; ++o) {
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t k = 0; k < 5; ++k) expected[(o * 6 + rows[i]) * 5 + k] += g[(o * 4 + i) * 5 + k];
    }
  }
  for (const Tensor& got :
       {internal::IndexAddByGather(sizes, 1, index, grad), IndexAdd(sizes, 1, index, grad)}) {
    ASSERT_EQ(got.sizes(), sizes);
    EXPECT_EQ(got.dtype(), kFloat64);
    EXPECT_THAT(Values(got), Pointwise(DoubleNear(1e-12), expected));
  }
  // The index may live elsewhere (int32 here) and the gradient be float32.
  const Tensor g32 = grad.to(kFloat32);
  EXPECT_THAT(Values(internal::IndexAddByGather(sizes, -2, index.to(kInt32), g32)),
              Pointwise(DoubleNear(1e-5), expected));
  // Empty index: zeros.
  EXPECT_THAT(Values(internal::IndexAddByGather({2, 3}, 0, Make({}, {0}, kInt64),
                                                zeros({0, 3}, TensorOptions(kFloat64)))),
              ElementsAreArray(std::vector<double>(6, 0.0)));
}

TEST(ScatterTest, IndexAddByGatherSumsGroupsOfEveryLength) {
  // Targets reached 0, 1, 2, 3 and 5 times (buckets of padded length 1, 2,
  // 4 and 8), in scattered order.
  const std::vector<int64_t> index = {4, 1, 4, 3, 2, 4, 3, 2, 4, 3, 4};
  const int64_t n = static_cast<int64_t>(index.size());
  const Tensor grad = randn({2, n, 3}, TensorOptions(kFloat64));
  const std::vector<double> g = Values(grad);
  std::vector<double> expected(2 * 6 * 3, 0.0);
  for (int64_t o = 0; o < 2; ++o) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < 3; ++k) {
        expected[(o * 6 + index[i]) * 3 + k] += g[(o * n + i) * 3 + k];
      }
    }
  }
  const Tensor got = internal::IndexAddByGather({2, 6, 3}, 1, tensor(index), grad);
  EXPECT_THAT(Values(got), Pointwise(DoubleNear(1e-12), expected));
  // A transposed (non-contiguous) gradient gives the same.
  const Tensor strided = grad.transpose(0, 2).contiguous().transpose(0, 2);
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_THAT(Values(internal::IndexAddByGather({2, 6, 3}, 1, tensor(index), strided)),
              Pointwise(DoubleNear(1e-12), expected));
}

TEST(ScatterTest, IndexAddByGatherNamesAnIndexOutOfRange) {
  const Tensor grad = ones({3}, TensorOptions(kFloat32));
  try {
    internal::IndexAddByGather({4}, 0, Make({1, 4, 0}, {3}, kInt64), grad);
    FAIL() << "index 4 of a dimension of size 4 was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("index 4 is out of bounds for dimension 0 with size 4"));
  }
}

TEST(ScatterTest, OverlapIsDetectedFromStrides) {
  auto geometry = [](SizeVector sizes, SizeVector strides) {
    return StridedGeometry{sizes, strides, 0};
  };
  EXPECT_FALSE(internal::MayOverlapItself(geometry({3, 4}, {4, 1})));  // contiguous
  EXPECT_FALSE(internal::MayOverlapItself(geometry({4, 3}, {1, 4})));  // transposed
  EXPECT_FALSE(internal::MayOverlapItself(geometry({2, 2}, {5, 2})));  // gaps
  EXPECT_FALSE(internal::MayOverlapItself(geometry({1, 5}, {0, 1})));  // size-1 stride 0
  EXPECT_TRUE(internal::MayOverlapItself(geometry({3, 3}, {1, 1})));   // sliding windows
  EXPECT_TRUE(internal::MayOverlapItself(geometry({4, 2}, {0, 1})));   // expanded
  EXPECT_TRUE(internal::MayOverlapItself(geometry({2, 3}, {2, 1})));   // rows overlap
}

TEST(ScatterTest, AsStridedBackwardAddsWhereWindowsOverlapOnEveryPath) {
  // x (5 elements) read as 3 overlapping windows of 3: x[j] is read
  // min(j + 1, 3, 5 - j) times.
  const StridedGeometry input{{5}, {1}, 0};
  const StridedGeometry windows{{3, 3}, {1, 1}, 0};
  const Tensor grad = Make({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}, kFloat64);
  // grad[w][k] goes to x[w + k].
  const std::vector<double> expected = {1, 2 + 4, 3 + 5 + 7, 6 + 8, 9};
  EXPECT_THAT(Values(AsStridedBackward(grad, input, windows)), ElementsAreArray(expected));
  EXPECT_THAT(Values(internal::AsStridedBackwardByOps(grad, input, windows)),
              Pointwise(DoubleNear(1e-12), expected));
  // Without overlap (every other element, offset 1): a strided copy.
  const StridedGeometry every_other{{2}, {2}, 1};
  const Tensor g2 = Make({10, 20}, {2}, kFloat64);
  for (const Tensor& got : {AsStridedBackward(g2, input, every_other),
                            internal::AsStridedBackwardByOps(g2, input, every_other)}) {
    EXPECT_THAT(Values(got), ElementsAre(0, 10, 0, 20, 0));
  }
}

TEST(ScatterTest, GradientsOfGatheringViewsThroughAutograd) {
  Tensor x = arange(6, TensorOptions(kFloat64)).requires_grad_();
  // Overlapping as_strided: the CPU loop.
  x.as_strided({2, 3}, {2, 1}, 0)
      .mul(Make({1, 1, 1, 10, 10, 10}, {2, 3}, kFloat64))
      .sum()
      .backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(1, 1, 11, 10, 10, 0));
  // index_select with a repeated index: IndexAdd.
  Tensor y = arange(4, TensorOptions(kFloat64)).requires_grad_();
  y.index_select(0, Make({3, 1, 3}, {3}, kInt64)).sum().backward();
  EXPECT_THAT(Values(y.grad()), ElementsAre(0, 1, 0, 2));
}

TEST(MaxMinDimTest, BackwardPutsTheGradientAtTheChosenIndex) {
  Tensor x = Make({3, 9, 2, 7, 1, 8}, {2, 3}, kFloat64).requires_grad_();
  auto [values, indices] = x.max(1, /*keepdim=*/false);
  values.mul(Make({10, 100}, {2}, kFloat64)).sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(0, 10, 0, 0, 0, 100));
  Tensor y = Make({3, 9, 2, 7, 1, 8}, {2, 3}, kFloat64).requires_grad_();
  auto [min_values, min_indices] = y.min(0, /*keepdim=*/true);
  min_values.sum().backward();
  EXPECT_THAT(Values(y.grad()), ElementsAre(1, 0, 1, 0, 1, 0));
}

// --- The same gradients on a CUDA device ----------------------------------------------

// d f(x).sum() / dx on `device`, as host values.
std::vector<double> GradOn(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                           Device device) {
  Tensor on = x.clone().to(device).requires_grad_();  // a fresh leaf on every device
  f(on).sum().backward();
  EXPECT_EQ(on.grad().device(), device) << "the gradient stays on its device";
  return Values(on.grad().to(kCPU));
}

// The CPU side runs everywhere (each case computes there); the device side
// needs a GPU.
TEST(CudaGradientsTest, GatheringOpsBackwardOnTheDeviceMatchTheCpu) {
  const Tensor x = randn({4, 6}, TensorOptions(kFloat64));
  const Tensor weights = randn({4, 6}, TensorOptions(kFloat64));
  auto weighted = [&](const Tensor& y) { return y.mul(weights.to(y.device())); };
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> cases = {
      {"max(dim)", [](const Tensor& t) { return t.max(1).values; }},
      {"min(dim, keepdim)", [](const Tensor& t) { return t.min(0, true).values; }},
      {"index_select with repeats",
       [](const Tensor& t) {
         return t.index_select(1, Make({5, 0, 5, 2, 5}, {5}, kInt64).to(t.device()));
       }},
      {"masked_select", [](const Tensor& t) { return t.masked_select(t.gt(0)); }},
      {"stepped slice", [](const Tensor& t) { return t.slice(1, 0, 6, 2); }},
      {"overlapping as_strided",
       [](const Tensor& t) {
         return t.as_strided({3, 4}, {2, 1}, 1);
       }},
      {"write through a view",
       [&](const Tensor& t) {
         Tensor y = t.mul(1.0);
         y.slice(0, 1, 3).mul_(3.0);
         return weighted(y);
       }},
  };
  std::vector<std::vector<double>> on_cpu;
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    on_cpu.push_back(GradOn(f, x, kCPU));
    EXPECT_EQ(on_cpu.back().size(), 24u);
  }
  if (ember::device_count(DeviceType::kCUDA) == 0) {
    GTEST_SKIP() << "no usable CUDA device; the device side checks max/min(dim), index_select, "
                    "masked_select, stepped slices, as_strided and view-write backward on cuda:0";
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    EXPECT_THAT(GradOn(cases[i].second, x, Device(DeviceType::kCUDA, 0)),
                Pointwise(DoubleNear(1e-12), on_cpu[i]));
  }
}

}  // namespace
}  // namespace ember::autograd
