// A parallel model's and its optimizer's state as distributed-checkpoint
// items under the model's own names (torch.distributed.checkpoint.
// state_dict's get_state_dict / set_state_dict), so that what one kind of
// parallelism saved loads into another, at another world size:
//
//   namespace dcp = ember::distributed::checkpoint;
//   // 4 ranks, fully sharded:
//   EMBER_ASSIGN_OR_RETURN(auto state, ember::parallel::get_state_dict(*fsdp, &adam));
//   EMBER_RETURN_IF_ERROR(ember::parallel::save_state_dict(state, adam, {.path = dir,
//   .process_group = pg}));
//   // Later, 3 ranks of DistributedDataParallel (or one plain module):
//   EMBER_ASSIGN_OR_RETURN(auto mine, ember::parallel::get_state_dict(*ddp, &adam));
//   EMBER_RETURN_IF_ERROR(ember::parallel::load_state_dict(mine, &adam, {.path = dir}));
//
// Note [Checkpoint names of a parallel model]
// Keys are the wrapped module's parameter and buffer names ("fc1.weight"),
// without the wrappers' prefixes ("module." of DDP, FSDP's flat parameters),
// as PyTorch's get_state_dict names them. FullyShardedDataParallel saves each
// rank's shard: for every original parameter of a unit, the part of it the
// rank's flat shard holds (a flat range, possibly empty, so that every rank
// names every key; padding is never saved); its optimizer state the same way
// (ParamKey::segments). DDP and plain modules save whole tensors, which every
// rank holds alike (written once). A tensor-parallel model (parameter_shards
// given) saves each sharded parameter's box of the whole tensor, and under
// FSDP the flat ranges of that box (torch's 2-D DTensor of FSDP x TP), so
// its checkpoint has the whole model's keys and shapes. Buffers are whole in every case. Loading
// reads only what this rank's own placement covers, so the placements of the
// saving and the loading job need not match.
//
// Errors (absl::Status): an optimizer parameter that is not one of the
// model's parameters (InvalidArgument, naming its position), and
// distributed/checkpoint's errors. Thread-safety: as distributed/checkpoint;
// the items alias the model's and the optimizer's tensors, so they stay valid
// while those live and see their current values.
#ifndef EMBER_PARALLEL_STATE_DICT_H_
#define EMBER_PARALLEL_STATE_DICT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "distributed/checkpoint/checkpoint.h"
#include "nn/module.h"
#include "nn/optim/optimizer.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/dtensor.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/optimizer_state.h"

namespace ember::parallel {

struct ModelStateDict {
  // The model's parameters (this rank's part of them) and buffers.
  distributed::checkpoint::StateDict model;
  // How the optimizer's parameters are saved, one per parameter in the
  // optimizer's order; empty when no optimizer was given.
  std::vector<ParamKey> optimizer;
};

// The parameters of a model that are themselves shards of larger tensors
// (tensor parallelism: tensor_parallel.h's parameter_shards), by name; the
// others are whole.
using ParameterShards = std::map<std::string, LocalShard>;

// This rank's shards of a fully sharded model (Note [Checkpoint names of a
// parallel model]); `optimizer`, when given, must optimise fsdp.parameters().
// `shards`: the wrapped module's tensor-parallel parameters (FSDP x TP),
// each saved as flat ranges of its box in the whole tensor.
absl::StatusOr<ModelStateDict> get_state_dict(FullyShardedDataParallel& model,
                                              const nn::optim::Optimizer* optimizer = nullptr,
                                              const ParameterShards& shards = {});
// DistributedDataParallel: its module's whole tensors, without "module.".
absl::StatusOr<ModelStateDict> get_state_dict(DistributedDataParallel& model,
                                              const nn::optim::Optimizer* optimizer = nullptr);
// A plain module: its whole tensors, or for the parameters in `shards`
// (a tensor-parallel copy) this rank's box of the whole.
absl::StatusOr<ModelStateDict> get_state_dict(nn::Module& model,
                                              const nn::optim::Optimizer* optimizer = nullptr,
                                              const ParameterShards& shards = {});

// Saves the model's items and `optimizer`'s state (when given: the one
// get_state_dict described) as one distributed checkpoint; collective over
// options.process_group, as distributed::checkpoint::save.
absl::Status save_state_dict(const ModelStateDict& state, const nn::optim::Optimizer* optimizer,
                             const distributed::checkpoint::CheckpointOptions& options);

// Loads the model's items in place and, when given, `optimizer`'s state from
// the checkpoint at options.path. Not collective.
absl::Status load_state_dict(const ModelStateDict& state, nn::optim::Optimizer* optimizer,
                             const distributed::checkpoint::CheckpointOptions& options);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_STATE_DICT_H_
