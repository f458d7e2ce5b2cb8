// Layers: forward values against naive loops written here, output shapes,
// gradients against finite differences (nn/testing.h), running statistics,
// errors, and a small CNN of the kind the hub builds.
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "nn/pooling.h"
#include "nn/testing.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using ::ember::nn::testing::ExpectGradientsMatch;
using ::ember::nn::testing::ExpectSecondDerivativesMatch;
using ::ember::nn::testing::Values;
using ::testing::HasSubstr;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << i;
  }
}

Tensor Randn64(IntArrayRef sizes) { return randn(sizes, TensorOptions(kFloat64)); }

// --- Linear ------------------------------------------------------------------------

TEST(LinearTest, ForwardIsXTimesWeightTransposedPlusBias) {
  manual_seed(0);
  Linear fc(3, 2);
  Tensor x = randn({4, 3});
  std::vector<double> xv = Values(x), w = Values(fc.weight()), b = Values(fc.bias()), want;
  for (int i = 0; i < 4; ++i) {
    for (int o = 0; o < 2; ++o) {
      double s = b[o];
      for (int k = 0; k < 3; ++k) s += xv[i * 3 + k] * w[o * 3 + k];
      want.push_back(s);
    }
  }
  ExpectNear(Values(fc(x)), want, 1e-5);
  // Leading dims are kept.
  EXPECT_EQ(fc(randn({2, 5, 3})).sizes(), (IntArrayRef{2, 5, 2}));
  EXPECT_THAT(ErrorOf([&] {
                fc(randn({4, 5}));
              }),
              HasSubstr("the input's last dim (5) doesn't match in_features (3)"));
}

TEST(LinearTest, DefaultInitIsBoundedByOneOverSqrtFanIn) {
  manual_seed(0);
  Linear fc(100, 50);
  const double bound = 1.0 / std::sqrt(100.0);
  EXPECT_LE(fc.weight().abs().max().item<double>(), bound);
  EXPECT_GT(fc.weight().abs().max().item<double>(), 0.9 * bound);
  EXPECT_LE(fc.bias().abs().max().item<double>(), bound);
}

TEST(LinearTest, GradientsMatchFiniteDifferences) {
  manual_seed(1);
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) { return functional::linear(in[0], in[1], in[2]); },
      {Randn64({4, 3}), Randn64({2, 3}), Randn64({2})});
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) { return functional::linear(in[0], in[1]); },
      {Randn64({2, 3, 3}), Randn64({2, 3})});
}

// The weight and bias gradients come from one gemm_bias_grad_out outside
// create_graph (Note [Bias epilogue]) and from recorded ops under it; both
// are g^T x and g's column sums, computed here with plain ops.
TEST(LinearTest, FusedAndRecordedBackwardGiveTheSameGradients) {
  manual_seed(12);
  const Tensor x0 = randn({7, 3}), w0 = randn({4, 3}), b0 = randn({4}), g = randn({7, 4});
  for (bool create_graph : {false, true}) {
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
           b = b0.clone().requires_grad_();
    Tensor y = functional::linear(x, w, b);
    std::vector<Tensor> grads = autograd::grad({y}, {x, w, b}, {g}, std::nullopt, create_graph);
    SCOPED_TRACE(create_graph ? "recorded" : "fused");
    ExpectNear(Values(grads[0]), Values(g.mm(w0)), 1e-5);
    ExpectNear(Values(grads[1]), Values(g.t().mm(x0)), 1e-5);
    ExpectNear(Values(grads[2]), Values(g.sum(std::vector<int64_t>{0})), 1e-5);
    EXPECT_EQ(grads[1].sizes(), w0.sizes());
    EXPECT_TRUE(grads[1].is_contiguous());
  }
}

// Note [Linear and its activation]: linear_activation is the two calls,
// values and gradients (the CPU runs the composite: GEMM, then activation).
TEST(LinearTest, LinearActivationIsTheLinearThenTheActivation) {
  manual_seed(16);
  const Tensor x0 = randn({6, 5}), w0 = randn({3, 5}), b0 = randn({3}), g = randn({6, 3});
  for (auto act : {functional::LinearActivation::kReLU, functional::LinearActivation::kGeluTanh}) {
    const bool relu = act == functional::LinearActivation::kReLU;
    SCOPED_TRACE(relu ? "relu" : "gelu tanh");
    std::vector<Tensor> fused_in = {x0.clone().requires_grad_(), w0.clone().requires_grad_(),
                                    b0.clone().requires_grad_()};
    std::vector<Tensor> plain_in = {x0.clone().requires_grad_(), w0.clone().requires_grad_(),
                                    b0.clone().requires_grad_()};
    Tensor fused = functional::linear_activation(fused_in[0], fused_in[1], fused_in[2], act);
    Tensor z = functional::linear(plain_in[0], plain_in[1], plain_in[2]);
    Tensor plain = relu ? functional::relu(z) : functional::gelu(z, "tanh");
    ExpectNear(Values(fused), Values(plain), 1e-6);
    std::vector<Tensor> gf = autograd::grad({fused}, fused_in, {g});
    std::vector<Tensor> gp = autograd::grad({plain}, plain_in, {g});
    for (int i = 0; i < 3; ++i) ExpectNear(Values(gf[i]), Values(gp[i]), 1e-5);
  }
  // Leading dims fold into rows, as linear's.
  Tensor x3 = randn({2, 4, 5});
  Tensor y3 = functional::linear_activation(x3, w0, b0, functional::LinearActivation::kReLU);
  EXPECT_EQ(y3.sizes(), (IntArrayRef{2, 4, 3}));
  ExpectNear(Values(y3), Values(functional::relu(functional::linear(x3, w0, b0))), 1e-6);
}

TEST(LinearTest, LinearActivationGradientsMatchFiniteDifferences) {
  manual_seed(17);
  for (auto act : {functional::LinearActivation::kReLU, functional::LinearActivation::kGeluTanh}) {
    auto fn = [act](const std::vector<Tensor>& in) {
      return functional::linear_activation(in[0], in[1], in[2], act);
    };
    ExpectGradientsMatch(fn, {Randn64({4, 3}), Randn64({2, 3}), Randn64({2})});
    if (act == functional::LinearActivation::kGeluTanh) {
      ExpectSecondDerivativesMatch(fn, {Randn64({3, 2}), Randn64({2, 2}), Randn64({2})});
    }
  }
}

TEST(LinearTest, LinearActivationNeedsABiasAndTheCpuDoesNotFuse) {
  EXPECT_THROW(
      {
        try {
          functional::linear_activation(randn({2, 3}), randn({4, 3}), Tensor(),
                                        functional::LinearActivation::kReLU);
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), ::testing::HasSubstr("the bias must be defined"));
          throw;
        }
      },
      Error);
  EXPECT_FALSE(functional::fuses_linear_activation(Device(DeviceType::kCPU)));
}

TEST(LinearTest, SupportsDoubleBackward) {
  manual_seed(13);
  Tensor x = randn({2, 3}, kFloat64).requires_grad_();
  Tensor w = randn({4, 3}, kFloat64).requires_grad_();
  Tensor y = functional::linear(x, w);
  // g = d/dx sum(y^2) = 2 (x W^T) W, recorded; d/dx sum(g) = 2 (W^T W) 1 per row.
  Tensor g = autograd::grad({(y * y).sum()}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  Tensor second = autograd::grad({g.sum()}, {x})[0];
  Tensor want = (w.detach().t().mm(w.detach())).sum({1}) * 2.0;
  for (int i = 0; i < 2; ++i) ExpectNear(Values(second[i]), Values(want), 1e-12);
}

TEST(LinearTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(14);
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        Tensor y = functional::linear(in[0], in[1], in[2]);
        return y * y;
      },
      {Randn64({3, 2}), Randn64({4, 2}), Randn64({4})});
}

// --- Activations ------------------------------------------------------------------

TEST(ActivationTest, ValuesAndReluGradient) {
  Tensor x = tensor({-2.0f, -0.5f, 0.0f, 1.5f});
  EXPECT_EQ(Values(ReLU()(x)), (std::vector<double>{0, 0, 0, 1.5}));
  ExpectNear(Values(Tanh()(x)), {std::tanh(-2.0), std::tanh(-0.5), 0.0, std::tanh(1.5)}, 1e-6);
  ExpectNear(Values(Sigmoid()(x)),
             {1 / (1 + std::exp(2.0)), 1 / (1 + std::exp(0.5)), 0.5, 1 / (1 + std::exp(-1.5))},
             1e-6);
  ExpectNear(Values(GELU()(x)),
             {-2 * 0.5 * (1 + std::erf(-2 / std::sqrt(2.0))),
              -0.5 * 0.5 * (1 + std::erf(-0.5 / std::sqrt(2.0))), 0.0,
              1.5 * 0.5 * (1 + std::erf(1.5 / std::sqrt(2.0)))},
             1e-5);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return functional::relu(in[0]); },
                       {tensor({-2.0, -0.5, 0.25, 1.5}).view({2, 2})});
  EXPECT_TRUE(std::isnan(functional::relu(tensor({NAN})).item<double>()));
  // A NaN output passes its gradient, as torch's threshold_backward (both
  // paths: nn's kernel, and the tensor op's derivative).
  for (bool tensor_op : {false, true}) {
    Tensor v = tensor({NAN, -1.0f, 2.0f}).requires_grad_();
    (tensor_op ? v.relu() : functional::relu(v)).sum().backward();
    EXPECT_EQ(Values(v.grad()), (std::vector<double>{1, 0, 1})) << "tensor op " << tensor_op;
  }
  // Non-contiguous input takes the tensor-op path and agrees.
  Tensor m = randn({3, 4});
  EXPECT_TRUE(functional::relu(m.t()).equal(m.t().relu()));
}

TEST(ActivationTest, ReluOnSeveralThreadsMatchesItsDefinition) {
  // Large enough to split across the intra-op pool: each element, forward
  // and backward, by its definition.
  const int threads = get_num_threads();
  set_num_threads(3);
  const int64_t n = 100003;
  Tensor x = randn({n}).requires_grad_();
  Tensor g = randn({n});
  Tensor y = functional::relu(x);
  y.backward(g);
  const std::vector<double> xs = Values(x), ys = Values(y), gs = Values(g), gx = Values(x.grad());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(ys[i], xs[i] > 0 ? xs[i] : 0.0) << i;
    ASSERT_EQ(gx[i], xs[i] > 0 ? gs[i] : 0.0) << i;
  }
  set_num_threads(threads);
}

TEST(ActivationTest, ReluSecondDerivativesMatchFiniteDifferences) {
  manual_seed(15);
  // relu(x) * x: its second derivative 2 [x > 0] is not zero, so a recorded
  // backward that lost the mask or the dependence on x would fail.
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) { return functional::relu(in[0]) * in[0]; },
      {Randn64({3, 4})});
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) { return functional::relu(in[0]); }, {Randn64({2, 5})});
}

// --- Conv2d ------------------------------------------------------------------------

// Direct convolution in double precision.
std::vector<double> NaiveConv(const Tensor& x, const Tensor& w, const Tensor& b, Int2 stride,
                              Int2 pad, Int2 dil, int64_t groups) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
  const int64_t ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
  std::vector<double> xv = Values(x), wv = Values(w),
                      bv = b.defined() ? Values(b) : std::vector<double>(o, 0.0);
  std::vector<double> out;
  const int64_t og = o / groups;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double s = bv[oc];
          const int64_t g = oc / og;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = y * stride[0] - pad[0] + i * dil[0];
                const int64_t ix = xx * stride[1] - pad[1] + j * dil[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += xv[((in * c + g * cg + ic) * h + iy) * wd + ix] *
                     wv[((oc * cg + ic) * kh + i) * kw + j];
              }
          out.push_back(s);
        }
  (void)c;
  return out;
}

TEST(Conv2dTest, ForwardMatchesDirectConvolution) {
  manual_seed(2);
  struct Case {
    Int2 stride, pad, dil;
    int64_t groups;
    bool bias;
  };
  for (const Case& k :
       {Case{{1, 1}, {0, 0}, {1, 1}, 1, true}, Case{{2, 1}, {1, 2}, {1, 1}, 1, false},
        Case{{1, 2}, {2, 1}, {2, 1}, 2, true}}) {
    Conv2d conv(Conv2dOptions{.in_channels = 4,
                              .out_channels = 6,
                              .kernel_size = {3, 2},
                              .stride = k.stride,
                              .padding = k.pad,
                              .dilation = k.dil,
                              .groups = k.groups,
                              .bias = k.bias});
    Tensor x = randn({2, 4, 7, 6});
    Tensor y = conv(x);
    ExpectNear(Values(y),
               NaiveConv(x, conv.weight(), conv.bias(), k.stride, k.pad, k.dil, k.groups), 1e-4);
  }
}

TEST(Conv2dTest, ResNetStemShapes) {
  Conv2d stem(Conv2dOptions{.in_channels = 3,
                            .out_channels = 8,
                            .kernel_size = {7, 7},
                            .stride = {2, 2},
                            .padding = {3, 3},
                            .bias = false});
  EXPECT_FALSE(stem.bias().defined());
  EXPECT_EQ(stem.parameters().size(), 1u);
  EXPECT_EQ(stem(randn({1, 3, 32, 32})).sizes(), (IntArrayRef{1, 8, 16, 16}));
  EXPECT_EQ(stem(randn({3, 20, 20})).sizes(), (IntArrayRef{8, 10, 10}));
}

TEST(Conv2dTest, GradientsMatchFiniteDifferences) {
  manual_seed(3);
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::conv2d(in[0], in[1], in[2], {2, 1}, {1, 1}, {1, 2}, 1);
      },
      {Randn64({2, 2, 5, 5}), Randn64({3, 2, 3, 2}), Randn64({3})});
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::conv2d(in[0], in[1], Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
      },
      {Randn64({1, 4, 4, 4}), Randn64({2, 2, 2, 2})});
}

TEST(Conv2dTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(16);
  // Squared output: every pair of (x, w, bias, v) has a second derivative.
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        Tensor y = functional::conv2d(in[0], in[1], in[2], {2, 1}, {1, 0}, {1, 2});
        return y * y;
      },
      {Randn64({2, 2, 5, 6}), Randn64({3, 2, 2, 2}), Randn64({3})});
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        Tensor y = functional::conv2d(in[0], in[1], Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
        return y * y;
      },
      {Randn64({1, 4, 4, 4}), Randn64({2, 2, 2, 2})});
  // Linear in x: the recorded gradient's own gradient is a convolution again.
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) { return functional::conv2d(in[0], in[1]); },
      {Randn64({1, 2, 4, 4}), Randn64({2, 2, 3, 3})});
}

TEST(Conv2dTest, ErrorsNameTheShapes) {
  Conv2d conv(3, 4, 3);
  EXPECT_THAT(ErrorOf([&] { conv(randn({1, 2, 5, 5})); }), HasSubstr("to have 3 channels"));
  EXPECT_THAT(ErrorOf([&] {
                conv(randn({1, 3, 2, 2}));
              }),
              HasSubstr("Kernel size can't be greater than actual input size"));
  EXPECT_THAT(
      ErrorOf([&] { Conv2d(Conv2dOptions{.in_channels = 3, .out_channels = 4, .groups = 2}); }),
      HasSubstr("in_channels must be divisible by groups"));
}

// --- Pooling ----------------------------------------------------------------------

TEST(PoolingTest, MaxPoolPicksWindowMaximaWithPadding) {
  Tensor x = arange(16).to(kFloat32).view({1, 1, 4, 4});
  MaxPool2d pool(MaxPool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  Tensor y = pool(x);
  EXPECT_EQ(y.sizes(), (IntArrayRef{1, 1, 2, 2}));
  EXPECT_EQ(Values(y), (std::vector<double>{5, 7, 13, 15}));
  // ceil_mode keeps a last partial window.
  MaxPool2d ceil(MaxPool2dOptions{.kernel_size = {2, 2}, .stride = {2, 2}, .ceil_mode = true});
  EXPECT_EQ(ceil(arange(25).to(kFloat32).view({1, 1, 5, 5})).sizes(), (IntArrayRef{1, 1, 3, 3}));
  EXPECT_THAT(ErrorOf([&] {
                MaxPool2d(MaxPool2dOptions{.kernel_size = {2, 2}, .padding = {2, 2}})(x);
              }),
              HasSubstr("pad should be at most half of effective kernel size"));
}

TEST(PoolingTest, MaxPoolGradientGoesToTheMaxima) {
  manual_seed(4);
  // A permutation: distinct values, so finite differences see no ties.
  Tensor x = (randn({2, 2, 5, 5}, kFloat64) * 10).round() +
             arange(100).to(kFloat64).view({2, 2, 5, 5}) * 0.001;
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::max_pool2d(in[0],
                                      {.kernel_size = {2, 3}, .stride = {2, 1}, .padding = {1, 1}});
      },
      {x});
}

TEST(PoolingTest, MaxPoolSecondDerivativesMatchFiniteDifferences) {
  manual_seed(7);
  Tensor x = (randn({2, 2, 5, 5}, kFloat64) * 10).round() +
             arange(100).to(kFloat64).view({2, 2, 5, 5}) * 0.001;
  // Squared, so that the second derivative with respect to x is not zero.
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        Tensor y = functional::max_pool2d(
            in[0], {.kernel_size = {2, 3}, .stride = {2, 1}, .padding = {1, 1}});
        return y * y;
      },
      {x});
  // Third order: the gather at the indices is recorded too.
  Tensor leaf = x.clone().requires_grad_();
  Tensor y = functional::max_pool2d(leaf, {.kernel_size = {2, 2}});
  Tensor v = randn(y.sizes(), kFloat64).requires_grad_();
  Tensor g = autograd::grad({y}, {leaf}, {v}, std::nullopt, /*create_graph=*/true)[0];
  Tensor gv = autograd::grad({(g * g).sum()}, {v}, {}, std::nullopt, /*create_graph=*/true)[0];
  ExpectNear(Values(gv), Values(v * 2.0), 1e-12);  // Each window's maximum is picked once.
  EXPECT_TRUE(gv.requires_grad());
}

TEST(PoolingTest, AvgPoolCountsPaddingUnlessTold) {
  Tensor x = ones({1, 1, 2, 2});
  AvgPool2dOptions o{.kernel_size = {2, 2}, .stride = {1, 1}, .padding = {1, 1}};
  EXPECT_EQ(Values(functional::avg_pool2d(x, o)),
            (std::vector<double>{0.25, 0.5, 0.25, 0.5, 1, 0.5, 0.25, 0.5, 0.25}));
  o.count_include_pad = false;
  EXPECT_EQ(Values(functional::avg_pool2d(x, o)), std::vector<double>(9, 1.0));
  manual_seed(5);
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::avg_pool2d(in[0],
                                      {.kernel_size = {3, 2}, .stride = {2, 2}, .padding = {1, 1}});
      },
      {Randn64({1, 2, 5, 4})});
}

TEST(PoolingTest, AdaptiveAvgPoolAveragesPyTorchWindows) {
  manual_seed(6);
  Tensor x = randn({2, 3, 5, 7});
  AdaptiveAvgPool2d gap(Int2{1, 1});
  ExpectNear(Values(gap(x).flatten()), Values(x.mean({2, 3})), 1e-5);
  // 5 -> 3: windows [0, 2), [1, 4), [3, 5).
  Tensor row = arange(5).to(kFloat32).view({1, 1, 5, 1});
  EXPECT_EQ(Values(functional::adaptive_avg_pool2d(row, {3, 1})),
            (std::vector<double>{0.5, 2, 3.5}));
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::adaptive_avg_pool2d(in[0], {2, 3});
      },
      {Randn64({1, 2, 5, 7})});
}

TEST(PoolingTest, AvgPoolSecondDerivativesMatchFiniteDifferences) {
  manual_seed(8);
  for (bool include_pad : {true, false}) {
    ExpectSecondDerivativesMatch(
        [&](const std::vector<Tensor>& in) {
          Tensor y = functional::avg_pool2d(in[0], {.kernel_size = {3, 2},
                                                    .stride = {2, 2},
                                                    .padding = {1, 1},
                                                    .ceil_mode = true,
                                                    .count_include_pad = include_pad});
          return y * y;
        },
        {Randn64({1, 2, 5, 4})});
  }
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        Tensor y = functional::adaptive_avg_pool2d(in[0], {2, 3});
        return y * y;
      },
      {Randn64({1, 2, 5, 7})});
}

// --- Normalisation ---------------------------------------------------------------

TEST(BatchNormTest, TrainingNormalisesAndUpdatesRunningStats) {
  manual_seed(7);
  BatchNorm2d bn(3);
  Tensor x = randn({4, 3, 2, 2}) * 3 + 1;
  Tensor y = bn(x);
  Tensor mean = y.mean({0, 2, 3});
  Tensor var = y.var({0, 2, 3}, /*correction=*/0);
  for (double m : Values(mean)) EXPECT_NEAR(m, 0, 1e-5);
  for (double v : Values(var)) EXPECT_NEAR(v, 1, 1e-3);
  // running = 0.9 * init + 0.1 * batch (unbiased variance).
  ExpectNear(Values(bn.running_mean()), Values(x.mean({0, 2, 3}) * 0.1), 1e-5);
  ExpectNear(Values(bn.running_var()), Values(x.var({0, 2, 3}) * 0.1 + 0.9), 1e-5);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);
  // Eval mode uses the running statistics.
  bn.eval();
  Tensor z = bn(x);
  Tensor want = (x - bn.running_mean().view({1, 3, 1, 1})) /
                (bn.running_var().view({1, 3, 1, 1}) + 1e-5).sqrt();
  ExpectNear(Values(z), Values(want), 1e-5);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);
}

TEST(BatchNormTest, CumulativeAverageWithoutMomentum) {
  BatchNorm1d bn(BatchNormOptions{.num_features = 2, .momentum = std::nullopt});
  bn(tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2}));
  bn(tensor({5.0f, 6.0f, 7.0f, 8.0f}).view({2, 2}));
  // Means of the two batches: (2, 3) and (6, 7); cumulative: (4, 5).
  ExpectNear(Values(bn.running_mean()), {4, 5}, 1e-6);
}

TEST(BatchNormTest, GradientsMatchFiniteDifferences) {
  manual_seed(8);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    Tensor rm = Randn64({3}), rv = rand({3}, kFloat64) + 0.5;
    ExpectGradientsMatch(
        [&](const std::vector<Tensor>& in) {
          return functional::batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], training);
        },
        {Randn64({4, 3, 2}), Randn64({3}), Randn64({3})});
  }
  // No affine parameters.
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {Randn64({5, 2})});
}

TEST(BatchNormTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(17);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    Tensor rm = Randn64({3}), rv = rand({3}, kFloat64) + 0.5;
    ExpectSecondDerivativesMatch(
        [&](const std::vector<Tensor>& in) {
          return functional::batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], training);
        },
        {Randn64({4, 3, 2}), Randn64({3}), Randn64({3})});
  }
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        return functional::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {Randn64({5, 2})});
}

// A batch large enough for the kernels' 8-lane sums (529 values per plane)
// and for their channels to split over the pool (40 channels of 1058
// values): the kernels' gradients equal the formula's as tensor ops (the
// graph create_graph records, BatchNormRecordedBackward), and the running
// statistics the batch's mean and unbiased variance.
TEST(BatchNormTest, LargeBatchesMatchTheFormulaAsTensorOps) {
  manual_seed(23);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    Tensor x = Randn64({2, 40, 23, 23}) * 2.0 + 0.5;
    x.requires_grad_(true);
    Tensor w = Randn64({40}).requires_grad_(true), b = Randn64({40}).requires_grad_(true);
    Tensor rm = Randn64({40}), rv = rand({40}, kFloat64) + 0.5;
    Tensor rm0 = rm.clone(), rv0 = rv.clone();
    Tensor y = functional::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
    Tensor seed = Randn64({2, 40, 23, 23});
    std::vector<Tensor> kernel = autograd::grad({y}, {x, w, b}, {seed}, /*retain_graph=*/true);
    std::vector<Tensor> formula =
        autograd::grad({y}, {x, w, b}, {seed}, std::nullopt, /*create_graph=*/true);
    for (size_t i = 0; i < 3; ++i) {
      SCOPED_TRACE(i);
      ExpectNear(Values(kernel[i]), Values(formula[i].detach()), 1e-9);
    }
    if (training) {
      ExpectNear(Values(rm), Values(rm0 * 0.9 + x.detach().mean({0, 2, 3}) * 0.1), 1e-12);
      ExpectNear(Values(rv), Values(rv0 * 0.9 + x.detach().var({0, 2, 3}) * 0.1), 1e-12);
    } else {
      Tensor want = (x.detach() - rm.view({1, 40, 1, 1})) / (rv.view({1, 40, 1, 1}) + 1e-5).sqrt() *
                        w.detach().view({1, 40, 1, 1}) +
                    b.detach().view({1, 40, 1, 1});
      ExpectNear(Values(y.detach()), Values(want), 1e-12);
    }
  }
}

TEST(BatchNormTest, RefusesOneValuePerChannelInTraining) {
  BatchNorm1d bn(4);
  EXPECT_THAT(
      ErrorOf([&] {
        bn(randn({1, 4}));
      }),
      HasSubstr("Expected more than 1 value per channel when training, got input size [1, 4]"));
  EXPECT_THAT(ErrorOf([&] {
                BatchNorm2d(4)(randn({2, 4}));
              }),
              HasSubstr("expected 4D input (got 2D input)"));
}

TEST(LayerNormTest, NormalisesTrailingDimsAndHasGradients) {
  manual_seed(9);
  LayerNorm ln({4});
  Tensor y = ln(randn({3, 4}) * 5);
  for (double m : Values(y.mean({1}))) EXPECT_NEAR(m, 0, 1e-5);
  for (double v : Values(y.var({1}, 0))) EXPECT_NEAR(v, 1, 1e-3);
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::layer_norm(in[0], {2, 3}, in[1], in[2]);
      },
      {Randn64({2, 2, 3}), Randn64({2, 3}), Randn64({2, 3})});
  EXPECT_THAT(ErrorOf([&] { ln(randn({3, 5})); }), HasSubstr("Given normalized_shape=[4]"));
}

TEST(LayerNormTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(18);
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        return functional::layer_norm(in[0], {2, 3}, in[1], in[2]);
      },
      {Randn64({2, 2, 3}), Randn64({2, 3}), Randn64({2, 3})});
  ExpectSecondDerivativesMatch(
      [](const std::vector<Tensor>& in) {
        return functional::layer_norm(in[0], {4}, Tensor(), Tensor(), 1e-5);
      },
      {Randn64({3, 4})});
}

// --- Embedding, Dropout, Flatten ---------------------------------------------------

TEST(EmbeddingTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(19);
  const Tensor ids = tensor(std::vector<int64_t>{1, 3, 1, 0, 4}).view({5});
  ExpectSecondDerivativesMatch(
      [&](const std::vector<Tensor>& in) {
        Tensor y = functional::embedding(ids, in[0]);
        return y * y;
      },
      {Randn64({5, 3})});
  // The padding row gets no gradient by definition, so its lookups are masked
  // out of the output for the finite differences to agree.
  const Tensor keep = tensor({1.0, 1.0, 1.0, 0.0, 1.0}).view({5, 1});
  ExpectSecondDerivativesMatch(
      [&](const std::vector<Tensor>& in) {
        Tensor y = functional::embedding(ids, in[0], /*padding_idx=*/0) * keep;
        return y * y;
      },
      {Randn64({5, 3})});
}

TEST(EmbeddingTest, LooksUpRowsAndAccumulatesGradients) {
  manual_seed(10);
  Embedding emb(5, 3, /*padding_idx=*/0);
  EXPECT_EQ(Values(emb.weight()[0]), (std::vector<double>{0, 0, 0}));
  Tensor ids = tensor({1, 3, 1, 0}).view({2, 2});
  Tensor v = emb(ids);
  EXPECT_EQ(v.sizes(), (IntArrayRef{2, 2, 3}));
  EXPECT_EQ(Values(v[0][1]), Values(emb.weight()[3]));
  v.sum().backward();
  // Row 1 was looked up twice, row 3 once, the padding row gets nothing.
  EXPECT_EQ(Values(emb.weight().grad().sum({1})), (std::vector<double>{0, 6, 0, 3, 0}));
  EXPECT_THAT(ErrorOf([&] { emb(tensor({5})); }), HasSubstr("index out of range in self: index 5"));
}

TEST(DropoutTest, ZeroesAboutPAndScalesTheRest) {
  manual_seed(11);
  Dropout drop(0.25);
  Tensor x = ones({10000});
  Tensor y = drop(x);
  const double zeros_fraction = y.eq(0).to(kFloat32).mean().item<double>();
  EXPECT_NEAR(zeros_fraction, 0.25, 0.03);
  EXPECT_NEAR(y.max().item<double>(), 1 / 0.75, 1e-6);
  drop.eval();
  EXPECT_TRUE(drop(x).equal(x));
  EXPECT_THAT(ErrorOf([] { Dropout(1.5); }),
              HasSubstr("dropout probability has to be between 0 and 1, but got 1.5"));
}

TEST(FlattenTest, KeepsTheBatchDim) {
  EXPECT_EQ(Flatten()(randn({2, 3, 4})).sizes(), (IntArrayRef{2, 12}));
  EXPECT_EQ(Flatten(0, 1)(randn({2, 3, 4})).sizes(), (IntArrayRef{6, 4}));
}

// --- A small CNN trains ------------------------------------------------------------

TEST(SmallCnnTest, ForwardBackwardAndLossGoesDown) {
  manual_seed(12);
  auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(Conv2dOptions{.in_channels = 1,
                                             .out_channels = 4,
                                             .kernel_size = {3, 3},
                                             .padding = {1, 1},
                                             .bias = false}),
      std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
      std::make_shared<AdaptiveAvgPool2d>(Int2{1, 1}), std::make_shared<Flatten>(),
      std::make_shared<Linear>(4, 2)});
  // Class 1 images are bright, class 0 dark.
  Tensor labels = tensor({0, 1, 0, 1, 1, 0, 1, 0});
  Tensor x = randn({8, 1, 6, 6}) * 0.1 + labels.to(kFloat32).view({8, 1, 1, 1});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    net->zero_grad();
    Tensor loss = functional::cross_entropy((*net)(x), labels);
    loss.backward();
    {
      autograd::NoGradGuard no_grad;
      for (const Tensor& p : net->parameters()) p.sub_(p.grad() * 0.1);
    }
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first * 0.5);
}

}  // namespace
}  // namespace ember::nn
