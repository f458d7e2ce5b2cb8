// FullyShardedDataParallel: sharded data-parallel training across processes
// (torch.distributed.fsdp.FullyShardedDataParallel; ZeRO-3 / ZeRO-2 / DDP-like
// by ShardingStrategy), over any distributed::ProcessGroup.
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/adam.h"
//   #include "parallel/fully_sharded_data_parallel.h"
//   #include "tensor/factories.h"
//   // Every process, started by `launch --nproc_per_node=2 prog`:
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "gloo"}));
//   auto model = std::make_shared<ember::nn::Sequential>();
//   auto fc1 = std::make_shared<ember::nn::Linear>(8, 64);
//   auto fc2 = std::make_shared<ember::nn::Linear>(64, 4);
//   model->push_back(fc1);
//   model->push_back(std::make_shared<ember::nn::ReLU>());
//   model->push_back(fc2);
//   EMBER_ASSIGN_OR_RETURN(auto fsdp, ember::parallel::fully_shard(
//                                         model, {.units = {fc1, fc2}}));  // FULL_SHARD
//   ember::nn::optim::Adam opt(fsdp->parameters(), {.lr = 1e-3});  // this rank's shards
//   for (int step = 0; step < 100; ++step) {
//     ember::Tensor x = ember::randn({32, 8}), y = ember::randint(0, 4, {32});
//     opt.zero_grad();
//     ember::nn::functional::cross_entropy((*fsdp)(x), y).backward();  // reduce-scattered
//     fsdp->clip_grad_norm_(1.0);                                      // the global norm
//     opt.step();                                                      // local shards only
//   }
//   EMBER_ASSIGN_OR_RETURN(ember::StateDict full, fsdp->full_state_dict());  // plain keys
//   ```
//
// Note [Flat parameters]
// The model is cut into units: every module in `units` (or, with
// `min_num_params`, every module whose parameters not yet in a smaller unit
// number at least that many: torch's size_based_auto_wrap_policy), and the
// root unit holding every parameter left over. A parameter belongs to the
// innermost unit that contains it. Each unit's parameters, in registration
// order, are laid end to end in one flat fp32 vector, padded with zeros to a
// multiple of the world size N, and cut into N equal shards; rank r keeps
// shard r as a leaf tensor that requires grad: the unit's flat parameter,
// registered as this module's parameter "flat_param_<unit>", so that
// parameters() is this rank's shards and any nn/optim optimizer built on them
// keeps sharded state. (NO_SHARD: the flat parameter is the whole vector.)
//
// The module's own parameter tensors stay in its registry with their shapes,
// names and AccumulateGrad nodes, but their storages hold memory only while
// their unit is unsharded: unsharding all-gathers the shards (asynchronously,
// all_gather_into_tensor) into one buffer of the compute dtype and points each
// parameter's storage into it (Storage::set_data_ptr: every view the
// autograd graph saved sees the same bytes); resharding points them at
// nothing again (an empty allocation on the same device: a parameter never
// changes device, which its AccumulateGrad recorded), freeing the buffer
// once nothing holds it. Reading a module parameter of a sharded unit
// outside forward and backward is invalid (its data pointer is null);
// full_state_dict() gives the values. Each time a
// unit's forward starts, its parameters' version counters count a new value
// (their bytes changed with no in-place op on them), so that what a kernel
// keeps per parameter version is not reused across steps.
//
// Note [FSDP iteration]
//   forward: the root unit is unsharded, then each unit's forward pre-hook
//     waits for its all_gather (issuing it unless prefetched) and, with
//     forward_prefetch, issues the all_gather of the unit that ran next in
//     the previous iteration; the forward hook reshards (FULL_SHARD, or any
//     strategy without grad mode) and puts a hook on the unit's output.
//     FULL_SHARD frees a unit when the next unit's forward starts or ends
//     rather than at its own end, so the unit whose forward ends last stays
//     gathered into backward, whose first unit it is, instead of being
//     freed and gathered again at once (torch keeps the root's parameters
//     for the same reason); during forward at most one extra unit is held,
//     never while another unit computes.
//   backward: the output hook of a unit (torch's pre-backward hook) waits for
//     the unit's all_gather (FULL_SHARD gathers again) and, with
//     backward_prefetch, issues the all_gather of the unit whose backward
//     comes next (the reverse of this iteration's forward order). When the
//     last of a unit's parameters has its gradient accumulated (Note
//     [Gradient readiness] in reducer.h), the unit's gradients are laid into
//     one flat padded vector of the reduce dtype, divided by N and
//     reduce-scattered (NO_SHARD: all-reduced); the full gradients are
//     dropped and the unit resharded. A callback at the end of backward
//     reduces the units whose parameters got no gradient (zeros, so that
//     every rank issues the same collectives), waits for every reduction in
//     issue order and adds each result (in fp32) to its flat parameter's
//     grad(), which the optimizer then reads.
//   Every collective is issued from the thread running forward and
//   backward, in an order that depends only on the model and the control
//   flow, so all ranks issue the same sequence.
//
// Strategies (torch's ShardingStrategy): FULL_SHARD frees a unit's gathered
// parameters after its forward and gathers them again for its backward;
// SHARD_GRAD_OP keeps them from forward to the end of the unit's backward;
// NO_SHARD keeps every parameter whole on every rank and all-reduces
// gradients, as DDP. HYBRID_SHARD and _HYBRID_SHARD_ZERO2 are FULL_SHARD and
// SHARD_GRAD_OP within a shard group, whose shards are replicated across a
// replicate group (Note [Hybrid sharding]).
//
// Note [Hybrid sharding]
// The world is a 2-D layout: R replicate groups' worth of shard groups of S
// ranks each (S x R = world size). Each unit is sharded over this rank's
// shard group exactly as FULL_SHARD shards it over a group of S (shard sizes
// ceil(numel / S)); the members of a replicate group hold the same shard.
// The groups are given (hybrid_process_groups: torch's process_group=(intra,
// inter), any 2-D layout), or create() makes them over the default group
// with new_group: shard groups of S consecutive ranks {0..S-1}, {S..2S-1},
// ..., then replicate groups {i, i+S, i+2S, ...}, all shard groups first,
// each in ascending order (torch's order). new_group is collective over the
// whole job, so every rank of the job must call create() with a hybrid
// strategy, with the same layout, at the same point (each call makes S + R
// new groups; with given groups, every rank must have made them in the same
// order too). S comes from shard_group_size, else device_mesh_shape {R, S},
// else LOCAL_WORLD_SIZE (one node's processes, as torch's default of one
// node's devices; torch counts devices, which on the CPU gives S = 1); with
// none of them create() refuses rather than guess. create() checks the
// layout (collective over both groups): S x R equals the world size (when a
// default group exists), and every member of a replicate group has the same
// rank in its shard group, and vice versa.
// Gradients: divided by torch's pre-divide factor f of the S x R world (the
// smallest power of two with (S x R) % f != 0 or (S x R) / f <= f),
// reduce-scattered over the shard group, all-reduced (SUM) over the replicate
// group, divided by (S x R) / f: torch's placement, so that rounding matches
// (the other strategies divide by the world size once, before the reduction).
// The all_reduces are issued in unit order once the backward graph is done,
// each after its unit's reduce_scatter completed. clip_grad_norm_ sums over
// the shard group only (replicas hold the same shards); full_state_dict
// gathers within the shard group. sync_module_states broadcasts over the
// whole world: from the replicate group's rank 0, then from the shard
// group's rank 0 (torch's order), so every rank ends with world rank 0's
// values when rank 0 is in the first shard group.
//
// Note [CPU offload]
// cpu_offload.offload_params (torch's CPUOffload(offload_params=True)) on a
// module on a GPU: each flat parameter shard is moved to pinned host memory
// after sharding, so parameters() are CPU tensors and the optimizer steps
// them (and keeps its state) on the CPU. Each unshard copies the shard to
// the compute device on a side stream (the current stream waits for it by
// an event) before casting and all-gathering it there; gradients are reduced
// on the device, copied without waiting into pinned host memory, and one
// synchronisation of the current stream at the end of backward precedes
// adding them to the CPU flat gradients. full_state_dict() gathers on the
// compute device and returns its values there. With a module on the CPU the
// shards are already where offloading would put them: the option is
// accepted and changes nothing (no pinning). torch 2.15 on a machine
// without a CUDA driver fails there at the first forward, when it pins the
// shard ("Found no NVIDIA driver on your system..."); where it can pin, its
// placement is the same as this.
//
// no_sync(): a forward inside it (decided at forward time, as torch) leaves
// the unsharded gradients accumulating in the module's parameters (full
// size, as torch's FSDP does); the first backward after it reduces the sum.
//
// Mixed precision: with param_dtype (bf16/fp16), the module's parameters and
// floating buffers are converted to it at creation (Module::to), the flat
// fp32 parameters stay the master copy that the optimizer updates, each
// unshard casts the shard and all-gathers it in param_dtype, and the root's
// floating input is cast to param_dtype (torch's cast_forward_inputs), so
// compute runs in param_dtype. Gradients are reduced in reduce_dtype
// (default: param_dtype) and added to the fp32 flat gradients.
//
// Errors: create() returns absl::Status (kInvalidArgument for a null module,
// a unit that is not a submodule of it, a parameter that does not require
// grad, one that does not own its storage, min_num_params < 0 or a
// non-floating mixed-precision dtype; for the hybrid strategies, a world size
// not divisible by the shard group size, a device_mesh_shape that is not 2-D
// or does not hold the world, groups that do not cover the world or whose
// ranks do not form a 2-D layout, options.process_group instead of
// hybrid_process_groups, only one of the two groups, or no layout at all;
// hybrid options with another strategy; kFailedPrecondition without a
// process group, or without a default group for hybrid groups to be made
// from; the group's errors for the initial broadcast and the layout check). forward() and
// backward() throw ember::Error: a failed or timed-out collective (the
// process group's message, naming the unit); after one, every later
// iteration is refused, since the ranks no longer agree on the sequence.
//
// Thread-safety: thread-compatible, as Module: one iteration (forward and
// its backward) at a time, on one thread.
#ifndef EMBER_PARALLEL_FULLY_SHARDED_DATA_PARALLEL_H_
#define EMBER_PARALLEL_FULLY_SHARDED_DATA_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "nn/module.h"
#include "parallel/reducer.h"
#include "tensor/tensor.h"

namespace ember::parallel {

// torch.distributed.fsdp.ShardingStrategy. kHybridShard and
// kHybridShardZero2 are torch's HYBRID_SHARD and _HYBRID_SHARD_ZERO2: FULL_SHARD
// and SHARD_GRAD_OP within a shard group, replicated across a replicate group
// (Note [Hybrid sharding]).
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard, kHybridShardZero2 };
// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2".
const char* sharding_strategy_name(ShardingStrategy strategy);
// kHybridShard or kHybridShardZero2.
bool is_hybrid_strategy(ShardingStrategy strategy);

// torch.distributed.fsdp.CPUOffload (Note [CPU offload]).
struct CPUOffload {
  // The flat parameter shards and their gradients live in (pinned) host
  // memory and the optimizer steps them there; each unshard copies the shard
  // to the compute device. A no-op in placement for a module on the CPU.
  bool offload_params = false;
};

// torch's process_group=(intra_node_group, inter_node_group) for the hybrid
// strategies: this rank's two groups. Both or neither.
struct HybridShardGroups {
  // The ranks that shard each unit among themselves (torch's intra-node group).
  std::shared_ptr<distributed::ProcessGroup> shard;
  // The ranks that hold the same shard (torch's inter-node group).
  std::shared_ptr<distributed::ProcessGroup> replicate;
};

// torch.distributed.fsdp.MixedPrecision (param_dtype, reduce_dtype).
struct MixedPrecision {
  // Gather and compute dtype; none: the parameters' own.
  std::optional<Dtype> param_dtype;
  // Gradient reduction dtype; none: param_dtype (else the parameters' own).
  std::optional<Dtype> reduce_dtype;
};

struct FullyShardOptions {
  // The group to shard over; null: the default group. Must be null for the
  // hybrid strategies, which take hybrid_process_groups.
  std::shared_ptr<distributed::ProcessGroup> process_group;
  ShardingStrategy sharding_strategy = ShardingStrategy::kFullShard;
  // Submodules that become units (torch's ModuleWrapPolicy, by instance).
  std::vector<std::shared_ptr<nn::Module>> units;
  // > 0: also make a unit of every submodule holding at least this many
  // parameters not yet in a smaller unit (size_based_auto_wrap_policy).
  int64_t min_num_params = 0;
  MixedPrecision mixed_precision;
  // Issue the next unit's all_gather before running the current unit's
  // forward (torch's forward_prefetch; off by default, as torch).
  bool forward_prefetch = false;
  // BackwardPrefetch.BACKWARD_PRE: issue the next unit's all_gather before
  // the current unit's backward computes (torch's default).
  bool backward_prefetch = true;
  // Broadcast rank 0's parameters and buffers before sharding (the hybrid
  // strategies: over the whole world, through the replicate group and then
  // the shard group, as torch).
  bool sync_module_states = true;
  CPUOffload cpu_offload;
  // The hybrid strategies (Note [Hybrid sharding]): the two groups, or, when
  // both are null, groups that create() makes from the default group: shard
  // groups of shard_group_size consecutive ranks, taken from, in order,
  // shard_group_size (> 0), device_mesh_shape[1], or the LOCAL_WORLD_SIZE
  // environment variable that the launcher sets (torch's default: one node's
  // devices).
  HybridShardGroups hybrid_process_groups;
  int shard_group_size = 0;
  // torch's 2-D device_mesh, by shape only: {replicas, shards}, whose product
  // is the world size (dim 0 replicates, dim 1 shards, as torch).
  std::vector<int> device_mesh_shape;
};

// One unit's flat parameter: what a checkpoint or a test needs to map this
// rank's shard back to the module's parameters.
struct FlatParamInfo {
  std::string module_name;  // the unit's path in the model ("" for the root)
  std::vector<std::string> names;  // full dotted names, in flat order
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;  // into the unpadded flat vector
  int64_t numel = 0;             // unpadded
  int64_t padded_numel = 0;      // shard_numel * (shards)
  int64_t shard_numel = 0;
  int64_t shard_offset = 0;  // where this rank's shard starts in the padded vector
};

// Timings and counts summed over the iterations that synchronised gradients.
struct FsdpStats {
  int64_t iterations = 0;
  int64_t all_gathers = 0;
  int64_t reductions = 0;
  // Time the forward and backward passes spent blocked waiting for an
  // all_gather: the communication that compute did not hide.
  absl::Duration all_gather_wait_time;
  // Spent after the autograd graph waiting for the gradient reductions.
  absl::Duration reduce_wait_time;
};

class FullyShardedDataParallel : public nn::Module {
 public:
  // Shards `module` (Note [Flat parameters]); blocks for the initial
  // broadcast up to the group's timeout.
  static absl::StatusOr<std::shared_ptr<FullyShardedDataParallel>> create(
      std::shared_ptr<nn::Module> module, FullyShardOptions options = {});
  ~FullyShardedDataParallel() override;

  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "FullyShardedDataParallel"; }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  // The group each unit is sharded over (the hybrid strategies: the shard
  // group, as torch's FSDP.process_group).
  const std::shared_ptr<distributed::ProcessGroup>& process_group() const { return group_; }
  // The hybrid strategies: the group holding this rank's shard; else null.
  const std::shared_ptr<distributed::ProcessGroup>& replicate_group() const { return replicate_; }
  ShardingStrategy sharding_strategy() const { return options_.sharding_strategy; }

  // torch's no_sync(): while the guard lives, forward() does not arm the
  // gradient reduction; gradients accumulate unsharded.
  class NoSyncGuard {
   public:
    ~NoSyncGuard() {
      if (fsdp_ != nullptr) fsdp_->require_backward_grad_sync_ = previous_;
    }
    NoSyncGuard(NoSyncGuard&& other) noexcept : fsdp_(other.fsdp_), previous_(other.previous_) {
      other.fsdp_ = nullptr;
    }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    friend class FullyShardedDataParallel;
    explicit NoSyncGuard(FullyShardedDataParallel* fsdp)
        : fsdp_(fsdp), previous_(fsdp->require_backward_grad_sync_) {
      fsdp_->require_backward_grad_sync_ = false;
    }
    FullyShardedDataParallel* fsdp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(this); }

  // torch's FSDP.clip_grad_norm_: the norm of every flat gradient of every
  // rank together (an all_reduce of the local sums; NO_SHARD needs none),
  // and every local flat gradient scaled by max_norm / (norm + 1e-6) when
  // that is below 1. Returns the total norm (0-dim float32). Throws
  // ember::Error for norm_type <= 0 or a failed all_reduce.
  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

  // Every parameter and persistent buffer under the wrapped module's plain
  // keys, whole, on every rank (all-gathers each unit; torch's
  // FULL_STATE_DICT with rank0_only off). Blocks up to the group's timeout.
  absl::StatusOr<ember::StateDict> full_state_dict();
  // Loads a full state dict (keys of the wrapped module): each rank keeps
  // its shard of every parameter, buffers are copied. No communication.
  absl::Status load_full_state_dict(const ember::StateDict& state);

  // Per unit, in the order of parameters(): its layout.
  const std::vector<FlatParamInfo>& flat_param_infos() const { return infos_; }
  const FsdpStats& stats() const { return stats_; }

 private:
  struct Unit;
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                           std::shared_ptr<distributed::ProcessGroup> group,
                           std::shared_ptr<distributed::ProcessGroup> replicate,
                           FullyShardOptions options);
  absl::Status Build(const std::vector<std::shared_ptr<nn::Module>>& unit_modules,
                     const std::vector<std::string>& unit_names);

  void CheckUsable() const;
  [[noreturn]] void Fail(const std::string& what, const absl::Status& status);
  Dtype ComputeDtype() const;
  Dtype ReduceDtype() const;
  void Unshard(Unit& unit);
  void WaitUnshard(Unit& unit);
  void Reshard(Unit& unit);
  void OnUnitForwardStart(size_t index);
  void OnUnitForwardEnd(size_t index, const Tensor& output);
  void OnPreBackward(size_t index);
  void OnGradReady(size_t unit, size_t param);
  void ReduceGradients(Unit& unit);
  void FinishBackward();
  void QueueFinishBackward();
  // FULL_SHARD and HYBRID_SHARD: free a unit's gathered parameters after its forward.
  bool ReshardsAfterForward() const;
  // Whether the module's parameters point into a gathered copy (freed after
  // use) rather than into the flat parameter itself.
  bool FreesUnsharded() const;
  Tensor ToComputeDevice(const Tensor& host) const;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  std::shared_ptr<distributed::ProcessGroup> replicate_;  // hybrid strategies only
  // The compute device: gathers and gradients (and the flat shards, unless
  // they are offloaded to the CPU).
  Device device_;
  bool offload_ = false;  // cpu_offload on a module not on the CPU
  // Gradient division before and after the reduction (hybrid strategies:
  // torch's gradient pre- and post-divide factors).
  double predivide_ = 1;
  double postdivide_ = 1;
  FullyShardOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;  // units_[0]: the root
  std::vector<FlatParamInfo> infos_;
  std::vector<nn::HookHandle> hook_handles_;
  bool require_backward_grad_sync_ = true;

  // Per iteration.
  bool in_iteration_ = false;     // between forward and the end of backward
  bool sync_gradients_ = true;    // decided at forward
  bool expect_backward_ = false;  // grad mode was on at forward
  std::vector<size_t> forward_order_;       // units (not the root) as forward ran them
  std::vector<size_t> last_forward_order_;  // the previous iteration's
  std::vector<size_t> backward_order_;      // root, then forward_order_ reversed
  // FULL_SHARD: the unit whose forward ended last, still gathered until
  // another unit's forward starts or ends (Note [FSDP iteration]).
  std::optional<size_t> kept_gathered_;
  EndOfBackward end_of_backward_;

  absl::Status failure_;  // sticky
  FsdpStats stats_;
};

// torch.distributed.fsdp.fully_shard's spelling of create().
inline absl::StatusOr<std::shared_ptr<FullyShardedDataParallel>> fully_shard(
    std::shared_ptr<nn::Module> module, FullyShardOptions options = {}) {
  return FullyShardedDataParallel::create(std::move(module), std::move(options));
}

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_FULLY_SHARDED_DATA_PARALLEL_H_
