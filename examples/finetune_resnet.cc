// Fine-tuning through the hub, the transfer-learning recipe of PyTorch's
// autograd notes in C++: load a pretrained ResNet-18, freeze it, replace its
// classifier with a new Linear and train only that layer
// (resnet_finetuning.cc), on the CPU or on a CUDA device.
//
//   bazel run //examples:finetune_resnet
//   bazel run //examples:finetune_resnet -- --device=cuda     # on cuda:0
//
// The "published" repository is a local folder this program writes first (a
// hubconf.textproto and a ResNet-18 checkpoint in PyTorch's format), loaded
// with source = kLocal, so the example runs offline. Loading
// "owner/repo" from GitHub or a mirror works the same way.
//
// It checks what the recipe promises and exits non-zero otherwise: no frozen
// parameter receives a gradient or changes, the new layer does, and the loss
// goes down.
#include <cstdio>
#include <string>
#include <string_view>

#include "cuda/device.h"
#include "examples/resnet_finetuning.h"
#include "tensor/device.h"

int main(int argc, char** argv) {
  ember::Device device = ember::kCPU;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.starts_with("--device=")) {
      std::fprintf(stderr, "finetune_resnet: unknown argument '%s' (usage: --device=cpu|cuda|cuda:N)\n",
                   argv[i]);
      return 2;
    }
    absl::StatusOr<ember::Device> parsed = ember::Device::parse(arg.substr(9));
    if (!parsed.ok()) {
      std::fprintf(stderr, "finetune_resnet: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    device = *parsed;
  }
  if (device.is_cuda()) {
    if (!ember::cuda::is_available()) {
      std::fprintf(stderr, "finetune_resnet: --device=%s, but %s\n", device.str().c_str(),
                   ember::cuda::unavailable_reason().c_str());
      return 1;
    }
    // "cuda" means the current device, as in PyTorch: cuda:0 here.
    if (!device.has_index()) device = ember::Device(ember::DeviceType::kCUDA, 0);
  }
  std::printf("device: %s\n", device.str().c_str());
  absl::StatusOr<ember::examples::FinetuneResult> result =
      ember::examples::finetune_resnet({.device = device});
  if (!result.ok()) {
    std::fprintf(stderr, "%s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  std::printf("trained only fc: loss %.4f -> %.4f; the %zu frozen tensors are unchanged\n",
              result->losses.front(), result->losses.back(), result->frozen_tensors);
  return 0;
}
