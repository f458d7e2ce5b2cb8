// OpQueue: the queue of a backend's ops and the one worker thread that runs
// them, one at a time, in the order they were queued (Note [Op queues] in
// op_queue.cc). The tcp, gloo and mpi backends run their collectives on one.
// A seam for backends (README.md "API rules"): not API.
//
//   OpQueue queue({.admit = [](const OpQueue::Op& op) -> absl::Status {
//     if (absl::Now() < op.deadline) return absl::OkStatus();
//     return absl::DeadlineExceededError(absl::StrCat(op.what, ": too late to start"));
//   }});
//   auto work = std::make_shared<Work>(OpType::kBarrier, deadline);
//   queue.Push({.work = work, .what = "barrier (collective #0)", .deadline = deadline,
//               .run = [] { return absl::OkStatus(); }});
//   EMBER_RETURN_IF_ERROR(work->wait());
//
// The worker takes the ops in queue order. For each: `admit` (when given)
// may refuse it, which finishes its Work with that status without running
// it; otherwise the Work is marked started (Work::MarkStarted), `run` runs
// and its status finishes the Work. Between ops, and while idle at the
// interval `poll` returned last, the worker calls `poll` (mpi completes its
// posted sends and receives there). The hooks and `run` are called on the
// worker with no lock of the queue held, so they may call the queue (except
// Join).
//
// What happens to queued ops on abort or destruction is the backend's
// choice: TakeQueued hands them back to be failed, and Stop lets the worker
// leave once the queue is empty, so what is still queued at Stop runs first.
//
// Thread-safety: every method may be called from any thread but Join, which
// must not be called from the worker.
#ifndef EMBER_DISTRIBUTED_OP_QUEUE_H_
#define EMBER_DISTRIBUTED_OP_QUEUE_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"

namespace ember::distributed {

class OpQueue {
 public:
  struct Op {
    std::shared_ptr<Work> work;
    // Names the op in errors: "all_reduce (collective #3)".
    std::string what;
    // When the op's timeout ends (for `admit`; the queue itself never
    // enforces it).
    absl::Time deadline = absl::InfiniteFuture();
    // Runs the op on the worker; its status finishes `work`.
    std::function<absl::Status()> run;
  };
  struct Hooks {
    // Called on the worker as each op comes up: a non-OK status finishes
    // the op's Work with it, and the op is neither started nor run.
    std::function<absl::Status(const Op& op)> admit;
    // Called on the worker after each op and, while the queue is empty, when
    // the interval it returned last has passed or Wake() was called;
    // `woken`: Wake() was called since the last call. Returns how long the
    // worker may wait for an op before calling it again
    // (absl::InfiniteDuration(): until the next op or Wake()).
    std::function<absl::Duration(bool woken)> poll;
  };
  // The op the worker is running now; `work` is null when none.
  struct Running {
    std::shared_ptr<Work> work;
    std::string what;
  };

  // Starts the worker.
  explicit OpQueue(Hooks hooks = {});
  // Stop(), then Join(): runs what is still queued first.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Queues `op` behind every op queued before it.
  void Push(Op op) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes every op still queued, in queue order; their Works are the
  // caller's to finish. The op running now is not among them.
  std::vector<Op> TakeQueued() ABSL_LOCKS_EXCLUDED(mu_);
  Running running() const ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the worker call `poll` now (after the op it is running, if any).
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  // The worker leaves once the queue is empty: after the op it is running
  // and every op still queued (TakeQueued first to drop them). Ops queued
  // after Stop still run while the worker has not left.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // After Stop: waits until the worker has left or `deadline` passes;
  // whether it has left.
  bool WaitUntilStopped(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Stop(), then waits for the worker thread to end. Idempotent.
  void Join() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Hooks hooks_;
  mutable absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  Running running_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the worker has left its loop
  absl::Mutex join_mu_;
  std::thread worker_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_OP_QUEUE_H_
