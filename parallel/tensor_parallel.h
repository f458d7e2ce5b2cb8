// Tensor parallelism, as torch.distributed.tensor.parallel: parallelize_module
// with ColwiseParallel, RowwiseParallel, SequenceParallel,
// PrepareModuleInput and PrepareModuleOutput over a 1-D DeviceMesh, and
// loss_parallel's cross-entropy over vocabulary-sharded logits.
//
//   ```cpp compile-only
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "parallel/tensor_parallel.h"
//   #include "tensor/factories.h"
//   namespace par = ember::parallel;
//   // Every rank of a 2-rank job, after init_process_group:
//   EMBER_ASSIGN_OR_RETURN(auto tp, ember::distributed::init_device_mesh("cpu", {2}));
//   ember::manual_seed(0);  // the same whole model on every rank
//   auto mlp = std::make_shared<ember::nn::Sequential>();
//   mlp->push_back(std::make_shared<ember::nn::Linear>(16, 64));
//   mlp->push_back(std::make_shared<ember::nn::GELU>());
//   mlp->push_back(std::make_shared<ember::nn::Linear>(64, 16));
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<ember::nn::Module> sharded,
//                          par::parallelize_module(mlp, tp, {{"0", par::ColwiseParallel{}},
//                                                            {"2", par::RowwiseParallel{}}}));
//   ember::Tensor y = (*sharded)(ember::randn({8, 16}));  // replicated: the whole model's output
//   y.sum().backward();  // each rank's weight shards get their gradients
//   ```
//
// The styles, for a module of the plan (layouts are torch's defaults):
//
// - ColwiseParallel (Linear, Embedding): a Linear's weight and bias are
//   Shard(0), an Embedding's weight Shard(1); the input is read as
//   input_layouts (Replicate) and made Replicate; the output, Shard(-1), is
//   laid out as output_layouts (Shard(-1)).
// - RowwiseParallel (Linear, Embedding): a Linear's weight is Shard(1) and
//   its bias Replicate, an Embedding's weight Shard(0); the input is read as
//   input_layouts (Shard(-1)) and made Shard(-1) (Linear) or Replicate
//   (Embedding); the output, Partial, is laid out as output_layouts
//   (Replicate).
// - SequenceParallel (LayerNorm): parameters Replicate, their gradients
//   all-reduced; input and output Shard(sequence_dim).
// - PrepareModuleInput (any module): the input from input_layouts to
//   desired_input_layouts. PrepareModuleOutput: the output from
//   output_layouts to desired_output_layouts.
//
// Between modules, tensors are local tensors (Ember's modules take and
// return Tensors, not DTensors): each style reads its input as
// input_layouts says, as torch does for a plain tensor, and returns the local
// tensor of its output layout. So use_local_output=false (SequenceParallel's
// default) returns the local tensor too, and the next style's
// input_layouts says how to read it. The collectives are the DTensor
// redistributions of parallel/dtensor.h, forward and backward (Note
// [Gradient placements]): a Replicate input of a ColwiseParallel Linear gets
// its gradient all-reduced, a sequence-sharded one reduce-scattered.
//
// Note [Sharded copies]
// parallelize_module returns a copy of `module` whose parameters are this
// rank's shards, as new leaves (module->replicate_for_data_parallel); the
// input module is left as it was (torch changes it in place and returns it).
// Every rank must pass the same whole module (seed the generator alike, or
// load one checkpoint) and call parallelize_module in the same order. The
// copy's hooks do the layout changes; the modules' own forward() runs on the
// local shards (a Linear of local weight [out/n, in] computes its share of
// the output). A RowwiseParallel Linear's bias is added once after the
// reduction: the hook takes it out of the partial sums and adds it back to
// the reduced output, so its gradient is the whole output's, as torch's
// Replicate bias. A rowwise Embedding masks the indices outside this rank's
// rows (torch's MaskPartial) and sums the partial lookups.
//
// loss_parallel_cross_entropy is torch's cross_entropy under loss_parallel():
// the logits stay sharded over the vocabulary; the maximum, the sum of
// exponentials and the target logit are all-reduced, never the logits.
//
// Errors: absl::Status naming the value: a mesh that is not 1-D, a plan
// entry naming no submodule, a style on a module it does not support (named
// with its type), a dimension not divisible where a style needs it, a rowwise
// Embedding with padding_idx or with empty shards. Forward and backward
// collectives that fail throw ember::Error (modules report that way).
//
// Thread-safety: as nn::Module; every rank runs the same forward and
// backward, in the same order (the hooks are collective).
#ifndef EMBER_PARALLEL_TENSOR_PARALLEL_H_
#define EMBER_PARALLEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/device_mesh.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "parallel/dtensor.h"
#include "tensor/tensor.h"

namespace ember::parallel {

struct ColwiseParallel {
  Placement input_layouts = Replicate();
  Placement output_layouts = Shard(-1);
  bool use_local_output = true;
};

struct RowwiseParallel {
  Placement input_layouts = Shard(-1);
  Placement output_layouts = Replicate();
  bool use_local_output = true;
};

struct SequenceParallel {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};

struct PrepareModuleInput {
  Placement input_layouts = Replicate();
  Placement desired_input_layouts = Replicate();
  bool use_local_output = false;
};

struct PrepareModuleOutput {
  Placement output_layouts = Replicate();
  Placement desired_output_layouts = Replicate();
  bool use_local_output = true;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel,
                                   PrepareModuleInput, PrepareModuleOutput>;

// Submodule names (dotted, as named_modules() gives them; "" is `module`
// itself) and their styles, applied in this order.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// The sharded copy of `module` (Note [Sharded copies]). Collective in the
// sense that every rank must make the same call; it communicates nothing.
absl::StatusOr<std::shared_ptr<nn::Module>> parallelize_module(
    const std::shared_ptr<nn::Module>& module, const DeviceMesh& device_mesh,
    const ParallelizePlan& plan);

// Where each parameter that parallelize_module(module, device_mesh, plan)
// shards lies in the whole module's parameter on this rank (the copy's
// parameter names are the module's); the parameters it leaves whole are
// absent. What a checkpoint needs to save a tensor-parallel model's shards
// as parts of whole tensors (parallel/state_dict.h). Communicates nothing;
// the same errors as parallelize_module.
absl::StatusOr<std::map<std::string, LocalShard>> parameter_shards(
    const std::shared_ptr<nn::Module>& module, const DeviceMesh& device_mesh,
    const ParallelizePlan& plan);

// Cross-entropy of `logits` ([N, C] or [..., C]: this rank's Shard(-1) of the
// logits over a 1-D mesh, C the whole vocabulary) against class indices
// `target` (int64, the logits' leading shape, replicated), as
// torch.nn.functional.cross_entropy under loss_parallel(). Reductions mean
// (over the targets that are not ignore_index), sum and none;
// label_smoothing must be 0. The loss is replicated; its backward gives
// this rank's shard of the logits' gradient, with no communication.
absl::StatusOr<Tensor> loss_parallel_cross_entropy(const DTensor& logits, const Tensor& target,
                                                   const nn::CrossEntropyOptions& options = {});

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_TENSOR_PARALLEL_H_
