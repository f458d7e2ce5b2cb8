// Activation checkpointing of a sequence of modules:
// torch.utils.checkpoint.checkpoint_sequential in its non-reentrant form
// (use_reentrant=False), on autograd::checkpoint (autograd/checkpoint.h).
//
//   ```cpp
//   #include "nn/activation.h"
//   #include "nn/checkpoint.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "tensor/factories.h"
//   auto net = std::make_shared<ember::nn::Sequential>();
//   for (int i = 0; i < 4; ++i) {
//     net->push_back(std::make_shared<ember::nn::Linear>(32, 32));
//     net->push_back(std::make_shared<ember::nn::Tanh>());
//   }
//   ember::Tensor x = ember::randn({8, 32});
//   // Two segments of four modules: the first is checkpointed (only its input
//   // is kept for backward), the last runs as usual.
//   ember::Tensor y = ember::nn::checkpoint_sequential(*net, /*segments=*/2, x);
//   y.sum().backward();  // the parameters' gradients, as without checkpointing
//   ```
//
// As torch: the modules are cut into `segments` runs of size() / segments
// modules; every run but the last is checkpointed, and the last (with the
// modules the division leaves over) runs as usual, its activations kept.
// Each module is called through operator(), so its hooks run, in the
// forward pass and again when its run is recomputed. Modules that keep
// state across calls (BatchNorm's running statistics in training mode)
// update it in the recomputation too, as in PyTorch.
//
// Errors: ember::Error when segments is not between 1 and the number of
// modules, and what the modules and autograd::checkpoint throw.
// Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_CHECKPOINT_H_
#define EMBER_NN_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/checkpoint.h"
#include "nn/container.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

// Runs `functions` in order on `input`, checkpointing all segments but the
// last. The modules must outlive the backward pass (they are held by
// shared_ptr until then).
Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& functions,
                             int64_t segments, const Tensor& input,
                             const autograd::CheckpointOptions& options = {});
// The same on a Sequential's children.
Tensor checkpoint_sequential(const Sequential& functions, int64_t segments, const Tensor& input,
                             const autograd::CheckpointOptions& options = {});

}  // namespace ember::nn

#endif  // EMBER_NN_CHECKPOINT_H_
