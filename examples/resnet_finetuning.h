// The recipe of //examples:finetune_resnet as a function its tests call:
// publish a ResNet-18 with weights as a hub repository in a local folder,
// load it pretrained, freeze it, replace its classifier with a new Linear
// and train only that layer, on the CPU or a CUDA device (PyTorch's
// transfer-learning recipe from its autograd notes).
//
//   ```cpp
//   #include "examples/resnet_finetuning.h"
//   EMBER_ASSIGN_OR_RETURN(ember::examples::FinetuneResult r,
//                          ember::examples::finetune_resnet({.steps = 3, .verbose = false}));
//   ```
//
// Errors: the hub's (publishing or loading the repository), and
// InternalError when the recipe breaks one of its promises: a frozen
// parameter receives a gradient or changes, the new layer gets no gradient,
// the loss does not go down.
#ifndef EMBER_EXAMPLES_RESNET_FINETUNING_H_
#define EMBER_EXAMPLES_RESNET_FINETUNING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tensor/device.h"

namespace ember::examples {

struct FinetuneOptions {
  Device device = kCPU;  // model and data live here (a CUDA device with an index)
  int steps = 15;
  // Where the repository is published (then removed): empty for
  // $TEST_TMPDIR, or the system's temporary folder, /ember_finetune_repo.
  std::string repo_dir;
  bool verbose = true;  // print a line per step
};

struct FinetuneResult {
  std::vector<double> losses;  // one per step
  size_t frozen_tensors = 0;   // the trunk's parameters, all unchanged
  Device parameters_device = kCPU;
};

absl::StatusOr<FinetuneResult> finetune_resnet(const FinetuneOptions& options);

}  // namespace ember::examples

#endif  // EMBER_EXAMPLES_RESNET_FINETUNING_H_
