// DistributedDataParallel: data-parallel training across processes
// (torch.nn.parallel.DistributedDataParallel). Every rank wraps its own copy
// of the model; each trains on its own part of the batch, and backward
// averages the gradients over the ranks of a process group, so that after
// optimizer.step() every rank holds the same parameters as one process that
// trained on the whole batch.
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "serialization/serialization.h"
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/sgd.h"
//   #include "parallel/distributed_data_parallel.h"
//   #include "tensor/factories.h"
//   // Every process, started by `launch --nproc_per_node=2 prog`:
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "tcp"}));
//   auto model = std::make_shared<ember::nn::Sequential>();
//   model->push_back(std::make_shared<ember::nn::Linear>(8, 16));
//   model->push_back(std::make_shared<ember::nn::ReLU>());
//   model->push_back(std::make_shared<ember::nn::Linear>(16, 4));
//   EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(model));
//   ember::nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
//   for (int step = 0; step < 100; ++step) {
//     ember::Tensor x = ember::randn({32, 8}), y = ember::randint(0, 4, {32});
//     opt.zero_grad();
//     ember::nn::functional::cross_entropy((*ddp)(x), y).backward();  // gradients averaged
//     opt.step();
//   }
//   if (ember::distributed::get_rank() == 0) {
//     EMBER_RETURN_IF_ERROR(ember::save(ddp->module()->state_dict(), "model.pt"));
//   }
//   ```
//
// What create() does: checks that every rank holds parameters and buffers of
// the same names' count, shapes and dtypes (an error naming the first
// difference otherwise), then broadcasts every parameter and buffer from
// rank 0, so all ranks start equal. It then arms the gradient buckets (Note
// [Gradient buckets] in parallel/reducer.h): during backward each bucket's
// asynchronous all_reduce starts as soon as its last gradient is
// accumulated, overlapping communication with the rest of backward, and a
// callback at the end of backward waits for them and writes the averaged
// gradients into grad().
//
// forward() broadcasts the buffers from rank 0 first (broadcast_buffers),
// runs the module, and arms the hooks for the backward pass of its output
// (unless grad mode is off or no_sync() is active). Under no_sync() the
// gradients only accumulate locally; the first backward after it averages
// the accumulated sum, as torch's no_sync does.
//
// Checkpoints: module() is the wrapped module, so
// `ddp->module()->state_dict()` is an ordinary state_dict that a plain
// module (or PyTorch, through hub::SaveCheckpoint) loads. The DDP module's
// own state_dict() has the keys prefixed "module.", as torch's.
//
// Devices: the module lives on one device, the CPU or one GPU per process
// (torch's single-device modules); its parameters, buffers, the gradient
// buckets and every collective stay there. On a GPU the group's backend must
// take device tensors (nccl; gloo through pinned staging, which lets two ranks
// share one GPU); nothing on the way blocks the host: each bucket's all_reduce
// queues behind the gradients it carries and the end of backward makes the
// caller's current stream wait for them (Note [Device control values] in
// reducer.h). A module whose tensors span devices, or device_ids that are not
// the module's device, is refused with the devices named.
//
// Communication hooks (register_comm_hook): a hook replaces the division
// and all_reduce of each bucket, e.g. to compress it (fp16, bf16, PowerSGD;
// parallel/comm_hooks.h), as torch's DDP communication hooks.
//
// Uneven inputs (parallel/join.h): DistributedDataParallel is a Joinable.
// Inside a Join, each forward first notifies the join context, takes the
// buffers from the highest rank still training rather than from rank 0
// (which may have joined with stale buffers), and tells the joined ranks
// whether this iteration synchronises gradients; a joined rank's main hook
// issues the same buffer broadcast and, when some rank synchronises, one
// reduction of zeros per bucket (through the communication hook if there is
// one); the post hook broadcasts the parameters and buffers of the highest
// rank among the last to join to every rank (torch's _sync_final_model).
// As in torch, buffers are broadcast at a forward only when the previous
// forward synchronised gradients (its require_forward_param_sync), so
// every rank, joined or not, agrees on that broadcast.
//
// static_graph (Note [Static graphs] in parallel/reducer.h): the first
// synchronised backward counts each parameter's gradient accumulations and
// finds the parameters no rank uses; later ones need no graph walk.
//
// Limits: one device per process, a module with one input and one output
// tensor (Module's interface), buckets fixed at construction (torch rebuilds them after the first
// iteration from the order gradients arrived in). Parameters must not be replaced (to(),
// set_parameter) after wrapping: the hooks watch the tensors present then.
//
// Errors: create() returns absl::Status (kInvalidArgument for a null module,
// no parameter that requires grad, bucket_cap_mb <= 0, a module spanning
// devices, device_ids or output_device that do not fit the module;
// kFailedPrecondition without a process group; kInvalidArgument naming the
// first parameter or buffer that differs across ranks; the group's error
// when a collective fails). forward() and backward() run behind
// Module::operator() and Tensor::backward(), so they throw ember::Error:
// parameters without gradients (naming them), ranks that disagree on
// which parameters got gradients, and a failed or timed-out collective (a
// dead peer makes backward throw, naming it, within the group's timeout).
// On a GPU a peer's missing gradients are reported at a later forward (Note
// [Device control values] in reducer.h).
//
// Thread-safety: thread-compatible, as Module: one iteration (forward and
// its backward) at a time.
#ifndef EMBER_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
#define EMBER_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "nn/module.h"
#include "parallel/join.h"
#include "parallel/reducer.h"
#include "tensor/tensor.h"

namespace ember::parallel {

struct DistributedDataParallelOptions {
  // torch's device_ids: for a module on one GPU, empty or that one device
  // (one device per process); forward() then moves its input there. Must be
  // empty for a CPU module. Anything else is an InvalidArgument naming it.
  std::vector<Device> device_ids;
  // torch's output_device: where forward() puts its output, for a GPU module
  // only; unset: device_ids[0] (the output stays where the module made it).
  std::optional<Device> output_device;
  // The group to average over; null: the default group
  // (distributed::init_process_group).
  std::shared_ptr<distributed::ProcessGroup> process_group;
  // Broadcast the buffers from rank 0 at the start of every forward().
  bool broadcast_buffers = true;
  // The largest bucket, in MiB (the first bucket holds at most 1 MiB, or
  // bucket_cap_mb when smaller).
  double bucket_cap_mb = 25;
  // Walk the autograd graph of every forward's output and treat the
  // parameters it does not reach as ready with a zero gradient. Without it,
  // a parameter that gets no gradient is an error at the end of backward.
  bool find_unused_parameters = false;
  // Make every parameter's grad() a view of its bucket, saving one copy of
  // the gradients each way (torch's gradient_as_bucket_view).
  bool gradient_as_bucket_view = false;
  // torch's static_graph: the set of parameters used, and how often, is the
  // same every iteration (Note [Static graphs] in parallel/reducer.h).
  bool static_graph = false;
};

// What torch's _get_ddp_logging_data reports that is useful here.
struct DdpLoggingData {
  int64_t world_size = 0;
  std::vector<int64_t> bucket_bytes;  // gradient bytes per bucket, in launch order
  ReducerStats stats;                 // summed over synchronised iterations
};

class DistributedDataParallel : public nn::Module, public Joinable {
 public:
  // Wraps `module` (see above; blocks for the shape check and the initial
  // broadcast, up to the group's timeout).
  static absl::StatusOr<std::shared_ptr<DistributedDataParallel>> create(
      std::shared_ptr<nn::Module> module, DistributedDataParallelOptions options = {});

  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "DistributedDataParallel"; }

  // The wrapped module (torch's ddp.module).
  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<distributed::ProcessGroup>& process_group() const { return group_; }
  // The device of the module's parameters and buffers.
  Device device() const { return device_; }

  // torch's no_sync(): while the returned guard lives, forward() does not
  // arm gradient synchronisation, so backward only accumulates locally.
  class NoSyncGuard {
   public:
    ~NoSyncGuard() {
      if (ddp_ != nullptr) ddp_->require_backward_grad_sync_ = previous_;
    }
    NoSyncGuard(NoSyncGuard&& other) noexcept : ddp_(other.ddp_), previous_(other.previous_) {
      other.ddp_ = nullptr;
    }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    friend class DistributedDataParallel;
    explicit NoSyncGuard(DistributedDataParallel* ddp)
        : ddp_(ddp), previous_(ddp->require_backward_grad_sync_) {
      ddp_->require_backward_grad_sync_ = false;
    }
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(this); }

  // torch's register_comm_hook: `hook` reduces each gradient bucket in place
  // of the built-in all_reduce, from the next backward on (Note
  // [Communication hooks] in parallel/reducer.h; PyTorch's built-in hooks,
  // PowerSGD among them, are in parallel/comm_hooks.h). The state torch
  // passes beside the hook is whatever the hook captures.
  // FailedPrecondition when a hook is already registered (one per module,
  // as torch) or between a forward and its backward.
  absl::Status register_comm_hook(CommHook hook);

  DdpLoggingData get_ddp_logging_data() const;

  // torch's ddp.join(...): a Join of this module alone (parallel/join.h).
  absl::StatusOr<std::unique_ptr<Join>> join(JoinOptions options = {});

  // Joinable (Note [Join] in parallel/join.h).
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  Device join_device() const override { return device_; }
  std::shared_ptr<distributed::ProcessGroup> join_process_group() const override { return group_; }

 private:
  class DdpJoinHook;
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<distributed::ProcessGroup> group,
                          DistributedDataParallelOptions options);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  Device device_;
  std::shared_ptr<Reducer> reducer_;
  bool require_backward_grad_sync_ = true;
  // Whether the next forward broadcasts the buffers: the previous forward
  // synchronised gradients (torch's require_forward_param_sync).
  bool require_forward_param_sync_ = true;
  // Join: the hook's divide_by_initial_world_size, and the forward's
  // "synchronise this iteration" all_reduce in flight.
  bool divide_by_initial_world_size_ = true;
  JoinNotice sync_flag_;

  // The rank a broadcast comes from: the highest group rank for which
  // `candidate` holds (an all_reduce MAX). Throws ember::Error.
  int FindCommonRank(bool candidate);
  // Broadcasts the buffers from `root` when there are any. Throws.
  void BroadcastBuffers(int root);
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
