// replicate: one copy of a module per device, as torch.nn.parallel.replicate,
// such that gradients of every copy flow back into the original.
//
//   ```cpp
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "parallel/replicate.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Sequential>();
//   model->push_back(std::make_shared<ember::nn::Linear>(8, 16));
//   model->push_back(std::make_shared<ember::nn::ReLU>());
//   model->push_back(std::make_shared<ember::nn::Linear>(16, 4));
//   ember::Tensor x0 = ember::randn({4, 8}), x1 = ember::randn({4, 8});
//   std::vector<ember::Device> devices(2, ember::kCPU);   // two CPU replicas
//   auto replicas = ember::parallel::replicate(model, devices);
//   ember::Tensor loss = (*replicas[0])(x0).sum() + (*replicas[1])(x1).sum();
//   loss.backward();   // model's parameters get the sum of both replicas' gradients
//   if (!model->parameters()[0].grad().defined()) return absl::InternalError("no gradient");
//   ```
//
// Every replica is a new module of the original's structure
// (Module::replicate_for_data_parallel; the original must be clonable, as
// every nn::Cloneable is) whose parameters are outputs of one Broadcast
// (functions.h) of the original's parameters: non-leaf tensors, so backward
// reaches the originals and sums into their grad(). The replica on devices[0]
// shares storage with the original (when the original lives there); the
// others own copies. Buffers are broadcast the same way, through autograd
// only for buffers that require grad; the replica on devices[0] shares the
// original's buffers, so its updates (BatchNorm's running statistics) land
// in the original, as in PyTorch. With `detach` nothing is recorded: the
// replicas' tensors are plain copies (torch.no_grad forward).
//
// A replica holds the module's hooks and train/eval flags. Replicas are
// meant for one forward/backward; make new ones after the original changes.
//
// Errors: tensor math; throws ember::Error (a module that can't be cloned
// says so). Thread-compatible: the original must not change while this runs.
#ifndef EMBER_PARALLEL_REPLICATE_H_
#define EMBER_PARALLEL_REPLICATE_H_

#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "nn/module.h"
#include "tensor/device.h"

namespace ember::parallel {

// One replica of `module` per entry of `devices` (none for an empty list).
std::vector<std::shared_ptr<nn::Module>> replicate(const std::shared_ptr<nn::Module>& module,
                                                   absl::Span<const Device> devices,
                                                   bool detach = false);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_REPLICATE_H_
