// Losses and gradient clipping: values against formulas written here,
// reductions, ignore_index, label smoothing, gradients against finite
// differences, error messages; and the gradient check of nn/testing.h
// catching a wrong backward.
#include "nn/loss.h"

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "nn/clip_grad.h"
#include "nn/testing.h"
#include "tensor/factories.h"

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

// -log softmax(x)[t] per row, in double precision.
std::vector<double> RowLosses(const Tensor& x, const std::vector<int64_t>& t,
                              double smoothing = 0) {
  std::vector<double> v = Values(x), out;
  const int64_t c = x.size(1);
  for (size_t i = 0; i < t.size(); ++i) {
    double mx = -INFINITY, sum = 0, mean = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, v[i * c + j]);
    for (int64_t j = 0; j < c; ++j) sum += std::exp(v[i * c + j] - mx), mean += v[i * c + j] / c;
    const double lse = mx + std::log(sum);
    out.push_back((1 - smoothing) * (lse - v[i * c + t[i]]) + smoothing * (lse - mean));
  }
  return out;
}

TEST(CrossEntropyTest, ValuesAndReductions) {
  manual_seed(0);
  Tensor x = randn({4, 5}) * 3;
  Tensor t = tensor({1, 0, 4, 2});
  std::vector<double> rows = RowLosses(x, {1, 0, 4, 2});
  double sum = 0;
  for (double r : rows) sum += r;
  EXPECT_NEAR(functional::cross_entropy(x, t).item<double>(), sum / 4, 1e-5);
  EXPECT_NEAR(functional::cross_entropy(x, t, {.reduction = Reduction::kSum}).item<double>(), sum,
              1e-4);
  std::vector<double> none =
      Values(functional::cross_entropy(x, t, {.reduction = Reduction::kNone}));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(none[i], rows[i], 1e-5);
  // A single sample: input [C], 0-dim target.
  EXPECT_NEAR(functional::cross_entropy(x[2], t[2]).item<double>(), rows[2], 1e-5);
}

TEST(CrossEntropyTest, IgnoreIndexAndLabelSmoothing) {
  manual_seed(1);
  Tensor x = randn({3, 4});
  Tensor t = tensor({2, -100, 1});
  std::vector<double> rows = RowLosses(x, {2, 0, 1});
  EXPECT_NEAR(functional::cross_entropy(x, t).item<double>(), (rows[0] + rows[2]) / 2, 1e-5);
  Tensor t2 = tensor({2, 3, 1});
  std::vector<double> smooth = RowLosses(x, {2, 3, 1}, 0.2);
  EXPECT_NEAR(functional::cross_entropy(x, t2, {.label_smoothing = 0.2}).item<double>(),
              (smooth[0] + smooth[1] + smooth[2]) / 3, 1e-5);
  // Large logits stay finite.
  Tensor big = tensor({1000.0f, 0.0f, -1000.0f}).view({1, 3});
  EXPECT_NEAR(functional::cross_entropy(big, tensor({0})).item<double>(), 0.0, 1e-6);
}

TEST(CrossEntropyTest, GradientsMatchFiniteDifferences) {
  manual_seed(2);
  Tensor t = tensor({1, 0, -100, 2});
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ExpectGradientsMatch(
        [&](const std::vector<Tensor>& in) {
          return functional::cross_entropy(in[0], t, {.reduction = r, .label_smoothing = 0.1});
        },
        {randn({4, 3}, kFloat64)});
  }
}

TEST(CrossEntropyTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(21);
  const Tensor target = tensor(std::vector<int64_t>{2, 0, 1});
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ExpectSecondDerivativesMatch(
        [&](const std::vector<Tensor>& in) {
          return functional::cross_entropy(in[0], target, {.reduction = r});
        },
        {randn({3, 4}, kFloat64)});
  }
  // An ignored row and label smoothing; a [C] input with a 0-dim target.
  ExpectSecondDerivativesMatch(
      [&](const std::vector<Tensor>& in) {
        return functional::cross_entropy(in[0], target,
                                         {.ignore_index = 0, .label_smoothing = 0.2});
      },
      {randn({3, 4}, kFloat64)});
  ExpectSecondDerivativesMatch(
      [&](const std::vector<Tensor>& in) {
        return functional::cross_entropy(in[0], tensor(std::vector<int64_t>{1}).squeeze(0));
      },
      {randn({4}, kFloat64)});
}

TEST(CrossEntropyTest, GradientPenaltyMatchesTheHessianOfSoftmax) {
  // d/dx |d loss/dx|^2 = 2 H g with H = diag(p) - p p^T for one row (sum).
  Tensor x = tensor({0.3, -1.2, 0.8}).unsqueeze(0).requires_grad_();
  Tensor loss =
      functional::cross_entropy(x, tensor(std::vector<int64_t>{1}), {.reduction = Reduction::kSum});
  Tensor g = autograd::grad({loss}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  Tensor penalty_grad = autograd::grad({(g * g).sum()}, {x})[0];
  std::vector<double> v = Values(x), p(3), gv(3), want(3, 0.0);
  double z = 0;
  for (int j = 0; j < 3; ++j) z += std::exp(v[j]);
  for (int j = 0; j < 3; ++j) {
    p[j] = std::exp(v[j]) / z;
    gv[j] = p[j] - (j == 1 ? 1.0 : 0.0);
  }
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) want[i] += 2 * ((i == j ? p[i] : 0.0) - p[i] * p[j]) * gv[j];
  }
  std::vector<double> got = Values(penalty_grad);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

TEST(CrossEntropyTest, ErrorsNameTheValues) {
  Tensor x = randn({2, 3});
  EXPECT_THAT(ErrorOf([&] {
                functional::cross_entropy(x, tensor({0, 3}));
              }),
              HasSubstr("Target 3 is out of bounds."));
  EXPECT_THAT(ErrorOf([&] {
                functional::cross_entropy(x, tensor({0, 1, 2}));
              }),
              HasSubstr("Expected input batch_size (2) to match target batch_size (3)."));
  EXPECT_THAT(ErrorOf([&] {
                functional::cross_entropy(x, tensor({0.0f, 1.0f}));
              }),
              HasSubstr("expected target of dtype int64"));
}

TEST(NllLossTest, PicksNegatedLogProbabilities) {
  Tensor logp = tensor({-0.5f, -1.0f, -2.0f, -0.1f}).view({2, 2});
  EXPECT_NEAR(functional::nll_loss(logp, tensor({1, 0})).item<double>(), (1.0 + 2.0) / 2, 1e-6);
  EXPECT_NEAR(NLLLoss({.reduction = Reduction::kSum})(logp, tensor({0, 1})).item<double>(), 0.6,
              1e-6);
  Tensor t = tensor({1, 0, 2});
  ExpectGradientsMatch(
      [&](const std::vector<Tensor>& in) { return functional::nll_loss(in[0], t); },
      {randn({3, 3}, kFloat64)});
  // log_softmax + nll_loss == cross_entropy.
  manual_seed(3);
  Tensor x = randn({3, 3});
  EXPECT_NEAR(functional::nll_loss(x.log_softmax(1), t).item<double>(),
              functional::cross_entropy(x, t).item<double>(), 1e-5);
}

TEST(NllLossTest, SecondDerivativesMatchFiniteDifferences) {
  manual_seed(22);
  const Tensor target = tensor(std::vector<int64_t>{2, 0, 1});
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ExpectSecondDerivativesMatch(
        [&](const std::vector<Tensor>& in) {
          return functional::nll_loss(in[0].log_softmax(1), target,
                                      {.reduction = r, .ignore_index = 1});
        },
        {randn({3, 4}, kFloat64)});
  }
}

TEST(RegressionLossTest, MseL1AndBceWithLogits) {
  Tensor a = tensor({1.0f, 2.0f, 3.0f}), b = tensor({1.5f, 2.0f, 5.0f});
  EXPECT_NEAR(functional::mse_loss(a, b).item<double>(), (0.25 + 0 + 4) / 3, 1e-6);
  EXPECT_NEAR(MSELoss(Reduction::kSum)(a, b).item<double>(), 4.25, 1e-6);
  EXPECT_NEAR(functional::l1_loss(a, b).item<double>(), 2.5 / 3, 1e-6);
  Tensor x = tensor({-2.0f, 0.5f, 30.0f, -30.0f}), y = tensor({0.0f, 1.0f, 1.0f, 1.0f});
  auto bce = [](double xv, double yv) {
    const double s = 1 / (1 + std::exp(-xv));
    return -(yv * std::log(s) + (1 - yv) * std::log(1 - s));
  };
  const double want = (bce(-2, 0) + bce(0.5, 1) + std::log1p(std::exp(-30.0)) + 30.0) / 4;
  EXPECT_NEAR(functional::binary_cross_entropy_with_logits(x, y).item<double>(), want, 1e-5);
  // pos_weight multiplies the positive term.
  Tensor one = tensor({0.5f}), pos = tensor({1.0f});
  EXPECT_NEAR(BCEWithLogitsLoss(Reduction::kMean, tensor({3.0f}))(one, pos).item<double>(),
              3 * bce(0.5, 1), 1e-5);
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        return functional::binary_cross_entropy_with_logits(in[0], in[1]) +
               functional::mse_loss(in[0], in[1]) + functional::l1_loss(in[0], in[1] * 0.5);
      },
      {tensor({-1.0, 0.3, 2.0}), tensor({0.2, 0.9, 0.4})});
}

TEST(ClipGradNormTest, ScalesGradientsAboveTheLimit) {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({1}).requires_grad_();
  a.set_grad(tensor({3.0f, 0.0f}));
  b.set_grad(tensor({4.0f}));
  Tensor norm = clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(norm.item<double>(), 5.0, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-5);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-5);
  // Below the limit nothing changes; infinity norm is the max.
  EXPECT_NEAR(clip_grad_norm_({a, b}, 10.0, INFINITY).item<double>(), 0.8, 1e-5);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-5);
  b.set_grad(tensor({NAN}));
  EXPECT_THAT(ErrorOf([&] {
                clip_grad_norm_({a, b}, 1.0, 2.0, /*error_if_nonfinite=*/true);
              }),
              HasSubstr("is non-finite, so it cannot be clipped"));
}

// A Function whose backward is off by a factor of 2.
struct WrongDouble : autograd::Function<WrongDouble> {
  static Tensor forward(autograd::AutogradContext*, const Tensor& x) { return x * 2.0; }
  static std::vector<Tensor> backward(autograd::AutogradContext*, std::vector<Tensor> g) {
    return {g[0] * 4.0};
  }
};

TEST(GradientCheckTest, CatchesAWrongBackward) {
  EXPECT_NONFATAL_FAILURE(
      ExpectGradientsMatch([](const std::vector<Tensor>& in) { return WrongDouble::apply(in[0]); },
                           {tensor({1.5})}),
      "gradient check failed");
}

// y = x^3 whose recorded backward holds one factor of x fixed: the first
// derivative 3 x^2 is right, the second (3 x instead of 6 x) is not.
struct WrongSecondDerivative : autograd::Function<WrongSecondDerivative> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static std::vector<Tensor> backward(autograd::AutogradContext* ctx, std::vector<Tensor> g) {
    Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * x * x.detach() * 3.0};
  }
};

// A Function whose backward detaches (records nothing under create_graph).
struct DetachedBackward : autograd::Function<DetachedBackward> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static std::vector<Tensor> backward(autograd::AutogradContext* ctx, std::vector<Tensor> g) {
    return {(g[0] * ctx->get_saved_variables()[0] * 2.0).detach()};
  }
};

// y = x^2 whose recorded backward (create_graph) is off by 1%, but is
// consistent with its own derivative.
struct DriftingRecordedBackward : autograd::Function<DriftingRecordedBackward> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static std::vector<Tensor> backward(autograd::AutogradContext* ctx, std::vector<Tensor> g) {
    const double k = autograd::GradMode::is_enabled() ? 2.02 : 2.0;
    return {g[0] * ctx->get_saved_variables()[0] * k};
  }
};

TEST(GradientCheckTest, CatchesAWrongSecondDerivative) {
  auto wrong = [](const std::vector<Tensor>& in) { return WrongSecondDerivative::apply(in[0]); };
  ExpectGradientsMatch(wrong, {tensor({1.5, -0.7})});  // First order is right.
  EXPECT_NONFATAL_FAILURE(ExpectSecondDerivativesMatch(wrong, {tensor({1.5, -0.7})}),
                          "second-derivative check failed");
  EXPECT_NONFATAL_FAILURE(
      ExpectSecondDerivativesMatch(
          [](const std::vector<Tensor>& in) { return DetachedBackward::apply(in[0]); },
          {tensor({1.5})}),
      "was not recorded");
  EXPECT_NONFATAL_FAILURE(
      ExpectSecondDerivativesMatch(
          [](const std::vector<Tensor>& in) { return DriftingRecordedBackward::apply(in[0]); },
          {tensor({1.5})}),
      "differs from the plain one");
}

}  // namespace
}  // namespace ember::nn
