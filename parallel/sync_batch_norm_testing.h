// Test models for SyncBatchNorm (testonly): nn::models::ResNet18 with its
// blocks made convertible. nn::models' BasicBlock calls its layers through
// pointers of its own and so refuses replace_module (Note [Replacing a child]
// in nn/module.h), which convert_sync_batchnorm needs; ConvertibleBasicBlock
// computes the same, reading its children through child(). Built from a
// ResNet18's own blocks, it holds their very modules, so the model keeps the
// parameters (and random initialisation) of nn::models::ResNet18 and its
// state_dict() keys: torchvision's.
//
//   auto net = ember::parallel::sync_batch_norm_testing::ConvertibleResNet18({.num_classes = 10,
//   .width = 8}); auto sync = ember::parallel::SyncBatchNorm::convert_sync_batchnorm(net);  // net
//   itself
//
// Errors and thread-safety: as nn::models::ResNet18.
#ifndef EMBER_PARALLEL_SYNC_BATCH_NORM_TESTING_H_
#define EMBER_PARALLEL_SYNC_BATCH_NORM_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/models/resnet.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace ember::parallel::sync_batch_norm_testing {

// BasicBlock's computation over the registry: relu(bn1(conv1(x))), then
// bn2(conv2(.)) plus the shortcut (downsample(x) when present), then relu.
class ConvertibleBasicBlock : public nn::Cloneable<ConvertibleBasicBlock> {
 public:
  // Takes `block`'s children (conv1, bn1, conv2, bn2 and downsample) as its
  // own, the same modules.
  explicit ConvertibleBasicBlock(const nn::models::BasicBlock& block) {
    for (const auto& [name, child] : block.named_children()) register_module(name, child);
    const auto& conv1 = static_cast<const nn::Conv2d&>(*child("conv1"));
    in_planes_ = conv1.options().in_channels;
    planes_ = conv1.options().out_channels;
    stride_ = conv1.options().stride[0];
  }

  // Fresh children with BasicBlock's shapes (what clone() fills in).
  void reset() override {
    auto conv = [](int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
      return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in,
                                                            .out_channels = out,
                                                            .kernel_size = {kernel, kernel},
                                                            .stride = {stride, stride},
                                                            .padding = {padding, padding},
                                                            .bias = false});
    };
    register_module("conv1", conv(in_planes_, planes_, 3, stride_, 1));
    register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes_));
    register_module("conv2", conv(planes_, planes_, 3, 1, 1));
    register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes_));
    if (stride_ != 1 || in_planes_ != planes_) {
      auto downsample = std::make_shared<nn::Sequential>();
      downsample->push_back(conv(in_planes_, planes_, 1, stride_, 0));
      downsample->push_back(std::make_shared<nn::BatchNorm2d>(planes_));
      register_module("downsample", downsample);
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor out = nn::functional::relu((*child("bn1"))((*child("conv1"))(x)));
    out = (*child("bn2"))((*child("conv2"))(out));
    const bool shortcut = stride_ != 1 || in_planes_ != planes_;
    Tensor identity = shortcut ? (*child("downsample"))(x) : x;
    return nn::functional::relu(out + identity);
  }
  std::string name() const override { return "BasicBlock"; }

 protected:
  bool children_replaceable() const override { return true; }

 private:
  int64_t in_planes_ = 0, planes_ = 0, stride_ = 1;
};

// nn::models::ResNet18(options) (the same random draws) whose layer1..layer4
// hold ConvertibleBasicBlocks made from its own blocks.
inline std::shared_ptr<nn::models::ResNet18> ConvertibleResNet18(
    nn::models::ResNetOptions options = {}) {
  auto net = std::make_shared<nn::models::ResNet18>(options);
  for (const char* stage : {"layer1", "layer2", "layer3", "layer4"}) {
    const auto& blocks = static_cast<const nn::Sequential&>(*net->child(stage));
    auto convertible = std::make_shared<nn::Sequential>();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto* block = dynamic_cast<const nn::models::BasicBlock*>(blocks[i].get());
      EMBER_CHECK(block != nullptr, "ConvertibleResNet18: ", stage, ".", i, " is a ",
                  blocks[i]->name(), ", not a BasicBlock");
      convertible->push_back(std::make_shared<ConvertibleBasicBlock>(*block));
    }
    net->replace_module(stage, convertible);
  }
  return net;
}

}  // namespace ember::parallel::sync_batch_norm_testing

#endif  // EMBER_PARALLEL_SYNC_BATCH_NORM_TESTING_H_
