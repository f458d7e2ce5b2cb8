// Join: training with uneven inputs across ranks
// (torch.distributed.algorithms.Join). A rank that runs out of inputs before
// the others calls join(); until every rank has, it shadows the collectives
// each training iteration of the others issues (the joinables' main hooks),
// so that nobody waits for a collective that never comes; then each joinable
// runs its post hook (DDP: every rank takes the model of a rank that trained
// longest).
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/sgd.h"
//   #include "parallel/distributed_data_parallel.h"
//   #include "parallel/join.h"
//   #include "tensor/factories.h"
//   // Every process, after init_process_group; rank r has 10 + r batches.
//   EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(
//                                        std::make_shared<ember::nn::Linear>(4, 1)));
//   ember::nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
//   EMBER_ASSIGN_OR_RETURN(auto join, ember::parallel::Join::create({ddp}));
//   for (int step = 0; step < 10 + ember::distributed::get_rank(); ++step) {
//     opt.zero_grad();
//     ember::nn::functional::mse_loss((*ddp)(ember::randn({8, 4})), ember::randn({8, 1}))
//         .backward();
//     opt.step();
//   }
//   EMBER_RETURN_IF_ERROR(join->join());  // shadows the others' last iterations
//   ```
//
// Note [Join]
// Each iteration of a rank still training starts with the first joinable's
// notify_join_context: an all_reduce of 1 over the join group. A joined rank
// loops: it all_reduces 0, which meets that all_reduce and sums to the
// number of ranks still training; while that is not 0 it runs every main
// hook (the shadow of one iteration) and counts itself not a last joiner;
// once it is 0 (every rank in the loop) the post hooks run. With
// throw_on_early_termination, notify_join_context also all_reduces 0 and a
// joined rank answers with 1 instead of shadowing: every rank still
// training fails that iteration with "Detected at least one rank that
// exhausted inputs. Throwing across all ranks." and the joined rank's
// join() returns "Rank r exhausted all inputs." (kOutOfRange, both), as
// PyTorch's RuntimeErrors. Every joinable of one Join must use the same
// process group; the first joinable's device carries the counts.
//
// Without join() (an error left the loop, or the Join is destroyed first)
// the joinables simply go back to working without a join context, as torch's
// context manager does when its body raises. A joined rank that waits in
// join() is bounded by the group's timeout at each all_reduce.
//
// Thread-safety: thread-compatible; one Join per set of joinables at a time,
// used from the training thread.
#ifndef EMBER_PARALLEL_JOIN_H_
#define EMBER_PARALLEL_JOIN_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "distributed/process_group.h"
#include "tensor/tensor.h"

namespace ember::parallel {

// Join's arguments, and the options every joinable's join hook receives
// (torch forwards its **kwargs to join_hook).
struct JoinOptions {
  // false: join() returns at once and the joinables issue nothing extra
  // (for inputs known to be even).
  bool enable = true;
  // Fail every rank when one runs out of inputs, instead of shadowing.
  bool throw_on_early_termination = false;
  // DistributedDataParallel's hook: divide the gradients by the group's
  // size (true, torch's default) or by the number of ranks still training.
  bool divide_by_initial_world_size = true;
};

// What a joinable's hook does for a rank that has joined.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Issues the collectives of one training iteration of the ranks still
  // training (forward, backward, step), called once per such iteration.
  virtual absl::Status main_hook() { return absl::OkStatus(); }
  // After every rank has joined; `is_last_joiner`: no rank trained longer.
  virtual absl::Status post_hook(bool is_last_joiner) {
    (void)is_last_joiner;
    return absl::OkStatus();
  }
};

// What a Join sets on each joinable (torch's _JoinConfig).
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
};

// A class whose collectives a Join can shadow (torch's Joinable):
// DistributedDataParallel is one.
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // Where the join's counts live, and the group they are reduced over.
  virtual Device join_device() const = 0;
  virtual std::shared_ptr<distributed::ProcessGroup> join_process_group() const = 0;
  // Disabled unless a Join holds this joinable.
  const JoinConfig& join_config() const { return join_config_; }

 private:
  friend class Join;
  JoinConfig join_config_;
};

// What notify_join_context issued: the all_reduce whose `count` becomes
// the number of ranks still training once `work` completes.
struct JoinNotice {
  std::shared_ptr<distributed::Work> work;
  Tensor count;  // float32 [1] on the join device
};

class Join {
 public:
  // Sets each joinable's config (the first in the list is the one that
  // notifies) and makes the hooks. InvalidArgument for an empty list, a null
  // joinable, or joinables of different process groups.
  static absl::StatusOr<std::unique_ptr<Join>> create(
      const std::vector<std::shared_ptr<Joinable>>& joinables, JoinOptions options = {});
  // Restores the joinables' disabled configs.
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has no more inputs: shadows the others until every rank has
  // joined, then runs the post hooks (Note [Join]). Returns the first hook
  // error or collective failure; kOutOfRange "Rank r exhausted all inputs."
  // with throw_on_early_termination when some rank was still training; OK at
  // once when not enabled. Call it once.
  absl::Status join();

  // Called by a joinable at the start of each iteration, before its own
  // collectives (torch's Join.notify_join_context). Nothing (an empty
  // notice) unless the joinable is the first of an enabled Join; otherwise
  // issues the all_reduce of 1, and with throw_on_early_termination waits for
  // a second all_reduce that tells whether a rank has joined: kOutOfRange
  // "Detected at least one rank that exhausted inputs. Throwing across all
  // ranks." when one has. The group's error when a collective fails.
  static absl::StatusOr<JoinNotice> notify_join_context(const Joinable& joinable);

 private:
  Join(std::vector<std::shared_ptr<Joinable>> joinables, JoinOptions options,
       std::shared_ptr<distributed::ProcessGroup> group, Device device);
  // The sum over the group of `value` (0 or 1), waited for.
  absl::StatusOr<float> AllReduceCount(float value);

  std::vector<std::shared_ptr<Joinable>> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  Device device_;
  bool joined_ = false;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_JOIN_H_
