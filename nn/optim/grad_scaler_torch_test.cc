// GradScaler against torch.amp.GradScaler("cpu") of PyTorch 2.x
// (testdata/torch_grad_scaler.py on the peer tools/install_peers.sh installs;
// skips, saying so, without it): the same 8 iterations of SGD with momentum,
// infs and a NaN put into gradients, unscale_ and gradient clipping on odd
// iterations, give the same scales, the same skipped steps, the same weights
// and the same growth tracker.
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/testing/peers.h"
#include "gtest/gtest.h"
#include "nn/clip_grad.h"
#include "nn/loss.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::nn::optim {
namespace {

constexpr int kSeed = 7;

std::map<std::string, std::vector<double>> Parse(const std::string& out) {
  std::map<std::string, std::vector<double>> parsed;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    std::vector<double>& values = parsed[words[0].substr(0, words[0].size() - 1)];
    for (size_t i = 1; i < words.size(); ++i) {
      values.push_back(std::strtod(words[i].c_str(), nullptr));
    }
  }
  return parsed;
}

Tensor Uniform(IntArrayRef shape) { return rand(shape, kFloat64); }

TEST(GradScalerTorchTest, StepsScalesAndWeightsMatchTorchs) {
  absl::StatusOr<std::string> out = ::ember::testing::run_torch2(
      "nn/optim/testdata/torch_grad_scaler.py", {std::to_string(kSeed)});
  if (absl::IsNotFound(out.status())) GTEST_SKIP() << out.status().message();
  ASSERT_TRUE(out.ok()) << out.status();
  const auto torch = Parse(*out);

  manual_seed(kSeed);
  Tensor w = ((Uniform({3, 4}) * 2 - 1) * 0.5).to(kFloat32).requires_grad_();
  Tensor b = ((Uniform({3}) * 2 - 1) * 0.1).to(kFloat32).requires_grad_();
  Tensor x = (Uniform({8, 4}) * 2 - 1).to(kFloat32);
  Tensor y = (Uniform({8, 3}) * 2 - 1).to(kFloat32);
  SGD opt({w, b}, {.lr = 0.1, .momentum = 0.9});
  GradScaler scaler(DeviceType::kCPU, {.init_scale = 1024.0, .growth_interval = 2});
  std::vector<double> scales, stepped;
  for (int it = 0; it < 8; ++it) {
    opt.zero_grad();
    Tensor loss = functional::mse_loss(x.matmul(w.t()) + b, y);
    scaler.scale(loss).backward();
    if (it == 2 || it == 5) w.grad().select(0, 1).select(0, 2).fill_(INFINITY);
    if (it == 6) b.grad().select(0, 0).fill_(NAN);
    if (it % 2 == 1) {
      scaler.unscale_(opt);
      clip_grad_norm_({w, b}, 0.5);
    }
    stepped.push_back(scaler.step(opt) ? 1.0 : 0.0);
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  EXPECT_EQ(scales, torch.at("scale"));
  EXPECT_EQ(stepped, torch.at("stepped"));
  const std::vector<double> got_w = ::ember::testing::Values(w), got_b = ::ember::testing::Values(b);
  ASSERT_EQ(got_w.size(), torch.at("w").size());
  for (size_t i = 0; i < got_w.size(); ++i) EXPECT_NEAR(got_w[i], torch.at("w")[i], 1e-6) << i;
  ASSERT_EQ(got_b.size(), torch.at("b").size());
  for (size_t i = 0; i < got_b.size(); ++i) EXPECT_NEAR(got_b[i], torch.at("b")[i], 1e-6) << i;
  EXPECT_EQ(static_cast<double>(scaler.state_dict()->growth_tracker),
            torch.at("growth_tracker")[0]);
}

}  // namespace
}  // namespace ember::nn::optim
