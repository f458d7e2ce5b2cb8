// ResNet-18 (He et al., 2015) with torchvision's layout and parameter names
// (conv1, bn1, layer1.0.conv1, ..., layer2.0.downsample.0, ..., fc), so
// torchvision's resnet18 state_dict loads into it.
//
//   ```cpp
//   #include "nn/models/resnet.h"
//   #include "nn/linear.h"
//   #include "tensor/factories.h"
//   auto net = std::make_shared<ember::nn::models::ResNet18>(
//       ember::nn::models::ResNetOptions{.num_classes = 10});
//   ember::Tensor images = ember::randn({2, 3, 32, 32});  // training mode: a batch of 2+
//   ember::Tensor logits = (*net)(images);  // [N, 3, H, W] -> [N, 10]
//   // Transfer learning, torch's `model.fc = nn.Linear(512, 2)`: keep the
//   // trunk, put a new classifier on top.
//   auto head = net->replace_module("fc", std::make_shared<ember::nn::Linear>(512, 2));
//   ```
//
// ResNet18 reads its children through the registry, so any of them (conv1,
// bn1, layer1..layer4, fc) can be replaced with replace_module (Note
// [Replacing a child] in nn/module.h); BasicBlock keeps typed pointers and
// refuses.
//
// `width` scales every stage (64, 128, 256, 512 at width 64, torchvision's);
// smaller widths make small test models with the same structure.
//
// Errors: as nn layers (ember::Error for bad shapes). Thread-safety: as
// Module (nn/module.h).
#ifndef EMBER_NN_MODELS_RESNET_H_
#define EMBER_NN_MODELS_RESNET_H_

#include <cstdint>
#include <memory>

#include "nn/container.h"
#include "nn/conv.h"
#include "nn/module.h"
#include "nn/normalization.h"

namespace ember::nn::models {

struct ResNetOptions {
  int64_t num_classes = 1000;
  int64_t width = 64;
  int64_t in_channels = 3;
};

// Two 3x3 convolutions with a shortcut; `downsample` (1x1 conv + BN) when the
// shape changes.
class BasicBlock : public nn::Cloneable<BasicBlock> {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride);
  void reset() override;
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "BasicBlock"; }

 private:
  int64_t in_planes_, planes_, stride_;
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Sequential> downsample_;
};

class ResNet18 : public nn::Cloneable<ResNet18> {
 public:
  explicit ResNet18(ResNetOptions options = {});
  void reset() override;
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ResNet"; }

  // The classifier (torchvision's `fc`), read from the registry: whatever
  // replace_module("fc", ...) last put there.
  std::shared_ptr<nn::Module> fc() const { return child("fc"); }

 protected:
  // forward() reads every child through child(), never a pointer of its own.
  bool children_replaceable() const override { return true; }

 private:
  ResNetOptions options_;
};

}  // namespace ember::nn::models

#endif  // EMBER_NN_MODELS_RESNET_H_
