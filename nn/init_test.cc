// Initialisation: gains, fans, and the bounds and spreads of the uniform and
// normal initialisers against PyTorch's formulas.
#include "nn/init.h"

#include <cmath>
#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/conv.h"
#include "tensor/factories.h"

namespace ember::nn::init {
namespace {

using ::testing::HasSubstr;

double Std(const Tensor& t) { return t.std().item<double>(); }

TEST(InitTest, GainsMatchPyTorch) {
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kLinear), 1.0);
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kConv2d), 1.0);
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kSigmoid), 1.0);
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kTanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kReLU), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kLeakyReLU), std::sqrt(2.0 / (1 + 0.01 * 0.01)));
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kLeakyReLU, std::sqrt(5.0)), std::sqrt(1.0 / 3.0));
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::kSELU), 0.75);
}

TEST(InitTest, FansCountTheReceptiveField) {
  auto [in, out] = calculate_fan_in_and_fan_out(empty({16, 8, 3, 5}));
  EXPECT_EQ(in, 8 * 15);
  EXPECT_EQ(out, 16 * 15);
  try {
    calculate_fan_in_and_fan_out(empty({4}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("fewer than 2 dimensions"));
  }
}

TEST(InitTest, KaimingAndXavierFollowTheirFormulas) {
  manual_seed(0);
  Tensor w = empty({400, 300});
  kaiming_uniform_(w, 0, FanMode::kFanIn, Nonlinearity::kReLU);
  const double kaiming_std = std::sqrt(2.0) / std::sqrt(300.0);
  EXPECT_LE(w.abs().max().item<double>(), std::sqrt(3.0) * kaiming_std);
  EXPECT_NEAR(Std(w), kaiming_std, 0.02 * kaiming_std);

  kaiming_normal_(w, 0, FanMode::kFanOut, Nonlinearity::kReLU);
  EXPECT_NEAR(Std(w), std::sqrt(2.0 / 400.0), 0.02 * std::sqrt(2.0 / 400.0));
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.002);

  const double xavier_std = 2.0 * std::sqrt(2.0 / 700.0);
  xavier_uniform_(w, /*gain=*/2.0);
  EXPECT_LE(w.abs().max().item<double>(), std::sqrt(3.0) * xavier_std);
  EXPECT_NEAR(Std(w), xavier_std, 0.02 * xavier_std);
  xavier_normal_(w);
  EXPECT_NEAR(Std(w), xavier_std / 2, 0.02 * xavier_std / 2);
}

TEST(InitTest, ConstantsAndZeroElementTensors) {
  Tensor w = empty({3, 3}).requires_grad_();
  ones_(w);
  EXPECT_EQ(w.sum().item<double>(), 9.0);
  zeros_(w);
  EXPECT_EQ(w.sum().item<double>(), 0.0);
  constant_(w, 0.5);
  EXPECT_EQ(w.sum().item<double>(), 4.5);
  Tensor empty_w = empty({0, 3});
  EXPECT_TRUE(kaiming_uniform_(empty_w).is_same(empty_w));
}

TEST(InitTest, Conv2dDefaultInitUsesFanInOfTheKernel) {
  manual_seed(1);
  Conv2d conv(Conv2dOptions{.in_channels = 16, .out_channels = 64, .kernel_size = {3, 3}});
  // kaiming_uniform_(a = sqrt(5)): bound = 1 / sqrt(fan_in), fan_in = 16 * 9.
  const double bound = 1.0 / std::sqrt(144.0);
  EXPECT_LE(conv.weight().abs().max().item<double>(), bound);
  EXPECT_NEAR(Std(conv.weight()), bound / std::sqrt(3.0), 0.05 * bound);
  EXPECT_LE(conv.bias().abs().max().item<double>(), bound);
}

}  // namespace
}  // namespace ember::nn::init
