#include "nn/models/resnet.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::models {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Keys(const ember::StateDict& state) {
  std::vector<std::string> out;
  for (const auto& [key, t] : state) out.push_back(key);
  return out;
}

// A ResNet small enough for a unit test: stages of 4, 8, 16 and 32 channels.
std::shared_ptr<ResNet18> SmallResNet() {
  return std::make_shared<ResNet18>(ResNetOptions{.num_classes = 10, .width = 4});
}

TEST(ResNetTest, ReplacingFcChangesTheClassifierInPlace) {
  manual_seed(0);
  auto model = SmallResNet();
  const std::vector<std::string> keys_before = Keys(model->state_dict());
  auto fc = model->replace_module("fc", std::make_shared<nn::Linear>(32, 3));
  EXPECT_EQ(model->fc().get(), fc.get());
  // Same keys in the same order: the new fc is where the old one was, last.
  EXPECT_EQ(Keys(model->state_dict()), keys_before);
  std::vector<Tensor> params = model->parameters();
  EXPECT_TRUE(params[params.size() - 2].is_same(fc->weight()));
  EXPECT_TRUE(params.back().is_same(fc->bias()));
  // forward() goes through the new head.
  model->eval();
  Tensor logits = (*model)(randn({2, 3, 32, 32}));
  EXPECT_THAT(logits.sizes(), ElementsAre(2, 3));
}

TEST(ResNetTest, CloneKeepsAReplacedHead) {
  manual_seed(1);
  auto model = SmallResNet();
  // torch's model.fc = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 2)).
  model->replace_module(
      "fc", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                std::make_shared<nn::Linear>(32, 16), std::make_shared<nn::Linear>(16, 2)}));
  auto copy = model->clone();
  EXPECT_EQ(Keys(copy->state_dict()), Keys(model->state_dict()));
  EXPECT_EQ(Keys(copy->state_dict()).back(), "fc.1.bias");
  EXPECT_NE(copy->child("fc").get(), model->child("fc").get());
  model->eval();
  copy->eval();
  Tensor x = randn({2, 3, 32, 32});
  EXPECT_TRUE((*copy)(x).equal((*model)(x)));
}

TEST(ResNetTest, UnknownChildIsNamedWithTheExistingOnes) {
  auto model = SmallResNet();
  try {
    model->replace_module("head", std::make_shared<nn::Linear>(32, 3));
    FAIL() << "replace_module(\"head\") did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no child module \"head\" to replace; its children are "
                                    "\"conv1\", \"bn1\", \"layer1\", \"layer2\", \"layer3\", "
                                    "\"layer4\", \"fc\""));
  }
}

}  // namespace
}  // namespace ember::nn::models
