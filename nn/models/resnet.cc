#include "nn/models/resnet.h"

#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/pooling.h"

namespace ember::nn::models {
namespace {

std::shared_ptr<nn::Conv2d> Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                                 int64_t padding) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in,
                                                        .out_channels = out,
                                                        .kernel_size = {kernel, kernel},
                                                        .stride = {stride, stride},
                                                        .padding = {padding, padding},
                                                        .bias = false});
}

std::shared_ptr<nn::Sequential> Stage(int64_t in_planes, int64_t planes, int64_t stride) {
  auto stage = std::make_shared<nn::Sequential>();
  stage->push_back(std::make_shared<BasicBlock>(in_planes, planes, stride));
  stage->push_back(std::make_shared<BasicBlock>(planes, planes, 1));
  return stage;
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride)
    : in_planes_(in_planes), planes_(planes), stride_(stride) {
  reset();
}

void BasicBlock::reset() {
  conv1_ = register_module("conv1", Conv(in_planes_, planes_, 3, stride_, 1));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes_));
  conv2_ = register_module("conv2", Conv(planes_, planes_, 3, 1, 1));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes_));
  downsample_ = nullptr;
  if (stride_ != 1 || in_planes_ != planes_) {
    downsample_ = std::make_shared<nn::Sequential>();
    downsample_->push_back(Conv(in_planes_, planes_, 1, stride_, 0));
    downsample_->push_back(std::make_shared<nn::BatchNorm2d>(planes_));
    register_module("downsample", downsample_);
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = nn::functional::relu((*bn1_)((*conv1_)(x)));
  out = (*bn2_)((*conv2_)(out));
  Tensor identity = downsample_ ? (*downsample_)(x) : x;
  return nn::functional::relu(out + identity);
}

ResNet18::ResNet18(ResNetOptions options) : options_(options) { reset(); }

void ResNet18::reset() {
  const int64_t w = options_.width;
  register_module("conv1", Conv(options_.in_channels, w, 7, 2, 3));
  register_module("bn1", std::make_shared<nn::BatchNorm2d>(w));
  register_module("layer1", Stage(w, w, 1));
  register_module("layer2", Stage(w, 2 * w, 2));
  register_module("layer3", Stage(2 * w, 4 * w, 2));
  register_module("layer4", Stage(4 * w, 8 * w, 2));
  register_module("fc", std::make_shared<nn::Linear>(8 * w, options_.num_classes));
}

Tensor ResNet18::forward(const Tensor& x) {
  // Children are looked up by name on every call (Note [Replacing a child]):
  // a scan of seven names per lookup, so a replaced child is always the one
  // called.
  Tensor out = nn::functional::relu((*child("bn1"))((*child("conv1"))(x)));
  out = nn::functional::max_pool2d(
      out, nn::MaxPool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  for (const char* stage : {"layer1", "layer2", "layer3", "layer4"}) {
    out = (*child(stage))(out);
  }
  out = nn::functional::adaptive_avg_pool2d(out, {1, 1}).flatten(1);
  return (*child("fc"))(out);
}

}  // namespace ember::nn::models
