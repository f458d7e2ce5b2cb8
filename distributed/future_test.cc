// Future (distributed/future.h): completion, chained steps and their
// errors, timeouts, and futures of real collectives over the tcp backend
// (Work::get_future), including a chain of collectives advanced by done().
#include "distributed/future.h"

#include <atomic>
#include <thread>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::vector<Tensor>> Doubled(const Future& f) {
  return std::vector<Tensor>{f.value().at(0).mul(2)};
}

TEST(FutureTest, AStepRunsAtTheFirstWaitAndOnlyOnce) {
  std::atomic<int> runs = 0;
  auto f = Future::Completed({full({2}, 3.0)});
  auto g = f->then([&](const Future& p) -> absl::StatusOr<std::vector<Tensor>> {
    ++runs;
    return std::vector<Tensor>{p.value()[0].add(1)};
  });
  EXPECT_EQ(runs.load(), 0);
  EXPECT_FALSE(g->done());  // done() runs no step
  EXPECT_EQ(runs.load(), 0);
  ASSERT_TRUE(g->wait().ok());
  EXPECT_TRUE(g->done());
  ASSERT_TRUE(g->wait().ok());
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(g->value()[0][1].item<float>(), 4.0f);
}

TEST(FutureTest, AFailedStepFailsEveryFutureAfterItAndSkipsTheirSteps) {
  bool later_ran = false;
  auto f = Future::Completed({full({1}, 1.0)});
  auto failed = f->then([](const Future&) -> absl::StatusOr<std::vector<Tensor>> {
    return absl::InvalidArgumentError("bad bucket");
  });
  auto after = failed->then([&](const Future& p) {
    later_ran = true;
    return Doubled(p);
  });
  EXPECT_THAT(after->wait().message(), HasSubstr("bad bucket"));
  EXPECT_EQ(after->wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(later_ran);
  EXPECT_TRUE(after->value().empty());
}

TEST(FutureTest, AStepThatThrowsFailsItsFutureWithTheMessage) {
  auto f = Future::Completed({full({1}, 1.0)});
  auto g = f->then([](const Future&) -> absl::StatusOr<std::vector<Tensor>> {
    EMBER_FAIL("the hook failed on purpose");
  });
  EXPECT_THAT(g->wait().message(), HasSubstr("the hook failed on purpose"));
}

TEST(FutureTest, WaitTimesOutOnAnOpThatDoesNotFinishAndKeepsIt) {
  std::atomic<bool> finished = false;
  auto f = Future::FromOp(
      [&](absl::Duration timeout) {
        const absl::Time until = absl::Now() + timeout;
        while (!finished && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
        return finished ? absl::OkStatus() : absl::DeadlineExceededError("still running");
      },
      [&] { return finished.load(); }, [] { return std::vector<Tensor>{full({1}, 5.0)}; });
  auto g = f->then(Doubled);
  EXPECT_FALSE(f->done());
  EXPECT_EQ(g->wait(absl::Milliseconds(30)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(g->done());
  finished = true;
  ASSERT_TRUE(g->wait(absl::Seconds(5)).ok());
  EXPECT_EQ(g->value()[0].item<float>(), 10.0f);
}

TEST(FutureTest, ThenAsyncCompletesWithTheInnerFuture) {
  auto inner = Future::Completed({full({1}, 7.0)});
  auto f = Future::Completed({full({1}, 1.0)});
  auto g = f->then_async([&](const Future&) -> absl::StatusOr<std::shared_ptr<Future>> {
    return inner->then(Doubled);
  });
  ASSERT_TRUE(g->wait().ok());
  EXPECT_EQ(g->value()[0].item<float>(), 14.0f);
  auto null = f->then_async([](const Future&) -> absl::StatusOr<std::shared_ptr<Future>> {
    return std::shared_ptr<Future>();
  });
  EXPECT_THAT(null->wait().message(), HasSubstr("null future"));
}

TEST(FutureTest, FailedNeedsAnError) {
  EXPECT_FALSE(Future::Failed(absl::OkStatus())->wait().ok());
  EXPECT_EQ(Future::Failed(absl::UnavailableError("x"))->wait().code(),
            absl::StatusCode::kUnavailable);
}

// Three ranks: all_reduce, then (in a step) a second all_reduce of the
// result, its future returned by then_async. The second collective is
// issued by wait(), whenever the first finished on each rank, so a third
// collective issued between them by the program keeps its place on every
// rank.
TEST(FutureTest, AChainOfCollectivesIssuesItsNextOneAtTheWait) {
  absl::Status s = testing::RunRanks(3, [](testing::Rank& me) -> absl::Status {
    Tensor t = full({4}, static_cast<double>(me.rank + 1));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, me.group->allreduce(t));
    std::shared_ptr<Future> first = work->get_future();
    ProcessGroup* group = me.group.get();
    std::shared_ptr<Future> second =
        first->then_async([group](const Future& f) -> absl::StatusOr<std::shared_ptr<Future>> {
          Tensor again = f.value()[0].mul(10);
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> w, group->allreduce(again));
          return w->get_future();
        });
    // Rank 0 lets the first all_reduce finish before going on; the others
    // do not. The collective below is the second on every rank.
    if (me.rank == 0) {
      EMBER_RETURN_IF_ERROR(first->wait(absl::Seconds(20)));
      EXPECT_FALSE(second->done());
    }
    Tensor between = full({2}, 1.0);
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> other, me.group->allreduce(between));
    EMBER_RETURN_IF_ERROR(other->wait());
    EMBER_RETURN_IF_ERROR(second->wait(absl::Seconds(20)));
    EXPECT_TRUE(second->done());
    // (1 + 2 + 3) * 10, summed over 3 ranks.
    const float got = second->value().at(0)[3].item<float>();
    if (got != 180.0f) return absl::InternalError(absl::StrCat("got ", got, ", expected 180"));
    if (between[0].item<float>() != 3.0f) return absl::InternalError("the middle all_reduce");
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A collective whose peer never joins: the future fails with the op's
// timeout error instead of hanging.
TEST(FutureTest, AFutureOfACollectiveThatTimesOutFails) {
  std::vector<absl::Status> results = testing::RunRanksEach(
      2,
      [](testing::Rank& me) -> absl::Status {
        if (me.rank == 1) return absl::OkStatus();
        Tensor t = full({4}, 1.0);
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, me.group->allreduce(t));
        return work->get_future()->then(Doubled)->wait();
      },
      {.timeout = absl::Milliseconds(500)});
  EXPECT_FALSE(results[0].ok());
  EXPECT_TRUE(results[1].ok());
}

}  // namespace
}  // namespace ember::distributed
