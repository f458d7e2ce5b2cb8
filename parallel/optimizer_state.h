// An optimizer's state in a distributed checkpoint, placed like its
// parameters, so that it reshards with them (torch.distributed.checkpoint.
// state_dict's get_optimizer_state_dict / set_optimizer_state_dict).
//
//   ```cpp compile-only
//   #include "distributed/checkpoint/checkpoint.h"
//   #include "parallel/optimizer_state.h"
//   namespace dcp = ember::distributed::checkpoint;
//   using ember::parallel::ParamKey;
//   // The optimizer steps on this rank's rows [start, start + n) of "fc.weight".
//   std::vector<ParamKey> keys = {{"fc.weight", dcp::Placement{{64, 16}, {start, 0}}}};
//   dcp::StateDict sd = {{"fc.weight", dcp::shard(local_weight, {64, 16}, {start, 0})}};
//   EMBER_ASSIGN_OR_RETURN(dcp::StateDict optim,
//                          ember::parallel::get_optimizer_state_dict(adam, keys));
//   sd.insert(sd.end(), optim.begin(), optim.end());
//   EMBER_RETURN_IF_ERROR(dcp::save(sd, {.path = dir, .process_group = pg}));
//   // Resuming, on any number of ranks, with this rank's own placements:
//   EMBER_RETURN_IF_ERROR(dcp::load(my_model_items, {.path = dir}));
//   EMBER_RETURN_IF_ERROR(ember::parallel::set_optimizer_state_dict(adam, my_keys, {.path = dir}));
//   ```
//
// Keys (README.md, "Optimizer state"): the state tensor `name` of the
// parameter saved as `key` is "optim.state.<key>.<name>"; a state tensor with
// the parameter's shape (momentum buffers, Adam's moments) gets the
// parameter's placement, any other (Adam's step) is replicated. Group g's
// hyperparameters are "optim.param_groups.<g>.<option>", replicated float64
// scalars. Parameters are identified by key, not by position, so a job may
// resume with its parameters placed differently; the groups must hold the
// same parameters in the same order.
//
// Errors: InvalidArgument when `params` does not name every parameter of the
// optimizer (in order) or a state tensor does not fit its parameter; NotFound
// for state missing from the checkpoint; load()'s errors.
// Thread-safety: as the optimizer (thread-compatible).
#ifndef EMBER_PARALLEL_OPTIMIZER_STATE_H_
#define EMBER_PARALLEL_OPTIMIZER_STATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "distributed/checkpoint/checkpoint.h"
#include "nn/optim/optimizer.h"
#include "tensor/shape.h"

namespace ember::parallel {

// A piece of a flat parameter (FSDP's FlatParameter shard): elements
// [local_offset, local_offset + numel) of the 1-D optimizer parameter are
// elements [flat_offset, flat_offset + numel) of the original parameter
// `key`, of shape `global_shape`, in row-major order; or, when the
// original parameter is itself a shard (tensor parallelism under FSDP), of
// its box at `box_offsets` of sizes `box_sizes` in `key`.
struct FlatSegment {
  std::string key;
  SizeVector global_shape;
  int64_t flat_offset = 0;
  int64_t local_offset = 0;
  int64_t numel = 0;
  SizeVector box_offsets;  // empty: the whole of `key`
  SizeVector box_sizes;
};

// How the optimizer's parameter at one overall position (PyTorch's
// numbering: group by group) is saved: its key and its Item's placement
// (unset: the parameter is whole on this rank); or, for a flat parameter,
// its segments (then `key` and `placement` are unused). A flat parameter's
// state is saved per original parameter, so it reshards to any other
// placement (FSDP at another world size, DDP, one process). save() needs the
// same keys on every rank: list a segment with numel 0 for an original
// parameter of the unit that this rank's shard does not reach. Elements of
// the flat parameter outside every segment (padding) load as zeros.
struct ParamKey {
  std::string key;
  std::optional<distributed::checkpoint::Placement> placement;
  std::vector<FlatSegment> segments;
};

// The optimizer's state as Items (see above), ready to be merged into the
// model's StateDict before save(). `params` has one entry per parameter of
// the optimizer, in its order. Parameters without state yet (no step taken)
// contribute none; every rank must then agree, as save() checks.
absl::StatusOr<distributed::checkpoint::StateDict> get_optimizer_state_dict(
    const nn::optim::Optimizer& optimizer, const std::vector<ParamKey>& params);

// Reads the optimizer's state for its parameters placed as `params` from the
// checkpoint at options.path (only the slices this rank's parameters cover)
// and loads it into `optimizer` (its hyperparameters too). Not collective.
absl::Status set_optimizer_state_dict(nn::optim::Optimizer& optimizer,
                                      const std::vector<ParamKey>& params,
                                      const distributed::checkpoint::CheckpointOptions& options);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_OPTIMIZER_STATE_H_
