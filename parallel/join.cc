#include "parallel/join.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "parallel/warning.h"
#include "tensor/factories.h"

namespace ember::parallel {
namespace {

// torch's warning threshold for a rank that shadows many iterations.
constexpr int kUnevenWarnThreshold = 1000;

absl::Status Annotate(const absl::Status& status, const std::string& what) {
  return absl::Status(status.code(), absl::StrCat("Join: ", what, ": ", status.message()));
}

// The all_reduce (SUM) of a float32 [1] holding `value` on `device`.
absl::StatusOr<JoinNotice> IssueCount(distributed::ProcessGroup& group, Device device,
                                      float value) {
  JoinNotice notice{.count = full({1}, value, TensorOptions().dtype(kFloat32).device(device))};
  absl::StatusOr<std::shared_ptr<distributed::Work>> work =
      group.allreduce(notice.count, {.op = distributed::ReduceOp::kSum});
  if (!work.ok()) return work.status();
  notice.work = *std::move(work);
  return notice;
}

absl::StatusOr<float> WaitCount(const JoinNotice& notice) {
  if (absl::Status waited = notice.work->wait(); !waited.ok()) return waited;
  return notice.count.cpu().item<float>();
}

}  // namespace

Join::Join(std::vector<std::shared_ptr<Joinable>> joinables, JoinOptions options,
           std::shared_ptr<distributed::ProcessGroup> group, Device device)
    : joinables_(std::move(joinables)),
      options_(options),
      group_(std::move(group)),
      device_(device) {}

absl::StatusOr<std::unique_ptr<Join>> Join::create(
    const std::vector<std::shared_ptr<Joinable>>& joinables, JoinOptions options) {
  if (joinables.empty()) {
    return absl::InvalidArgumentError(
        "Join: the join context manager requires at least one joinable");
  }
  for (size_t i = 0; i < joinables.size(); ++i) {
    if (joinables[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Join: joinable ", i, " is null"));
    }
  }
  std::shared_ptr<distributed::ProcessGroup> group = joinables.front()->join_process_group();
  for (size_t i = 1; i < joinables.size(); ++i) {
    if (joinables[i]->join_process_group() != group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Join: using the join context manager with multiple process groups: joinable ", i,
          " uses another group than joinable 0; give every joinable of one Join the same "
          "process group"));
    }
  }
  if (group == nullptr) {
    return absl::InvalidArgumentError("Join: joinable 0 has no process group");
  }
  std::unique_ptr<Join> join(new Join(joinables, options, group, joinables.front()->join_device()));
  for (const std::shared_ptr<Joinable>& joinable : joinables) {
    join->hooks_.push_back(joinable->join_hook(options));
  }
  bool first = true;
  for (const std::shared_ptr<Joinable>& joinable : joinables) {
    joinable->join_config_ = {.enable = options.enable,
                              .throw_on_early_termination = options.throw_on_early_termination,
                              .is_first_joinable = first};
    first = false;
  }
  return join;
}

Join::~Join() {
  for (const std::shared_ptr<Joinable>& joinable : joinables_) joinable->join_config_ = {};
}

absl::StatusOr<float> Join::AllReduceCount(float value) {
  absl::StatusOr<JoinNotice> notice = IssueCount(*group_, device_, value);
  if (!notice.ok()) return notice.status();
  return WaitCount(*notice);
}

absl::Status Join::join() {
  if (joined_) {
    return absl::FailedPreconditionError("Join: join() was already called on this Join");
  }
  joined_ = true;
  if (!options_.enable) return absl::OkStatus();
  bool is_last_joiner = true;
  for (int shadowed = 0;; ++shadowed) {
    if (shadowed == kUnevenWarnThreshold + 1) {
      internal::Warn(absl::StrCat(
          "Detected uneven input skew of greater than ", kUnevenWarnThreshold,
          ". This means that rank ", group_->rank(), " has at least ", kUnevenWarnThreshold,
          " fewer inputs than other currently-active ranks. This level of skew could lead to "
          "performance degradation during training."));
    }
    // Meets the training ranks' notify_join_context (Note [Join]).
    absl::StatusOr<float> training = AllReduceCount(0);
    if (!training.ok()) return Annotate(training.status(), "counting the ranks still training");
    if (*training == 0) break;
    if (options_.throw_on_early_termination) {
      absl::StatusOr<float> told = AllReduceCount(1);
      if (!told.ok()) {
        return Annotate(told.status(), "telling the ranks still training to stop");
      }
      return absl::OutOfRangeError(absl::StrCat("Rank ", group_->rank(), " exhausted all inputs."));
    }
    for (size_t i = 0; i < hooks_.size(); ++i) {
      if (absl::Status shadow = hooks_[i]->main_hook(); !shadow.ok()) {
        return Annotate(shadow, absl::StrCat("the main hook of joinable ", i));
      }
    }
    is_last_joiner = false;
  }
  for (size_t i = 0; i < hooks_.size(); ++i) {
    if (absl::Status post = hooks_[i]->post_hook(is_last_joiner); !post.ok()) {
      return Annotate(post, absl::StrCat("the post hook of joinable ", i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JoinNotice> Join::notify_join_context(const Joinable& joinable) {
  const JoinConfig& config = joinable.join_config();
  if (!config.is_first_joinable || !config.enable) return JoinNotice{};
  std::shared_ptr<distributed::ProcessGroup> group = joinable.join_process_group();
  absl::StatusOr<JoinNotice> notice = IssueCount(*group, joinable.join_device(), 1);
  if (!notice.ok()) return Annotate(notice.status(), "notifying the join context");
  if (config.throw_on_early_termination) {
    absl::StatusOr<JoinNotice> check = IssueCount(*group, joinable.join_device(), 0);
    if (!check.ok()) return Annotate(check.status(), "checking for joined ranks");
    absl::StatusOr<float> joined = WaitCount(*check);
    if (!joined.ok()) return Annotate(joined.status(), "checking for joined ranks");
    if (*joined != 0) {
      return absl::OutOfRangeError(
          "Detected at least one rank that exhausted inputs. Throwing across all ranks.");
    }
  }
  return notice;
}

}  // namespace ember::parallel
