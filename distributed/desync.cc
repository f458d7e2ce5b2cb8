#include "distributed/desync.h"

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ember::distributed {

// Note [Desync reports]
// A rank that times out in collective #n knows only that some peer did not
// answer; PyTorch's desync debug asks the store where each rank is. Here
// each group's publishing thread writes "<last entered> <last completed>
// <op of the last entered>" under <group prefix>ember_progress/<rank>
// whenever it changed, at most every EMBER_DESYNC_PUBLISH_MS (100 ms): the
// op path pays nothing (the recorder's progress counters are atomics read by
// that thread), and a rank that stalls in its own code, is stopped or is on
// another host has still published where it got to. When an op of the
// group fails with kDeadlineExceeded, or with a peer's failure whose message
// says "timed out" (a backend that passes a peer's timeout on keeps its
// text), the layer above the backends (Work::Finish) publishes its own
// progress, reads the others' and appends the report to the error, for
// every backend constructed with a store (tcp, gloo; mpi when given one).

namespace {

absl::Duration PeriodFromEnv() {
  const char* v = std::getenv("EMBER_DESYNC_PUBLISH_MS");
  int ms = 100;
  if (v != nullptr && (!absl::SimpleAtoi(v, &ms) || ms < 0)) ms = 100;
  return absl::Milliseconds(ms);
}

}  // namespace

ProgressPublisher::ProgressPublisher(std::shared_ptr<Store> store, std::string prefix,
                                     std::shared_ptr<FlightRecorder> recorder)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      recorder_(std::move(recorder)),
      period_(PeriodFromEnv()) {
  if (period_ > absl::ZeroDuration() && recorder_->enabled()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

ProgressPublisher::~ProgressPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::string ProgressPublisher::Key(int rank) const {
  return absl::StrCat(prefix_, "ember_progress/", rank);
}

void ProgressPublisher::Publish() {
  const std::string value =
      absl::StrCat(recorder_->last_enqueued(), " ", recorder_->last_completed(), " ",
                   recorder_->last_enqueued_op());
  if (value == published_) return;
  if (store_->set(Key(recorder_->rank()), value).ok()) published_ = value;
}

void ProgressPublisher::Loop() {
  absl::MutexLock lock(&mu_);
  auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop), period_)) Publish();
}

std::string ProgressPublisher::Report(int64_t seq) {
  {
    absl::MutexLock lock(&mu_);
    Publish();
  }
  std::vector<std::string> behind, silent;
  for (int p = 0; p < recorder_->size(); ++p) {
    if (p == recorder_->rank()) continue;
    absl::StatusOr<std::string> got = store_->get(Key(p), absl::Milliseconds(100));
    if (!got.ok()) {
      silent.push_back(absl::StrCat(p));
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(*got, ' ');
    int64_t entered = -1, completed = -1;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &entered) ||
        !absl::SimpleAtoi(f[1], &completed)) {
      continue;
    }
    if (entered >= seq) continue;
    behind.push_back(
        entered < 0 ? absl::StrCat("rank ", p, " has entered no collective of this group")
                    : absl::StrCat("rank ", p, " is behind: its last collective is #", entered,
                                   " ", f[2], " (completed #", completed, ")"));
  }
  std::vector<std::string> parts = behind;
  if (!silent.empty()) {
    parts.push_back(absl::StrCat(silent.size() == 1 ? "rank " : "ranks ",
                                 absl::StrJoin(silent, ", "), " published no progress"));
  }
  if (parts.empty()) {
    return absl::StrCat("desync report: every rank has entered collective #", seq);
  }
  return absl::StrCat("desync report: ", absl::StrJoin(parts, "; "));
}

}  // namespace ember::distributed
