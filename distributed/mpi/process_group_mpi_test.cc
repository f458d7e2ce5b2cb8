// The mpi backend. Run by Bazel, this binary starts itself again under
// mpirun (mpirun.h) and checks that the job passed; inside the job (one rank
// per process) it runs the shared backend suite at every world size up to
// the job's (sub-groups of the first ranks) and the mpi backend's own cases.
#include "distributed/mpi/process_group_mpi.h"

#include <mpi.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/backend_registry.h"
#include "distributed/distributed.h"
#include "distributed/mpi/mpirun.h"
#include "distributed/testing/process_group_suite.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/testing.h"

namespace ember::distributed::mpi {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::launched_job;
using ::ember::distributed::testing::ProcessGroupSuite;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::distributed::testing::SuiteParam;
using ::ember::testing::Values;
using ::testing::HasSubstr;

// The suite at world sizes 1 up to the job's size (none outside a job).
std::vector<SuiteParam> JobWorldSizes() {
  std::vector<SuiteParam> params;
  const auto job = launched_job();
  for (int world = 1; job && world <= job->world_size; ++world) {
    params.push_back({.backend = "mpi", .world_size = world, .avg = false});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Mpi, ProcessGroupSuite, ::testing::ValuesIn(JobWorldSizes()),
                         testing::SuiteParamName);

RunRanksOptions MpiRanks() {
  RunRanksOptions options;
  options.backend = "mpi";
  return options;
}

// --- Outside the job: registration, and the jobs ------------------------------

TEST(MpiBackendTest, IsRegisteredWithEveryOpOnCpuOnly) {
  absl::StatusOr<const BackendInfo*> info = find_backend("MPI");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE((*info)->world_from_launcher != nullptr);
  for (int i = 0; i < kNumOpTypes; ++i) {
    const OpType op = static_cast<OpType>(i);
    EXPECT_TRUE((*info)->support.supports(op, DeviceType::kCPU)) << op_type_name(op);
    EXPECT_FALSE((*info)->support.supports(op, DeviceType::kCUDA)) << op_type_name(op);
  }
}

void ExpectJobPasses(int ranks, const std::string& filter, const MpirunOptions& options = {}) {
  if (launched_job()) GTEST_SKIP() << "already inside an mpirun job";
  MpirunResult job = RunThisTestUnderMpirun(ranks, filter, options);
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_FALSE(job.timed_out) << job.output;
  // Every rank ran the tests (gtest prints one summary per process).
  EXPECT_THAT(job.output, HasSubstr("[  PASSED  ]")) << job.output;
}

TEST(MpiJobs, SuiteAndBackendCasesAtThreeRanks) { ExpectJobPasses(3, "Mpi/*:MpiJobTest.*"); }

TEST(MpiJobs, SuiteAndBackendCasesAtTwoRanks) { ExpectJobPasses(2, "Mpi/*:MpiJobTest.*"); }

TEST(MpiJobs, ThreadLevelBelowSerializedIsRefused) {
  ExpectJobPasses(1, "MpiThreadLevel.*", {.start_mpi = false});
}

// --- Inside the job ------------------------------------------------------------------

class MpiJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!launched_job()) GTEST_SKIP() << "runs inside the mpirun job (MpiJobs.*)";
    rank_ = launched_job()->rank;
    world_ = launched_job()->world_size;
  }
  int rank_ = 0;
  int world_ = 1;
};

TEST_F(MpiJobTest, InitProcessGroupTakesRankAndSizeFromMpi) {
  // No init_method, rank, world_size or MASTER_ADDR: mpirun placed us.
  unsetenv("MASTER_ADDR");
  ASSERT_TRUE(init_process_group({.backend = "mpi"}).ok());
  EXPECT_EQ(get_rank(), rank_);
  EXPECT_EQ(get_world_size(), world_);
  Tensor t = full({5}, rank_ + 1, kInt64);
  ASSERT_TRUE(all_reduce(t).ok());
  EXPECT_EQ(Values(t), std::vector<double>(5, world_ * (world_ + 1) / 2));

  // A sub-group of the last two ranks (or the only one): a sub-communicator
  // that only its members create.
  std::vector<int> members = {world_ - 1};
  if (world_ > 1) members.insert(members.begin(), world_ - 2);
  absl::StatusOr<Group> pair = new_group(members);
  ASSERT_TRUE(pair.ok()) << pair.status();
  Tensor x = full({3}, 10 * (rank_ + 1), kFloat32);
  absl::Status s = all_reduce(x, ReduceOp::kMax, *pair);
  if (rank_ >= world_ - 2) {
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(Values(x), std::vector<double>(3, 10 * world_));
    EXPECT_EQ(get_rank(*pair), rank_ - (world_ - static_cast<int>(members.size())));
    // Global ranks in the free functions, as in torch.
    ASSERT_TRUE(broadcast(x, /*src=*/world_ - 1, *pair).ok());
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("is not a member of this group"));
  }

  // Another backend has no store to meet through here.
  absl::StatusOr<Group> tcp = new_group({}, {.backend = "tcp"});
  EXPECT_EQ(tcp.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tcp.status().message()), HasSubstr("pass InitOptions.store"));
  ASSERT_TRUE(barrier().ok());
  ASSERT_TRUE(destroy_process_group().ok());
}

// Note [MPI monitored barriers]: the last rank comes late to the second
// barrier, so rank 0 names it and releases nobody; the late rank's own wait
// then fails, and the third barrier pairs up again (its stale message is not
// taken for the next barrier's).
TEST_F(MpiJobTest, MonitoredBarrierNamesTheRankThatCameLate) {
  ASSERT_TRUE(init_process_group({.backend = "mpi"}).ok());
  ASSERT_TRUE(monitored_barrier(nullptr, absl::Seconds(20)).ok());
  const int late = world_ - 1;
  if (world_ > 1) {
    if (rank_ == late) {
      absl::SleepFor(absl::Seconds(1));
      absl::Status s = monitored_barrier(nullptr, absl::Milliseconds(300));
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("did not release this rank")) << s;
    } else {
      absl::Status s = monitored_barrier(nullptr, absl::Milliseconds(300), /*wait_all_ranks=*/true);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      if (rank_ == 0) {
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr(absl::StrCat("monitored_barrier: rank ", late,
                                           " failed to pass monitoredBarrier in 300 ms")));
      }
    }
  }
  absl::Status again = monitored_barrier(nullptr, absl::Seconds(20));
  EXPECT_TRUE(again.ok()) << again;
  ASSERT_TRUE(destroy_process_group().ok());
}

TEST_F(MpiJobTest, RankOrWorldSizeThatDisagreeWithMpiAreErrorsNamingBoth) {
  absl::Status s = init_process_group({.backend = "mpi", .world_size = world_ + 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("world_size=", world_ + 1,
                                     " was given, but MPI_COMM_WORLD has ", world_, " processes")));
  s = init_process_group({.backend = "mpi", .rank = (rank_ + 1) % (world_ + 1)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr(absl::StrCat("rank=", (rank_ + 1) % (world_ + 1),
                             " was given, but MPI_COMM_WORLD has this process as rank ", rank_)));
  EXPECT_FALSE(is_initialized());
  // The same rank and size as MPI's are fine.
  ASSERT_TRUE(init_process_group({.backend = "mpi", .world_size = world_, .rank = rank_}).ok());
  ASSERT_TRUE(destroy_process_group().ok());
}

TEST_F(MpiJobTest, WaitReturnsDeadlineExceededAndTheCollectiveStillCompletes) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        Tensor t = full({4}, me.rank + 1, kFloat32);
        if (me.rank == 1) {
          absl::SleepFor(absl::Milliseconds(800));  // joins late
          EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
        } else {
          EMBER_ASSIGN_OR_RETURN(auto work, me.group->allreduce(t));
          const absl::Time start = absl::Now();
          absl::Status early = work->wait(absl::Milliseconds(100));
          EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
          EXPECT_LT(absl::Now() - start, absl::Milliseconds(600));
          EMBER_RETURN_IF_ERROR(work->wait());  // finishes once rank 1 joins
        }
        EXPECT_EQ(Values(t), std::vector<double>(4, 3));
        // An op whose own timeout passes fails, names the op and why it goes on,
        // and still runs, so the next collective pairs correctly.
        Tensor u = full({4}, me.rank + 1, kFloat32);
        if (me.rank == 1) absl::SleepFor(absl::Milliseconds(800));
        EMBER_ASSIGN_OR_RETURN(auto late,
                               me.group->allreduce(u, {.timeout = absl::Milliseconds(200)}));
        absl::Status timed_out = late->wait();
        if (me.rank == 0) {
          EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
          EXPECT_THAT(std::string(timed_out.message()),
                      HasSubstr("all_reduce (collective #1): did not finish within its timeout"));
          EXPECT_THAT(std::string(timed_out.message()),
                      HasSubstr("MPI can neither time out nor cancel a collective"));
        }
        Tensor v = full({2}, 5 * (me.rank + 1), kInt32);
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(v)));
        EXPECT_EQ(Values(v), std::vector<double>(2, 15));
        EXPECT_EQ(Values(u), std::vector<double>(4, 3));
        return absl::OkStatus();
      },
      MpiRanks());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(MpiJobTest, ReceiveTimesOutIsCancelledAndLeavesTheNextMessage) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        if (me.rank == 0) {
          Tensor t = zeros({3}, kInt64);
          EMBER_ASSIGN_OR_RETURN(
              auto work, me.group->recv(t, 1, {.tag = 4, .timeout = absl::Milliseconds(200)}));
          absl::Status s = work->wait();
          EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
          EXPECT_THAT(std::string(s.message()),
                      HasSubstr("recv from rank 1 (MPI_COMM_WORLD rank 1) (tag 4): no message"));
        }
        EMBER_RETURN_IF_ERROR(Finish(me.group->barrier()));
        if (me.rank == 1) return Finish(me.group->send(full({3}, 7, kInt64), 0, {.tag = 4}));
        Tensor t = zeros({3}, kInt64);
        EMBER_ASSIGN_OR_RETURN(auto work, me.group->recv(t, kAnySource, {.tag = 4}));
        EMBER_RETURN_IF_ERROR(work->wait());
        EXPECT_EQ(Values(t), std::vector<double>(3, 7));
        EXPECT_EQ(work->source(), 1);
        return absl::OkStatus();
      },
      MpiRanks());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(MpiJobTest, MismatchedSendAndReceiveSizesAreErrorsNamingTheOp) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        if (me.rank == 1) {
          EMBER_RETURN_IF_ERROR(Finish(me.group->send(ones({8}, kFloat32), 0, {.tag = 1})));
          return Finish(me.group->send(ones({2}, kFloat32), 0, {.tag = 2}));
        }
        Tensor small = zeros({4}, kFloat32);
        absl::Status longer = Finish(me.group->recv(small, 1, {.tag = 1}));
        EXPECT_EQ(longer.code(), absl::StatusCode::kFailedPrecondition) << longer;
        EXPECT_THAT(std::string(longer.message()), HasSubstr("recv from rank 1"));
        EXPECT_THAT(std::string(longer.message()), HasSubstr("MPI_Irecv failed"));
        absl::Status shorter = Finish(me.group->recv(small, 1, {.tag = 2}));
        EXPECT_EQ(shorter.code(), absl::StatusCode::kFailedPrecondition) << shorter;
        EXPECT_THAT(std::string(shorter.message()),
                    HasSubstr("sent 2 elements but this receive's tensor holds 4"));
        return absl::OkStatus();
      },
      MpiRanks());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(MpiJobTest, RefusesWhatMpiCannotDo) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        Tensor t = ones({4}, kFloat32);
        absl::Status avg = Finish(me.group->allreduce(t, {.op = ReduceOp::kAvg}));
        EXPECT_EQ(avg.code(), absl::StatusCode::kUnimplemented) << avg;
        EXPECT_THAT(std::string(avg.message()), HasSubstr("use SUM and divide"));
        absl::Status tag = Finish(me.group->send(t, 1 - me.rank, {.tag = -1}));
        EXPECT_EQ(tag.code(), absl::StatusCode::kInvalidArgument) << tag;
        EXPECT_THAT(std::string(tag.message()),
                    HasSubstr("tag -1 is outside the tags MPI carries"));
        return absl::OkStatus();
      },
      MpiRanks());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(MpiJobTest, AbortFailsPendingOpsAtOnceAndTheGroupCanBeDestroyed) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        if (me.rank == 1) return absl::OkStatus();  // never sends
        Tensor t = zeros({4}, kFloat32);
        EMBER_ASSIGN_OR_RETURN(auto recv, me.group->recv(t, 1, {.tag = 9}));
        me.group->abort();
        const absl::Time start = absl::Now();
        absl::Status r = recv->wait();
        EXPECT_LT(absl::Now() - start, absl::Seconds(1));
        EXPECT_EQ(r.code(), absl::StatusCode::kAborted) << r;
        absl::Status later = Finish(me.group->allreduce(t));
        EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
        return absl::OkStatus();  // the group is destroyed cleanly (no MPI_Abort)
      },
      MpiRanks());
  EXPECT_TRUE(s.ok()) << s;
}

// Note [Failing cleanly] on mpi, as far as a job can go on: shrink_group is
// refused (Open MPI ends the whole job when a rank dies, so no survivors
// could use it), and destroy_process_group fails a receive still posted with
// kAborted and returns. (A collective still inside MPI cannot be pulled out:
// destroying its group ends the job with MPI_Abort, Note [MPI timeouts].)
TEST_F(MpiJobTest, ShrinkGroupIsRefusedAndDestroyFailsAPostedReceive) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  ASSERT_TRUE(init_process_group({.backend = "mpi"}).ok());
  absl::StatusOr<Group> shrunk = shrink_group({world_ - 1});
  if (rank_ == world_ - 1) {
    EXPECT_EQ(shrunk.status().code(), absl::StatusCode::kFailedPrecondition) << shrunk.status();
  } else {
    EXPECT_EQ(shrunk.status().code(), absl::StatusCode::kUnimplemented) << shrunk.status();
    EXPECT_THAT(std::string(shrunk.status().message()),
                HasSubstr("the 'mpi' backend does not support shrinking"));
  }
  ASSERT_TRUE(barrier().ok());
  Tensor t = zeros({4}, kFloat32);
  absl::StatusOr<std::shared_ptr<RecvWork>> recv = irecv(t, (rank_ + 1) % world_, nullptr, 77);
  ASSERT_TRUE(recv.ok()) << recv.status();  // nobody sends with tag 77
  ASSERT_TRUE(destroy_process_group().ok());
  absl::Status r = (*recv)->wait();
  EXPECT_EQ(r.code(), absl::StatusCode::kAborted) << r;
  EXPECT_THAT(std::string(r.message()), HasSubstr("destroyed"));
}

// In a job of its own: the program starts MPI with too low a thread level.
TEST(MpiThreadLevel, BelowSerializedIsRefusedNamingBothLevels) {
  if (!launched_job()) GTEST_SKIP() << "runs inside the mpirun job (MpiJobs.*)";
  int provided = 0;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), MPI_SUCCESS);
  ASSERT_EQ(provided, MPI_THREAD_FUNNELED);
  absl::Status s = init_process_group({.backend = "mpi"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("this program started MPI with MPI_THREAD_FUNNELED but the backend needs "
                        "MPI_THREAD_SERIALIZED"));
  MPI_Finalize();
}

}  // namespace
}  // namespace ember::distributed::mpi
