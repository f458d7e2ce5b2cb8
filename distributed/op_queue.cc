#include "distributed/op_queue.h"

#include <utility>

namespace ember::distributed {

// Note [Op queues]
// Collectives must be issued in the same order on every rank, and a backend
// that runs them in the background must keep that order: the tcp, gloo and
// mpi backends run their collectives (tcp its sends too) one at a time on
// one worker thread per group, in the order the calls were made. OpQueue is
// that queue and thread. What differs between the backends stays with them:
// - which ops it carries and how they are numbered (the backend numbers
//   them under its own lock and pushes in the same critical section, so the
//   numbers follow the queue's order);
// - whether an op may start (`admit`: gloo fails an op whose timeout passed
//   before its turn, tcp one queued after abort(); mpi runs every op, even
//   late, so that the ranks stay in step, Note [MPI timeouts]);
// - what runs between ops (`poll`: mpi tests its posted sends and receives);
// - what abort() and destruction do with what is queued (gloo and mpi take
//   it and fail it at once; tcp leaves it queued, so that it fails in order
//   as the worker reaches it, and lets the worker drain the queue when the
//   group is destroyed).
// The queue marks each admitted op started (Work::MarkStarted, the flight
// recorder's "started") just before it runs, and finishes its Work with the
// op's status; a Work finished earlier (abort) keeps its first status.

OpQueue::OpQueue(Hooks hooks) : hooks_(std::move(hooks)) {
  absl::MutexLock lock(&join_mu_);
  worker_ = std::thread([this] { WorkerLoop(); });
}

OpQueue::~OpQueue() { Join(); }

void OpQueue::Push(Op op) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(op));
}

std::vector<OpQueue::Op> OpQueue::TakeQueued() {
  absl::MutexLock lock(&mu_);
  std::vector<Op> taken(std::make_move_iterator(queue_.begin()),
                        std::make_move_iterator(queue_.end()));
  queue_.clear();
  return taken;
}

OpQueue::Running OpQueue::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

void OpQueue::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void OpQueue::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

bool OpQueue::WaitUntilStopped(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto left = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; };
  return mu_.AwaitWithDeadline(absl::Condition(&left), deadline);
}

void OpQueue::Join() {
  Stop();
  absl::MutexLock lock(&join_mu_);
  if (worker_.joinable()) worker_.join();
}

void OpQueue::WorkerLoop() {
  absl::Duration wait = absl::InfiniteDuration();
  while (true) {
    Op op;
    bool have = false;
    bool woken = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || woken_ || !queue_.empty();
      };
      if (wait == absl::InfiniteDuration()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      }
      woken = woken_;
      woken_ = false;
      if (!queue_.empty()) {
        op = std::move(queue_.front());
        queue_.pop_front();
        running_ = {op.work, op.what};
        have = true;
      } else if (stopping_) {
        stopped_ = true;
        return;
      }
    }
    if (have) {
      absl::Status status = hooks_.admit ? hooks_.admit(op) : absl::OkStatus();
      if (status.ok()) {
        op.work->MarkStarted();
        status = op.run();
      }
      op.work->Finish(std::move(status));
      absl::MutexLock lock(&mu_);
      running_ = {};
    }
    if (hooks_.poll) wait = hooks_.poll(woken);
  }
}

}  // namespace ember::distributed
