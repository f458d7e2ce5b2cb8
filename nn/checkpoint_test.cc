// checkpoint_sequential (nn/checkpoint.h) and autograd::checkpoint over nn
// modules: a small conv net with dropout and ResNet-18's stages give the
// gradients of the run without checkpointing, bit for bit; torch's
// segmentation (which modules run twice); the errors.
#include "nn/checkpoint.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/models/resnet.h"
#include "nn/pooling.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::nn {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::HasSubstr;

std::vector<std::vector<double>> Grads(const Module& m) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : m.parameters()) out.push_back(Values(p.grad()));
  return out;
}

std::shared_ptr<Sequential> ConvNet() {
  std::vector<std::shared_ptr<Module>> layers = {
      std::make_shared<Conv2d>(3, 8, 3, 1, 1), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.3),          std::make_shared<MaxPool2d>(2),
      std::make_shared<Conv2d>(8, 8, 3, 1, 1), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.2),          std::make_shared<Flatten>(),
      std::make_shared<Linear>(8 * 4 * 4, 5)};
  return std::make_shared<Sequential>(layers);
}

TEST(CheckpointSequentialTest, ConvNetWithDropoutGivesTheSameGradientsBitForBit) {
  manual_seed(0);
  auto net = ConvNet();
  Tensor x = randn({4, 3, 8, 8});
  for (int64_t segments : {1, 2, 3, 9}) {
    SCOPED_TRACE(segments);
    net->zero_grad();
    manual_seed(100);
    Tensor plain = (*net)(x);
    (plain * plain).sum().backward();
    const std::vector<std::vector<double>> expected = Grads(*net);
    const std::vector<double> rng_after = Values(default_generator().get_state());

    net->zero_grad();
    manual_seed(100);
    Tensor out = checkpoint_sequential(*net, segments, x);
    EXPECT_EQ(Values(out), Values(plain));
    (out * out).sum().backward();
    EXPECT_EQ(Grads(*net), expected);
    EXPECT_EQ(Values(default_generator().get_state()), rng_after);
  }
}

TEST(CheckpointSequentialTest, TorchsSegmentsOnlyTheLastRunsOnce) {
  std::vector<std::shared_ptr<Module>> layers;
  std::vector<int> calls(7, 0);
  for (int i = 0; i < 7; ++i) {
    layers.push_back(std::make_shared<Linear>(4, 4));
    layers.back()->register_forward_pre_hook(
        [&calls, i](Module&, const Tensor&) -> std::optional<Tensor> {
          ++calls[i];
          return std::nullopt;
        });
  }
  Tensor x = randn({2, 4});
  // 7 modules in 3 segments of 2: [0, 1] and [2, 3] checkpointed, [4, 5, 6]
  // as usual.
  Tensor y = checkpoint_sequential(layers, 3, x);
  EXPECT_EQ(calls, std::vector<int>(7, 1));
  y.sum().backward();
  EXPECT_EQ(calls, (std::vector<int>{2, 2, 2, 2, 1, 1, 1}));
}

TEST(CheckpointSequentialTest, Errors) {
  Sequential net(std::vector<std::shared_ptr<Module>>{std::make_shared<ReLU>()});
  const Tensor x = randn({2});
  EXPECT_THAT(ErrorOf([&] { checkpoint_sequential(net, 0, x); }),
              HasSubstr("checkpoint_sequential: segments must be between 1 and the number of "
                        "modules (1), got 0"));
  EXPECT_THAT(ErrorOf([&] { checkpoint_sequential(net, 2, x); }), HasSubstr("modules (1), got 2"));
}

// Calls its module under autograd::checkpoint (torch's CheckpointWrapper).
class Checkpointed : public Module {
 public:
  explicit Checkpointed(std::shared_ptr<Module> inner)
      : inner_(register_module("module", std::move(inner))) {}
  Tensor forward(const Tensor& input) override {
    return autograd::checkpoint([m = inner_](const Tensor& t) { return (*m)(t); }, input);
  }

 private:
  std::shared_ptr<Module> inner_;
};

TEST(CheckpointSequentialTest, ResNetStagesCheckpointedGiveTheSameGradients) {
  manual_seed(1);
  auto net =
      std::make_shared<models::ResNet18>(models::ResNetOptions{.num_classes = 3, .width = 8});
  Tensor x = randn({2, 3, 32, 32});
  Tensor plain = (*net)(x);
  plain.sum().backward();
  const std::vector<std::vector<double>> expected = Grads(*net);
  net->zero_grad();
  for (const char* stage : {"layer1", "layer2", "layer3", "layer4"}) {
    net->replace_module(stage, std::make_shared<Checkpointed>(net->child(stage)));
  }
  Tensor out = (*net)(x);
  EXPECT_EQ(Values(out), Values(plain));
  out.sum().backward();
  EXPECT_EQ(Grads(*net), expected);
}

}  // namespace
}  // namespace ember::nn
