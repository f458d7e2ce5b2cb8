// Asynchronous distributed checkpoints (torch.distributed.checkpoint's
// async_save): the call copies the state dict into host memory and returns;
// a background thread writes the copy as save() does (checkpoint.h), while
// training goes on and changes the live tensors.
//
//   ```cpp compile-only
//   #include "absl/strings/str_cat.h"
//   #include "distributed/checkpoint/async_save.h"
//   #include "distributed/distributed.h"
//   namespace dcp = ember::distributed::checkpoint;
//   // A group of its own for the saves' collectives (see below).
//   EMBER_ASSIGN_OR_RETURN(auto ckpt_group, ember::distributed::new_group());
//   dcp::AsyncCheckpointer checkpointer;
//   for (int step = 1; step <= 1000; ++step) {
//     // ... one training step on `model` ...
//     if (step % 100 == 0) {
//       dcp::StateDict sd = {{"fc.weight", dcp::replicated(weight)}};
//       // Waits for the previous save (returning its error, if it failed),
//       // stages `sd`, and returns while the write goes on.
//       EMBER_ASSIGN_OR_RETURN(auto written,
//                              checkpointer.async_save(sd, {.path = absl::StrCat("/ckpt/", step),
//                                                           .process_group = ckpt_group}));
//     }
//   }
//   EMBER_RETURN_IF_ERROR(checkpointer.wait());  // the last save is committed
//   ```
//
// Note [Asynchronous saves]
// async_save() first waits for the save in flight, so at most one staged copy
// exists and saves commit in order; a save that failed and whose failure
// nobody has seen (through its future or wait()) is reported by that call,
// which then starts nothing (call again to save). It then copies every
// item's tensor into a staging tensor of its own on the host (pinned memory
// for device tensors, the copy made on the device's current stream and
// waited for), checking the total against max_staging_bytes before it
// allocates anything. With reuse_staging_buffers the staging tensors of the
// previous save are reused when the layout (keys, dtypes, shapes, devices)
// is the same, so steady-state saves allocate nothing. The background thread
// then runs save() on the staged copy with the checkpointer's plan cache
// (Note [Cached save plans]), so the atomic commit (Note [Atomic commit] in
// checkpoint.cc) holds as for a synchronous save: a failed or killed write
// leaves the previous checkpoint at its path. The data files go to the disk
// with direct I/O (Note [Direct writes] in data_file.h), so the background
// write's CPU time is mostly its checksums, not a copy into the page cache.
// Every collective of that save
// is bounded by the group's timeout, so the background write ends, and with
// it every wait, even when a peer dies. writer_nice can put the writer below
// the training threads; on a machine whose every core the training keeps busy
// that only stretches the write until the next save waits for it
// (BENCHMARKS.md, "distributed/checkpoint: async_save"), so it is off by
// default.
//
// The background save issues its collectives on options.process_group from
// its own thread. A process group runs collectives in the order each rank
// issues them, so a group that training uses at the same time would see the
// save's collectives and the training's interleaved differently on each
// rank: give async saves a group of their own (new_group, as PyTorch's
// documentation advises for its async_save), or use collective_free saves.
//
// Thread-safety: an AsyncCheckpointer is thread-compatible (one training
// thread calls it); its future may be waited for from any thread. The
// destructor waits for the save in flight.
#ifndef EMBER_DISTRIBUTED_CHECKPOINT_ASYNC_SAVE_H_
#define EMBER_DISTRIBUTED_CHECKPOINT_ASYNC_SAVE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/future.h"

namespace ember::distributed::checkpoint {

struct AsyncSaveOptions {
  // The most bytes one staged copy may hold; a larger state dict is refused
  // before anything is copied (InvalidArgument naming both). 0: no limit.
  int64_t max_staging_bytes = 0;
  // Keep the staging tensors for the next save of the same layout (torch's
  // cache_staged_state_dict).
  bool reuse_staging_buffers = true;
  // Reuse save plans across saves of the same layout (Note [Cached save
  // plans]).
  bool cache_plans = true;
  // The writer thread's nice value (setpriority): how far below the
  // training threads it runs; 0 keeps the caller's.
  int writer_nice = 0;
};

class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(AsyncSaveOptions options = {});
  // Waits for the save in flight.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Note [Asynchronous saves]: waits for the previous save, stages
  // `state_dict` and returns a future that completes (with no tensors) when
  // the checkpoint is committed, or fails with save()'s error. Errors of the
  // call itself: the previous save's unseen failure (annotated with its
  // path), InvalidArgument for an undefined tensor, a duplicate key or a
  // state dict above max_staging_bytes; save()'s own checks run in the
  // background and fail the future.
  absl::StatusOr<std::shared_ptr<Future>> async_save(const StateDict& state_dict,
                                                     const CheckpointOptions& options);

  // Waits for the save in flight (if any) and returns its outcome; OK when
  // none ran. kDeadlineExceeded when `timeout` passes first (the save goes
  // on).
  absl::Status wait(absl::Duration timeout = absl::InfiniteDuration());

  // Bytes the staging tensors hold now (kept between saves with
  // reuse_staging_buffers).
  int64_t staging_bytes() const;
  // The plan cache the background saves use (null without cache_plans).
  const std::shared_ptr<SavePlanCache>& plan_cache() const { return plan_cache_; }

 private:
  struct Save;  // one save in flight: its thread's outcome
  absl::Status WaitFor(Save& save, absl::Duration timeout);

  AsyncSaveOptions options_;
  std::shared_ptr<SavePlanCache> plan_cache_;
  std::shared_ptr<Save> in_flight_;
  std::thread writer_;
  // The staged copy of the last save, by position in its state dict.
  std::vector<std::string> staged_keys_;
  std::vector<Tensor> staged_;
};

// torch's dcp.async_save: async_save on one checkpointer per process (made
// at the first call, with AsyncSaveOptions' defaults).
absl::StatusOr<std::shared_ptr<Future>> async_save(const StateDict& state_dict,
                                                   const CheckpointOptions& options);

}  // namespace ember::distributed::checkpoint

#endif  // EMBER_DISTRIBUTED_CHECKPOINT_ASYNC_SAVE_H_
