// ZeroRedundancyOptimizer: an optimizer whose state is sharded over the
// ranks of a process group (torch.distributed.optim.ZeroRedundancyOptimizer,
// the optimizer-state partitioning of ZeRO stage 1).
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/adam.h"
//   #include "nn/optim/lr_scheduler.h"
//   #include "parallel/distributed_data_parallel.h"
//   #include "parallel/zero_redundancy_optimizer.h"
//   #include "tensor/factories.h"
//   // Every process, started by `launch --nproc_per_node=2 prog`:
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "gloo"}));
//   auto model = std::make_shared<ember::nn::Linear>(8, 4);
//   EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(model));
//   EMBER_ASSIGN_OR_RETURN(
//       auto opt, ember::parallel::ZeroRedundancyOptimizer::Create<ember::nn::optim::Adam>(
//                     ddp->parameters(), {.lr = 1e-3}));
//   ember::nn::optim::StepLR sched(*opt, /*step_size=*/10);
//   for (int step = 0; step < 20; ++step) {
//     opt->zero_grad();
//     ember::nn::functional::mse_loss((*ddp)(ember::randn({16, 8})), ember::randn({16, 4}))
//         .backward();
//     EMBER_RETURN_IF_ERROR(opt->Step());  // this rank's share, then every rank's broadcast
//     sched.step();
//   }
//   EMBER_RETURN_IF_ERROR(opt->consolidate_state_dict(/*to=*/0));  // on every rank
//   if (ember::distributed::get_rank() == 0) {
//     ember::nn::optim::OptimizerStateDict whole = opt->state_dict();  // a plain Adam loads it
//   }
//   ```
//
// What it does, as torch's: the parameters are partitioned over the group's
// ranks once, at Create and again after add_param_group (Note [ZeRO
// partition]); each rank builds its local optimizer (any nn/optim optimizer,
// from a factory) over its own share only, so it holds roughly 1/world_size
// of the optimizer state. step() runs the local optimizer, then every rank
// broadcasts the parameters it updated to all the others, rank by rank
// (parameter by parameter, or, with parameters_as_bucket_view, one flat
// bucket per rank and device whose views the parameters are), so every rank
// ends the step with the same parameters as one optimizer over all of them.
// Gradients must already agree across ranks (DistributedDataParallel).
//
// It is an nn::optim::Optimizer: zero_grad() clears every parameter's
// gradient, param groups and their lr are the whole optimizer's (lr() and
// set_lr() reach the local optimizer, which holds every group, possibly
// empty on this rank), so the schedulers of nn/optim/lr_scheduler.h drive it.
//
// Checkpoints (Note [ZeRO state dicts]): consolidate_state_dict(to) gathers
// every rank's state on rank `to`; state_dict() there is then the whole
// optimizer's in the layout of a plain optimizer over all the parameters
// (state by the parameter's position over all groups, as torch numbers
// them), which a plain optimizer of the same type, or PyTorch's
// optimizer / ZeroRedundancyOptimizer after conversion, loads.
// load_state_dict(whole) on every rank takes each rank's own share.
//
// Not implemented: overlap_with_ddp (torch's step inside DDP's communication
// hook); Create refuses it with kUnimplemented.
//
// Uneven inputs (parallel/join.h): ZeroRedundancyOptimizer is a Joinable,
// as torch's. Its join hook runs Step() for each iteration the other ranks
// still train, so the joined rank updates its share and broadcasts it as
// their step expects. Put it after the DistributedDataParallel in the Join
// (`Join::create({ddp, zero})`): DDP's hook first shadows backward, which
// leaves the others' averaged gradients in the joined rank's grad(), so its
// share is updated with them and every rank ends as one process would.
//
// Errors: Create returns kInvalidArgument for an empty parameter list (torch's
// "ZeroRedundancyOptimizer got an empty parameter list"), an undefined or
// repeated parameter, parameters of more than one dense type (dtype or
// device type; torch's message names both types, e.g. torch.FloatTensor and
// torch.DoubleTensor), or a local optimizer that its factory could not build;
// kFailedPrecondition without a process group; kUnimplemented for
// overlap_with_ddp. Step and consolidate_state_dict return the group's error
// when a broadcast fails or times out. state_dict() before
// consolidate_state_dict throws ember::Error with torch's RuntimeError text
// ("Optimizer state has not been consolidated on this rank. Please call
// `consolidate_state_dict(to=1)` ..."), as the Optimizer interface throws
// for a caller's mistake; step() (the Optimizer interface) throws
// ember::Error with Step()'s error.
//
// Thread-safety: thread-compatible, as Optimizer. step(), add_param_group,
// consolidate_state_dict and load_state_dict are collective in effect: call
// them on every rank, in the same order (torch's warning: a subset of ranks
// hangs).
#ifndef EMBER_PARALLEL_ZERO_REDUNDANCY_OPTIMIZER_H_
#define EMBER_PARALLEL_ZERO_REDUNDANCY_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "distributed/process_group.h"
#include "nn/optim/optimizer.h"
#include "parallel/join.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace ember::parallel {

struct ZeroRedundancyOptimizerOptions {
  // The group to shard over; null: the default group
  // (distributed::init_process_group).
  std::shared_ptr<distributed::ProcessGroup> process_group;
  // Pack each rank's parameters (per device) into one flat bucket and make
  // the parameters views of it, so that step() broadcasts one tensor per
  // rank and device instead of one per parameter (torch's
  // parameters_as_bucket_view).
  bool parameters_as_bucket_view = false;
  // torch's overlap_with_ddp: not implemented (kUnimplemented).
  bool overlap_with_ddp = false;
};

class ZeroRedundancyOptimizer : public nn::optim::Optimizer, public Joinable {
 public:
  // Builds this rank's local optimizer from its share of each parameter
  // group, in group order (a share may be empty). The optimizer must have
  // exactly one group per share, holding those parameters in that order.
  using LocalOptimizerFactory = std::function<std::unique_ptr<nn::optim::Optimizer>(
      std::vector<std::vector<Tensor>> params_per_group)>;

  // The options type of an OptimizerBase-derived optimizer (SGDOptions for
  // nn::optim::SGD, ...).
  template <typename OptimizerT>
  using OptionsOf = decltype(OptimizerT::ParamGroup::options);

  // Partitions `param_groups` (Note [ZeRO partition]) and builds the local
  // optimizer with `make_local`. Communicates nothing; every rank must pass
  // the same parameters (shapes, order). Errors: see the header comment.
  static absl::StatusOr<std::unique_ptr<ZeroRedundancyOptimizer>> Create(
      std::vector<std::vector<Tensor>> param_groups, LocalOptimizerFactory make_local,
      ZeroRedundancyOptimizerOptions options = {});

  // torch's ZeroRedundancyOptimizer(params, optimizer_class=OptimizerT,
  // **defaults): one group.
  template <typename OptimizerT>
  static absl::StatusOr<std::unique_ptr<ZeroRedundancyOptimizer>> Create(
      std::vector<Tensor> params, OptionsOf<OptimizerT> defaults,
      ZeroRedundancyOptimizerOptions options = {}) {
    std::vector<typename OptimizerT::ParamGroup> groups;
    groups.push_back({std::move(params), std::move(defaults)});
    return Create<OptimizerT>(std::move(groups), std::move(options));
  }

  // The same with several groups, each with its own options.
  template <typename OptimizerT>
  static absl::StatusOr<std::unique_ptr<ZeroRedundancyOptimizer>> Create(
      std::vector<typename OptimizerT::ParamGroup> groups,
      ZeroRedundancyOptimizerOptions options = {}) {
    std::vector<std::vector<Tensor>> params;
    std::vector<OptionsOf<OptimizerT>> group_options;
    for (auto& g : groups) {
      params.push_back(std::move(g.params));
      group_options.push_back(std::move(g.options));
    }
    LocalOptimizerFactory make = [group_options](std::vector<std::vector<Tensor>> shares) {
      std::vector<typename OptimizerT::ParamGroup> local;
      for (size_t g = 0; g < shares.size(); ++g) {
        local.push_back({std::move(shares[g]), group_options.at(g)});
      }
      return std::unique_ptr<nn::optim::Optimizer>(new OptimizerT(std::move(local)));
    };
    return Create(std::move(params), std::move(make), std::move(options));
  }

  // torch's add_param_group: adds a group to every rank's view, partitions
  // again (the earlier groups keep their ranks) and gives this rank's share
  // to the local optimizer, which must be an OptimizerT; rebuilds the
  // buckets. Call on every rank. kInvalidArgument for a parameter already
  // optimised or repeated, of another dense type, invalid options, or an
  // OptimizerT that is not the local optimizer's type.
  template <typename OptimizerT>
  absl::Status add_param_group(std::vector<Tensor> params, OptionsOf<OptimizerT> options) {
    auto* local = dynamic_cast<OptimizerT*>(local_.get());
    if (local == nullptr) {
      return absl::InvalidArgumentError(
          "ZeroRedundancyOptimizer.add_param_group: the options are for another optimizer type "
          "than the local optimizer's; pass the Options of the optimizer it was created with");
    }
    try {
      OptionsOf<OptimizerT>::Validate(options);
    } catch (const Error& e) {
      return absl::InvalidArgumentError(e.what());
    }
    return AddParamGroupImpl(std::move(params), [local, &options](std::vector<Tensor> share) {
      local->add_param_group(std::move(share), options);
    });
  }

  // Runs the local optimizer on this rank's share, then broadcasts every
  // rank's share from its owner (blocks until they complete, up to the
  // group's timeout). Parameters whose requires_grad changed since the
  // buckets were built get new buckets first (torch's warning case). The
  // group's error when a broadcast fails.
  absl::Status Step();
  // nn::optim::Optimizer: Step(), throwing ember::Error with its error.
  void step() override;

  // Gathers every rank's optimizer state on rank `to` (blocks; call on every
  // rank; torch broadcasts each rank's state in turn, and so does this).
  // kInvalidArgument for `to` outside [0, world_size); the group's error
  // when a broadcast fails.
  absl::Status consolidate_state_dict(int to = 0);

  // The whole optimizer's state as last consolidated on this rank (Note
  // [ZeRO state dicts]). Throws ember::Error (torch's RuntimeError) when
  // consolidate_state_dict(to=this rank) has not run since Create or the
  // last add_param_group.
  nn::optim::OptimizerStateDict state_dict() const override;
  // Takes this rank's share of `state` (the whole optimizer's, from
  // state_dict() or a plain optimizer over the same parameters) and every
  // group's options. kInvalidArgument when the groups do not match, as a
  // plain optimizer's load_state_dict.
  absl::Status load_state_dict(const nn::optim::OptimizerStateDict& state) override;

  // Every group's parameters, all ranks' shares (torch's param_groups).
  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& params(size_t group) const override { return groups_.at(group); }
  double lr(size_t group) const override { return local_->lr(group); }
  void set_lr(size_t group, double lr) override { local_->set_lr(group, lr); }

  // The partition: for each rank, for each group, the positions (over all
  // groups, as state_dict numbers them) of the parameters it updates, in
  // the order its local optimizer holds them (torch's
  // _partition_parameters()).
  const std::vector<std::vector<std::vector<int64_t>>>& partition() const { return partition_; }
  // The rank that updates the parameter at position `index`.
  int owner(int64_t index) const { return owner_.at(index); }
  // This rank's optimizer over its share (torch's optim).
  nn::optim::Optimizer& local_optimizer() { return *local_; }
  const nn::optim::Optimizer& local_optimizer() const { return *local_; }
  // With parameters_as_bucket_view: buckets()[d][r] is rank r's flat bucket
  // on the d-th device (in order of first appearance); empty otherwise.
  const std::vector<std::vector<Tensor>>& buckets() const { return buckets_; }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::shared_ptr<distributed::ProcessGroup>& process_group() const { return group_; }
  bool parameters_as_bucket_view() const { return as_bucket_view_; }

  // Joinable (see above): the hook runs Step().
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  Device join_device() const override { return default_device_; }
  std::shared_ptr<distributed::ProcessGroup> join_process_group() const override {
    return group_;
  }

 private:
  ZeroRedundancyOptimizer() = default;

  absl::Status AddParamGroupImpl(std::vector<Tensor> params,
                                 const std::function<void(std::vector<Tensor>)>& add_local);
  // Assigns every parameter to a rank (Note [ZeRO partition]).
  void Partition();
  // This rank's share of each group.
  std::vector<std::vector<Tensor>> LocalShares() const;
  // (Re)builds the buckets from the partition and requires_grad.
  void BuildBuckets();
  std::vector<bool> TrainableMask() const;
  // Broadcasts the shares of every rank from their owners and waits.
  absl::Status SyncParams();
  // Rank `root`'s local state, in overall positions; `mine` when this is
  // `root`. Every rank calls it for the same root.
  absl::StatusOr<std::vector<nn::optim::OptimizerStateDict::ParamState>> BroadcastState(
      int root, const std::vector<nn::optim::OptimizerStateDict::ParamState>& mine);

  std::shared_ptr<distributed::ProcessGroup> group_;
  int rank_ = 0;
  int world_size_ = 1;
  bool as_bucket_view_ = false;
  Device default_device_;
  std::vector<std::vector<Tensor>> groups_;  // the exposed param groups
  std::vector<Tensor> all_params_;           // position -> parameter
  std::vector<std::vector<std::vector<int64_t>>> partition_;  // rank -> group -> positions
  std::vector<int> owner_;                                    // position -> rank
  std::vector<int64_t> local_position_;  // position -> index in its owner's local optimizer
  std::unique_ptr<nn::optim::Optimizer> local_;

  // Bucket view (Note [ZeRO buckets] in the .cc).
  struct BucketSlot {
    int64_t position;  // the parameter
    int64_t offset;    // element offset in its bucket
    bool aliased;      // the parameter's memory is the bucket's; else copied around broadcasts
  };
  std::vector<Device> bucket_devices_;
  std::vector<std::vector<Tensor>> buckets_;                   // device -> rank -> flat
  std::vector<std::vector<std::vector<BucketSlot>>> slots_;    // device -> rank -> slots
  std::vector<bool> in_bucket_;                                // position -> aliased now
  std::vector<bool> trainable_;                                // requires_grad at the last build

  // consolidate_state_dict's result on the target rank, in overall positions.
  std::optional<std::vector<nn::optim::OptimizerStateDict::ParamState>> consolidated_;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_ZERO_REDUNDANCY_OPTIMIZER_H_
