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
// The thread publishes outside the publisher's lock and holds its state
// itself, so a publisher destroyed while a publish waits on a store whose
// server already exited (the rank serving it finished first) does not wait
// out the store's timeout: it leaves the thread to end on its own.

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
    : shared_(std::make_shared<Shared>()) {
  shared_->store = std::move(store);
  shared_->prefix = std::move(prefix);
  shared_->recorder = std::move(recorder);
  shared_->period = PeriodFromEnv();
  if (shared_->period > absl::ZeroDuration() && shared_->recorder->enabled()) {
    thread_ = std::thread([shared = shared_] { shared->Loop(); });
  } else {
    shared_->finished.Notify();
  }
}

ProgressPublisher::~ProgressPublisher() {
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->stopping = true;
  }
  if (!thread_.joinable()) return;
  // A publish blocked on a store whose server is gone (its rank exited
  // first) would hold up the process's exit for the store's timeout: let
  // the thread finish on its own, with the state it holds.
  if (shared_->finished.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

std::string ProgressPublisher::Shared::Key(int rank) const {
  return absl::StrCat(prefix, "ember_progress/", rank);
}

void ProgressPublisher::Shared::Publish() {
  absl::MutexLock lock(&publish_mu);
  const std::string value =
      absl::StrCat(recorder->last_enqueued(), " ", recorder->last_completed(), " ",
                   recorder->last_enqueued_op());
  if (value == published) return;
  if (store->set(Key(recorder->rank()), value).ok()) published = value;
}

void ProgressPublisher::Shared::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stopping; };
      if (mu.AwaitWithTimeout(absl::Condition(&stop), period)) break;
    }
    Publish();  // outside `mu`: the destructor never waits for a store call
  }
  finished.Notify();
}

std::string ProgressPublisher::Report(int64_t seq) {
  shared_->Publish();
  std::vector<std::string> behind, silent;
  for (int p = 0; p < shared_->recorder->size(); ++p) {
    if (p == shared_->recorder->rank()) continue;
    absl::StatusOr<std::string> got = shared_->store->get(shared_->Key(p), absl::Milliseconds(100));
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
