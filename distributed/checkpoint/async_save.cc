#include "distributed/checkpoint/async_save.h"

#include <sys/resource.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/factories.h"

namespace ember::distributed::checkpoint {

// What the writer thread reports (Note [Asynchronous saves]).
struct AsyncCheckpointer::Save {
  std::string path;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  // Someone has been given the outcome (the future's wait, or wait()).
  bool seen ABSL_GUARDED_BY(mu) = false;

  absl::Status Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    auto finished = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return done; };
    if (!mu.AwaitWithDeadline(absl::Condition(&finished), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("the asynchronous save to ", path,
                                                      " is still being written after ",
                                                      absl::FormatDuration(timeout)));
    }
    seen = true;
    return status;
  }
};

AsyncCheckpointer::AsyncCheckpointer(AsyncSaveOptions options)
    : options_(options),
      plan_cache_(options.cache_plans ? std::make_shared<SavePlanCache>() : nullptr) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (writer_.joinable()) writer_.join();
}

absl::Status AsyncCheckpointer::WaitFor(Save& save, absl::Duration timeout) {
  absl::Status status = save.Wait(timeout);
  if (absl::IsDeadlineExceeded(status)) {
    absl::MutexLock lock(&save.mu);
    if (!save.done) return status;
  }
  if (writer_.joinable()) writer_.join();
  return status;
}

absl::Status AsyncCheckpointer::wait(absl::Duration timeout) {
  if (in_flight_ == nullptr) return absl::OkStatus();
  return WaitFor(*in_flight_, timeout);
}

int64_t AsyncCheckpointer::staging_bytes() const {
  int64_t bytes = 0;
  for (const Tensor& t : staged_) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

absl::StatusOr<std::shared_ptr<Future>> AsyncCheckpointer::async_save(
    const StateDict& state_dict, const CheckpointOptions& options) {
  // 1. The previous save: done, and its failure reported if nobody saw it.
  if (in_flight_ != nullptr) {
    bool unseen = false;
    {
      absl::MutexLock lock(&in_flight_->mu);
      unseen = !in_flight_->seen;
    }
    absl::Status previous = WaitFor(*in_flight_, absl::InfiniteDuration());
    const std::string previous_path = in_flight_->path;
    in_flight_.reset();
    if (!previous.ok() && unseen) {
      return absl::Status(previous.code(),
                          absl::StrCat("the previous asynchronous save, to ", previous_path,
                                       ", failed (nothing was started now; call again to "
                                       "save): ",
                                       previous.message()));
    }
  }

  // 2. Stage: check everything, then copy into host tensors of our own.
  int64_t bytes = 0;
  for (size_t i = 0; i < state_dict.size(); ++i) {
    const auto& [key, item] = state_dict[i];
    if (!item.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distributed checkpoint async_save: the tensor of \"", key, "\" is undefined"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (state_dict[j].first == key) {
        return absl::InvalidArgumentError(
            absl::StrCat("distributed checkpoint async_save: the key \"", key, "\" appears twice"));
      }
    }
    bytes += static_cast<int64_t>(item.tensor.nbytes());
  }
  if (options_.max_staging_bytes > 0 && bytes > options_.max_staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed checkpoint async_save: the state dict holds ", bytes,
                     " bytes, more than max_staging_bytes (", options_.max_staging_bytes,
                     "); raise the limit, save synchronously, or save fewer tensors at a time"));
  }
  bool reuse = options_.reuse_staging_buffers && staged_.size() == state_dict.size();
  for (size_t i = 0; reuse && i < state_dict.size(); ++i) {
    const Tensor& t = state_dict[i].second.tensor;
    const Tensor& s = staged_[i];
    reuse = staged_keys_[i] == state_dict[i].first && s.dtype() == t.dtype() &&
            s.sizes() == t.sizes() && s.is_pinned() == !t.is_cpu();
  }
  if (!reuse) {
    staged_.clear();
    staged_keys_.clear();
    for (const auto& [key, item] : state_dict) {
      const Tensor& t = item.tensor;
      staged_.push_back(
          empty(t.sizes(), TensorOptions().dtype(t.dtype()).pinned_memory(!t.is_cpu())));
      staged_keys_.push_back(key);
    }
  }
  StateDict staged;
  staged.reserve(state_dict.size());
  for (size_t i = 0; i < state_dict.size(); ++i) {
    const auto& [key, item] = state_dict[i];
    // On a device the copy queues on its current stream and is waited for.
    staged_[i].copy_(item.tensor.detach());
    staged.push_back({key, Item{staged_[i], item.placement}});
  }
  if (!options_.reuse_staging_buffers) {
    staged_.clear();
    staged_keys_.clear();
  }

  // 3. Write in the background.
  auto save = std::make_shared<Save>();
  save->path = options.path;
  CheckpointOptions background = options;
  if (plan_cache_ != nullptr && background.plan_cache == nullptr)
    background.plan_cache = plan_cache_;
  const int nice = options_.writer_nice;
  writer_ = std::thread([save, staged = std::move(staged), background, nice]() {
    // Below the training threads (Note [Asynchronous saves]).
    if (nice != 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
    absl::Status status = checkpoint::save(staged, background);
    absl::MutexLock lock(&save->mu);
    save->status = std::move(status);
    save->done = true;
  });
  in_flight_ = save;
  return Future::FromOp([save](absl::Duration timeout) { return save->Wait(timeout); },
                        [save] {
                          absl::MutexLock lock(&save->mu);
                          return save->done;
                        },
                        [] { return std::vector<Tensor>(); });
}

absl::StatusOr<std::shared_ptr<Future>> async_save(const StateDict& state_dict,
                                                   const CheckpointOptions& options) {
  static absl::Mutex mu(absl::kConstInit);
  static AsyncCheckpointer* checkpointer = nullptr;
  absl::MutexLock lock(&mu);
  if (checkpointer == nullptr) checkpointer = new AsyncCheckpointer();
  return checkpointer->async_save(state_dict, options);
}

}  // namespace ember::distributed::checkpoint
