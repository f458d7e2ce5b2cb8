// Future: the result of an asynchronous op and the steps chained after it
// (torch.futures.Future, as Work.get_future() and DDP's communication hooks
// use it). A future holds a list of tensors once it completes, or the error
// it failed with.
//
//   std::shared_ptr<Future> reduced = work->get_future();   // completes with work
//   std::shared_ptr<Future> scaled = reduced->then(
//       [](const Future& f) -> absl::StatusOr<std::vector<Tensor>> {
//         return std::vector<Tensor>{f.value()[0].div(2)};
//       });
//   absl::Status s = scaled->wait();   // scaled->value()[0] is the result
//
// Note [Futures run their steps when asked]
// A step given to then() runs when someone waits for its future (wait()),
// on the waiting thread, once its parent has completed; never at a moment
// that depends on when an op happened to finish. So a step may issue more
// collectives, and every rank issues them at the same point of its program
// (the point where it waits), which collectives need: ranks that issued a
// chain's next all_reduce at different moments would disagree on the order
// of their collectives. then_async() chains a step that starts another
// asynchronous op and returns its future; the chained future completes when
// that one does. done() says whether a future has completed without running
// any step: an op's future polls its op; a chained future is done once a
// wait() has run its step and what that step waits on has completed. A step
// that throws ember::Error or returns an error fails its future, and every
// future chained after it, with the same status; the steps after it do not
// run.
//
// Devices: a future made from a Work completes as the Work does (wait()
// calls Work::wait(): on nccl that makes the caller's current stream wait
// rather than the host), so a step that reads device tensors queues behind
// the op on the caller's stream, as PyTorch's CUDA futures do.
//
// Thread-safety: thread-safe; a step runs outside the lock, once, on the
// thread of the first wait() that finds its parent complete.
#ifndef EMBER_DISTRIBUTED_FUTURE_H_
#define EMBER_DISTRIBUTED_FUTURE_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tensor/tensor.h"

namespace ember::distributed {

class Future : public std::enable_shared_from_this<Future> {
 public:
  using Step = std::function<absl::StatusOr<std::vector<Tensor>>(const Future& parent)>;
  using AsyncStep =
      std::function<absl::StatusOr<std::shared_ptr<Future>>(const Future& parent)>;

  // A future done with `value` (torch.futures.Future with set_result).
  static std::shared_ptr<Future> Completed(std::vector<Tensor> value);
  // A future failed with `status` (not OK).
  static std::shared_ptr<Future> Failed(absl::Status status);
  // A future that completes when `wait(timeout)` returns OK with `value()`;
  // `poll()` says, without blocking, whether it would return at once. What
  // Work::get_future() builds on.
  static std::shared_ptr<Future> FromOp(std::function<absl::Status(absl::Duration)> wait,
                                        std::function<bool()> poll,
                                        std::function<std::vector<Tensor>()> value);

  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  // Blocks until the future completes, running the steps it waits on (Note
  // [Futures run their steps when asked]); its status. With a timeout that
  // passes first: kDeadlineExceeded, and the future keeps running.
  absl::Status wait(absl::Duration timeout = absl::InfiniteDuration());
  // Whether it has completed; runs no step (Note [Futures run their steps
  // when asked]) and never blocks on an op.
  bool done();
  // The status once complete (OK before).
  absl::Status status() const;
  // The tensors it completed with; empty before completion or after a
  // failure.
  const std::vector<Tensor>& value() const;

  // A future of `step(*this)`, run by the first wait() on it once this one
  // has completed successfully.
  std::shared_ptr<Future> then(Step step);
  // A future that completes as the future `step(*this)` returns does.
  std::shared_ptr<Future> then_async(AsyncStep step);

 private:
  Future() = default;
  // Completes with what the op, step or inner future gave; the caller holds
  // no lock.
  void Complete(absl::Status status, std::vector<Tensor> value);
  // One attempt at progress; `block` waits for the op or the parent.
  absl::Status Advance(bool block, absl::Time deadline);

  mutable absl::Mutex mu_;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<Tensor> value_;  // written once, before complete_ is set

  // What it waits on: an op, a parent with a step, or an inner future.
  std::function<absl::Status(absl::Duration)> op_wait_;
  std::function<bool()> op_poll_;
  std::function<std::vector<Tensor>()> op_value_;
  std::shared_ptr<Future> parent_;
  Step step_;
  AsyncStep async_step_;
  std::shared_ptr<Future> inner_ ABSL_GUARDED_BY(mu_);
  // A thread is advancing it (waiting on the op, the parent, or running the
  // step); others wait for it to finish.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_FUTURE_H_
