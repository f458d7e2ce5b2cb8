// OpQueue (op_queue.h): order, the hooks, taking what is queued, stopping.
#include "distributed/op_queue.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::shared_ptr<Work> NewWork() {
  return std::make_shared<Work>(OpType::kBarrier, absl::Now() + absl::Seconds(30));
}

OpQueue::Op MakeOp(std::shared_ptr<Work> work, std::string what,
                   std::function<absl::Status()> run) {
  return {.work = std::move(work), .what = std::move(what), .run = std::move(run)};
}

// Records what ran, in order, and on which thread.
struct Log {
  absl::Mutex mu;
  std::vector<int> ran ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> threads ABSL_GUARDED_BY(mu);
  std::atomic<int> inside{0};
  std::atomic<int> most_inside{0};

  std::function<absl::Status()> Run(int i) {
    return [this, i] {
      const int now = ++inside;
      int most = most_inside.load();
      while (now > most && !most_inside.compare_exchange_weak(most, now)) {
      }
      absl::SleepFor(absl::Microseconds(200));
      {
        absl::MutexLock lock(&mu);
        ran.push_back(i);
        threads.push_back(std::this_thread::get_id());
      }
      --inside;
      return absl::OkStatus();
    };
  }
};

TEST(OpQueueTest, RunsOpsOneAtATimeInQueueOrderOnOneWorker) {
  Log log;
  std::vector<std::shared_ptr<Work>> works;
  {
    OpQueue queue;
    for (int i = 0; i < 20; ++i) {
      works.push_back(NewWork());
      queue.Push(MakeOp(works.back(), absl::StrCat("op ", i), log.Run(i)));
    }
    for (auto& w : works) EXPECT_TRUE(w->wait().ok());
  }
  absl::MutexLock lock(&log.mu);
  std::vector<int> expected;
  for (int i = 0; i < 20; ++i) expected.push_back(i);
  EXPECT_EQ(log.ran, expected);
  EXPECT_EQ(log.most_inside.load(), 1);
  for (const std::thread::id& id : log.threads) {
    EXPECT_EQ(id, log.threads[0]);
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

TEST(OpQueueTest, TheRunsStatusFinishesTheWorkAndAnEarlierFinishWins) {
  OpQueue queue;
  auto failed = NewWork();
  queue.Push(MakeOp(failed, "a", [] { return absl::UnavailableError("peer lost"); }));
  EXPECT_EQ(failed->wait().code(), absl::StatusCode::kUnavailable);

  // A Work failed before its op ran (as abort() does) keeps that status.
  absl::Notification release;
  auto blocker = NewWork();
  queue.Push(MakeOp(blocker, "blocker", [&] {
    release.WaitForNotification();
    return absl::OkStatus();
  }));
  auto aborted = NewWork();
  queue.Push(MakeOp(aborted, "b", [] { return absl::OkStatus(); }));
  aborted->Finish(absl::AbortedError("the process group was aborted"));
  release.Notify();
  EXPECT_TRUE(blocker->wait().ok());
  EXPECT_EQ(aborted->wait().code(), absl::StatusCode::kAborted);
}

TEST(OpQueueTest, AdmitRefusesAnOpWithoutRunningIt) {
  std::atomic<int> runs{0};
  OpQueue queue({.admit = [](const OpQueue::Op& op) -> absl::Status {
    if (op.deadline > absl::Now()) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat(op.what, ": too late"));
  }});
  auto late = NewWork();
  OpQueue::Op op = MakeOp(late, "late op", [&] {
    ++runs;
    return absl::OkStatus();
  });
  op.deadline = absl::Now() - absl::Seconds(1);
  queue.Push(std::move(op));
  absl::Status s = late->wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "late op: too late");

  auto on_time = NewWork();
  queue.Push(MakeOp(on_time, "on time", [&] {
    ++runs;
    return absl::OkStatus();
  }));
  EXPECT_TRUE(on_time->wait().ok());
  EXPECT_EQ(runs.load(), 1);
}

TEST(OpQueueTest, RunningNamesTheOpInProgressAndTakeQueuedHandsBackTheRest) {
  OpQueue queue;
  absl::Notification started, release;
  auto first = NewWork();
  queue.Push(MakeOp(first, "first", [&] {
    started.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  }));
  std::atomic<int> later_runs{0};
  for (int i = 0; i < 3; ++i) {
    queue.Push(MakeOp(NewWork(), absl::StrCat("queued ", i), [&] {
      ++later_runs;
      return absl::OkStatus();
    }));
  }
  started.WaitForNotification();
  OpQueue::Running running = queue.running();
  EXPECT_EQ(running.work, first);
  EXPECT_EQ(running.what, "first");

  std::vector<std::string> taken;
  for (OpQueue::Op& op : queue.TakeQueued()) {
    taken.push_back(op.what);
    EXPECT_FALSE(op.work->is_completed());
  }
  EXPECT_THAT(taken, ElementsAre("queued 0", "queued 1", "queued 2"));
  EXPECT_THAT(queue.TakeQueued(), IsEmpty());
  release.Notify();
  EXPECT_TRUE(first->wait().ok());
  queue.Join();
  EXPECT_EQ(later_runs.load(), 0);
  EXPECT_EQ(queue.running().work, nullptr);
}

TEST(OpQueueTest, StopRunsWhatIsStillQueuedBeforeTheWorkerLeaves) {
  OpQueue queue;
  absl::Notification release;
  queue.Push(MakeOp(NewWork(), "blocker", [&] {
    release.WaitForNotification();
    return absl::OkStatus();
  }));
  auto queued = NewWork();
  queue.Push(MakeOp(queued, "queued", [] { return absl::OkStatus(); }));
  queue.Stop();
  EXPECT_FALSE(queue.WaitUntilStopped(absl::Now() + absl::Milliseconds(50)));
  release.Notify();
  EXPECT_TRUE(queue.WaitUntilStopped(absl::Now() + absl::Seconds(30)));
  EXPECT_TRUE(queued->is_completed());
  EXPECT_TRUE(queued->status().ok());
  queue.Join();
  queue.Join();  // idempotent
}

TEST(OpQueueTest, PollRunsAfterEachOpOnWakeAndAtTheIntervalItAsks) {
  absl::Mutex mu;
  std::vector<bool> polls;  // `woken` of each call
  std::atomic<int> idle_polls_left{0};
  OpQueue queue({.poll = [&](bool woken) {
    {
      absl::MutexLock lock(&mu);
      polls.push_back(woken);
    }
    // Asks to be called again soon while it has idle polls left.
    return idle_polls_left.fetch_sub(1) > 0 ? absl::Milliseconds(1) : absl::InfiniteDuration();
  }});
  auto op = NewWork();
  queue.Push(MakeOp(op, "op", [] { return absl::OkStatus(); }));
  ASSERT_TRUE(op->wait().ok());
  auto polled = [&](size_t n) { return [&polls, n] { return polls.size() >= n; }; };
  {
    absl::MutexLock lock(&mu);
    auto one = polled(1);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(30)));
    EXPECT_FALSE(polls[0]);  // after the op, not woken
  }
  // Idle: no poll until Wake(), then polls at the asked interval, then none.
  absl::SleepFor(absl::Milliseconds(20));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(polls.size(), 1u);
  }
  idle_polls_left = 3;
  queue.Wake();
  {
    absl::MutexLock lock(&mu);
    auto five = polled(5);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&five), absl::Seconds(30)));
    EXPECT_TRUE(polls[1]);                           // the wake
    EXPECT_FALSE(polls[2] || polls[3] || polls[4]);  // the interval
  }
  absl::SleepFor(absl::Milliseconds(20));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(polls.size(), 5u);
}

}  // namespace
}  // namespace ember::distributed
