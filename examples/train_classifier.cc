// Trains a small classifier on a synthetic, learnable dataset: three
// interleaved spirals in the plane, which no linear model separates. Shows
// nn modules (Sequential, Linear, ReLU), cross-entropy, Adam with a cosine
// learning-rate schedule, mini-batches, train/eval modes, no-grad evaluation
// and moving a model and its data to a device (classifier_training.cc).
// Deterministic (manual_seed); prints progress and ends with
// "test accuracy: <fraction>".
//
//   bazel run //examples:train_classifier
//   bazel run //examples:train_classifier -- --device=cuda     # on cuda:0
#include <cstdio>
#include <string>
#include <string_view>

#include "cuda/device.h"
#include "examples/classifier_training.h"
#include "tensor/device.h"

int main(int argc, char** argv) {
  ember::Device device = ember::kCPU;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.starts_with("--device=")) {
      std::fprintf(stderr, "train_classifier: unknown argument '%s' (usage: --device=cpu|cuda|cuda:N)\n",
                   argv[i]);
      return 2;
    }
    absl::StatusOr<ember::Device> parsed = ember::Device::parse(arg.substr(9));
    if (!parsed.ok()) {
      std::fprintf(stderr, "train_classifier: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    device = *parsed;
  }
  if (device.is_cuda()) {
    if (!ember::cuda::is_available()) {
      std::fprintf(stderr, "train_classifier: --device=%s, but %s\n", device.str().c_str(),
                   ember::cuda::unavailable_reason().c_str());
      return 1;
    }
    // "cuda" means the current device, as in PyTorch: cuda:0 here.
    if (!device.has_index()) device = ember::Device(ember::DeviceType::kCUDA, 0);
  }
  std::printf("device: %s\n", device.str().c_str());
  const ember::examples::ClassifierResult result =
      ember::examples::train_classifier({.device = device});
  std::printf("test accuracy: %.3f\n", result.test_accuracy);
  return 0;
}
