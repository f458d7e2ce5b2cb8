#include "distributed/future.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "tensor/error.h"

namespace ember::distributed {
namespace {

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

}  // namespace

std::shared_ptr<Future> Future::Completed(std::vector<Tensor> value) {
  std::shared_ptr<Future> f(new Future());
  f->Complete(absl::OkStatus(), std::move(value));
  return f;
}

std::shared_ptr<Future> Future::Failed(absl::Status status) {
  std::shared_ptr<Future> f(new Future());
  f->Complete(status.ok() ? absl::InternalError("Future::Failed with an OK status") : status, {});
  return f;
}

std::shared_ptr<Future> Future::FromOp(std::function<absl::Status(absl::Duration)> wait,
                                       std::function<bool()> poll,
                                       std::function<std::vector<Tensor>()> value) {
  std::shared_ptr<Future> f(new Future());
  f->op_wait_ = std::move(wait);
  f->op_poll_ = std::move(poll);
  f->op_value_ = std::move(value);
  return f;
}

std::shared_ptr<Future> Future::then(Step step) {
  std::shared_ptr<Future> f(new Future());
  f->parent_ = shared_from_this();
  f->step_ = std::move(step);
  return f;
}

std::shared_ptr<Future> Future::then_async(AsyncStep step) {
  std::shared_ptr<Future> f(new Future());
  f->parent_ = shared_from_this();
  f->async_step_ = std::move(step);
  return f;
}

void Future::Complete(absl::Status status, std::vector<Tensor> value) {
  absl::MutexLock lock(&mu_);
  if (complete_) return;
  if (status.ok()) value_ = std::move(value);
  status_ = std::move(status);
  complete_ = true;
}

absl::Status Future::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

const std::vector<Tensor>& Future::value() const { return value_; }

bool Future::done() {
  (void)Advance(/*block=*/false, absl::InfinitePast());
  absl::MutexLock lock(&mu_);
  return complete_;
}

absl::Status Future::wait(absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  const absl::Status advanced = Advance(/*block=*/true, deadline);
  absl::MutexLock lock(&mu_);
  if (complete_) return status_;
  return advanced.ok() ? absl::DeadlineExceededError("Future::wait: timed out") : advanced;
}

absl::Status Future::Advance(bool block, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    // Another thread is advancing it: wait for that (until the deadline).
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return complete_ || !running_; };
    if (block) {
      mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
    }
    if (complete_) return absl::OkStatus();
    if (running_) {
      return block ? absl::DeadlineExceededError("Future::wait: timed out") : absl::OkStatus();
    }
    running_ = true;
  }
  absl::Status result;
  std::shared_ptr<Future> inner;
  {
    absl::MutexLock lock(&mu_);
    inner = inner_;
  }
  auto finish = [&](absl::Status status, std::vector<Tensor> value) {
    Complete(std::move(status), std::move(value));
  };
  if (op_wait_) {
    if (block || op_poll_()) {
      absl::Status s = op_wait_(block ? Left(deadline) : absl::InfiniteDuration());
      if (absl::IsDeadlineExceeded(s) && !op_poll_()) {
        result = s;  // this wait's own timeout; the op runs on
      } else {
        finish(s, s.ok() ? op_value_() : std::vector<Tensor>());
      }
    }
  } else if (parent_ != nullptr) {
    if (inner == nullptr && block) {
      // Only a wait runs the step (Note [Futures run their steps when asked]).
      const bool parent_done = parent_->wait(Left(deadline)).ok() || parent_->done();
      if (!parent_done) {
        result = absl::DeadlineExceededError("Future::wait: timed out");
      } else if (absl::Status ps = parent_->status(); !ps.ok()) {
        finish(ps, {});
      } else {
        try {
          if (step_) {
            absl::StatusOr<std::vector<Tensor>> r = step_(*parent_);
            if (r.ok()) {
              finish(absl::OkStatus(), *std::move(r));
            } else {
              finish(r.status(), {});
            }
          } else {
            absl::StatusOr<std::shared_ptr<Future>> r = async_step_(*parent_);
            if (!r.ok()) {
              finish(r.status(), {});
            } else if (*r == nullptr) {
              finish(absl::InternalError("Future::then_async: the step returned a null future"),
                     {});
            } else {
              inner = *std::move(r);
              absl::MutexLock lock(&mu_);
              inner_ = inner;
            }
          }
        } catch (const Error& e) {
          finish(absl::InternalError(e.what()), {});
        }
      }
    }
    if (inner != nullptr) {
      const bool inner_done = block ? inner->wait(Left(deadline)).ok() || inner->done()
                                    : inner->done();
      if (inner_done) {
        finish(inner->status(), inner->value());
      } else if (block) {
        result = absl::DeadlineExceededError("Future::wait: timed out");
      }
    }
  }
  absl::MutexLock lock(&mu_);
  running_ = false;
  return result;
}

}  // namespace ember::distributed
