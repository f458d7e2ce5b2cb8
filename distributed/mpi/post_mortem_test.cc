// Post-mortems of mpi jobs (issue 27): 2 ranks under mpirun, started through
// init_process_group({.backend = "mpi"}) with no store (the group makes its
// own: Note [mpi's store] in process_group_mpi.cc), a 3 s timeout, three
// agreeing all_reduces, then rank 1's fault at all_reduce #3:
// - stuck in user code (skip) or SIGSTOPped: rank 0's error comes within the
//   timeout + 2 s and its desync report names rank 1 and its last
//   collective (#2); fr_trace over the job's dumps names rank 1 and
//   all_reduce #3;
// - another op, another size, another dtype (TORCH_DISTRIBUTED_DEBUG=DETAIL,
//   compared through the group's store): both ranks fail at once naming
//   both calls, and the group goes on;
// - SIGKILLed: mpirun ends the job and names rank 1 and the signal;
// - with MASTER_ADDR and MASTER_PORT set, the store is served there.
// Run by Bazel, this binary starts itself again under mpirun (mpirun.h) for
// each case; inside the job it runs that case's MpiFaultJob test.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/distributed.h"
#include "distributed/mpi/mpirun.h"
#include "distributed/testing/free_port.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"

namespace ember::distributed::mpi {
namespace {

using ::ember::distributed::testing::launched_job;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(3);

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

// --- Inside the job ------------------------------------------------------------------

// Three agreeing all_reduces; then rank 1 runs `fault` where all_reduce #3
// is due, and rank 0 runs all_reduce #3 and returns its status and how long
// it took. Afterwards both ranks meet in a barrier with a long timeout, so
// that the job ends cleanly once rank 1 is back.
struct Outcome {
  absl::Status status;
  absl::Duration took;
};

Outcome RunUpToTheFault(const std::function<absl::Status()>& fault) {
  Outcome out;
  EXPECT_TRUE(init_process_group({.backend = "mpi", .timeout = kTimeout}).ok());
  const int rank = get_rank();
  for (int i = 0; i < 3; ++i) {
    Tensor t = ones({8});
    EXPECT_TRUE(all_reduce(t).ok()) << i;
  }
  const absl::Time start = absl::Now();
  if (rank == 1) {
    out.status = fault();
  } else {
    out.status = all_reduce(ones({8}));
  }
  out.took = absl::Now() - start;
  return out;
}

void MeetAndEnd() {
  absl::StatusOr<Group> world = get_default_group();
  ASSERT_TRUE(world.ok());
  absl::Status met = testing::Finish((*world)->barrier({.timeout = absl::Seconds(60)}));
  EXPECT_TRUE(met.ok()) << met;
  EXPECT_TRUE(destroy_process_group().ok());
}

class MpiFaultJob : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!launched_job()) GTEST_SKIP() << "runs inside the mpirun job (MpiPostMortem.*)";
  }
};

void ExpectStallNamed(const Outcome& out) {
  if (get_rank() != 0) return;
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDeadlineExceeded) << out.status;
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("all_reduce (collective #3)"));
  EXPECT_THAT(std::string(out.status.message()),
              HasSubstr("desync report: rank 1 is behind: its last collective is #2 all_reduce"));
  EXPECT_LT(out.took, kTimeout + absl::Seconds(2)) << out.status;
}

TEST_F(MpiFaultJob, Skip) {
  // Rank 1 is busy in its own code past rank 0's timeout, then catches up.
  Outcome out = RunUpToTheFault([] {
    absl::SleepFor(kTimeout + absl::Seconds(2));
    return all_reduce(ones({8}));
  });
  ExpectStallNamed(out);
  MeetAndEnd();
}

TEST_F(MpiFaultJob, Sigstop) {
  Outcome out = RunUpToTheFault([] {
    // Progress is published every EMBER_DESYNC_PUBLISH_MS (100 ms), off the
    // op path: a rank stopped sooner after its last collective shows an
    // older progress (Note [Desync reports]).
    absl::SleepFor(absl::Milliseconds(300));
    // A child wakes this process again later; until then it is stopped.
    const pid_t self = getpid();
    const pid_t waker = fork();
    if (waker == 0) {
      absl::SleepFor(kTimeout + absl::Seconds(2));
      kill(self, SIGCONT);
      _exit(0);
    }
    raise(SIGSTOP);
    waitpid(waker, nullptr, 0);
    return all_reduce(ones({8}));
  });
  ExpectStallNamed(out);
  MeetAndEnd();
}

// TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the outer test): the call check
// through the group's store fails both ranks before MPI sees the calls.
void ExpectMismatchNamed(const Outcome& out, const std::string& rank1_call) {
  const int rank = get_rank();
  EXPECT_EQ(out.status.code(), absl::StatusCode::kFailedPrecondition) << out.status;
  EXPECT_LT(out.took, kTimeout + absl::Seconds(2)) << out.status;
  if (rank == 0) {
    EXPECT_THAT(std::string(out.status.message()),
                HasSubstr(absl::StrCat("mismatched collectives: all_reduce (collective #3): rank "
                                       "1 ran ",
                                       rank1_call,
                                       " but this rank (0) ran all_reduce of 32 B float32 (SUM)")))
        << out.status;
  } else {
    EXPECT_THAT(std::string(out.status.message()),
                HasSubstr("rank 0 ran all_reduce of 32 B float32 (SUM)"))
        << out.status;
  }
}

TEST_F(MpiFaultJob, OtherOp) {
  Outcome out = RunUpToTheFault([] { return broadcast(ones({8}), 0); });
  ExpectMismatchNamed(out, "broadcast of 32 B float32 with root 0");
  MeetAndEnd();
}

TEST_F(MpiFaultJob, OtherSize) {
  Outcome out = RunUpToTheFault([] { return all_reduce(ones({16})); });
  ExpectMismatchNamed(out, "all_reduce of 64 B float32 (SUM)");
  MeetAndEnd();
}

TEST_F(MpiFaultJob, OtherDtype) {
  Outcome out = RunUpToTheFault([] { return all_reduce(ones({8}, kInt32)); });
  ExpectMismatchNamed(out, "all_reduce of 32 B int32 (SUM)");
  MeetAndEnd();
}

// MASTER_PORT is not a port (set by the outer test): init_process_group
// says so on every rank.
TEST_F(MpiFaultJob, BadMasterPort) {
  absl::Status s = init_process_group({.backend = "mpi", .timeout = kTimeout});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("MASTER_PORT='abc' is not a port"));
}

TEST_F(MpiFaultJob, Sigkill) {
  RunUpToTheFault([]() -> absl::Status {
    raise(SIGKILL);
    return absl::OkStatus();
  });
}

// --- Outside: the jobs -----------------------------------------------------------------

class MpiPostMortem : public ::testing::Test {
 protected:
  void SetUp() override {
    if (launched_job()) GTEST_SKIP() << "already inside an mpirun job";
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
  }
  void TearDown() override {
    unsetenv("TORCH_DISTRIBUTED_DEBUG");
    unsetenv("TORCH_FR_DUMP_TEMP_FILE");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
  }
  // Runs case `name` at 2 ranks with its dumps in a directory of its own.
  MpirunResult Job(const std::string& name) {
    dumps_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/dumps_", name);
    mkdir(dumps_.c_str(), 0755);
    setenv("TORCH_FR_DUMP_TEMP_FILE", absl::StrCat(dumps_, "/trace_").c_str(), 1);
    return RunThisTestUnderMpirun(2, absl::StrCat("MpiFaultJob.", name),
                                  {.timeout = absl::Seconds(90)});
  }
  // fr_trace over the job's dumps.
  std::string Trace() {
    const std::string out = absl::StrCat(dumps_, ".trace");
    const std::string command = absl::StrCat(Runfile("tools/launch/fr_trace"), " --world_size=2 ",
                                             dumps_, " > ", out, " 2>&1");
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    FILE* f = std::fopen(out.c_str(), "r");
    std::string text;
    if (f == nullptr) return text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    std::fclose(f);
    return text;
  }
  void ExpectPassed(const MpirunResult& job) {
    EXPECT_EQ(job.exit_code, 0) << job.output;
    EXPECT_FALSE(job.timed_out) << job.output;
    EXPECT_THAT(job.output, HasSubstr("[  PASSED  ] 1 test")) << job.output;
  }
  std::string dumps_;
};

TEST_F(MpiPostMortem, RankStuckInUserCodeIsNamedByTheSurvivorAndTheAnalyser) {
  ExpectPassed(Job("Skip"));
  EXPECT_THAT(Trace(), HasSubstr("all_reduce #3 (group 0, 32 B float32): rank 0 entered it; "
                                 "rank 1 left no dump"));
}

TEST_F(MpiPostMortem, StoppedRankIsNamedByTheSurvivorAndTheAnalyser) {
  ExpectPassed(Job("Sigstop"));
  EXPECT_THAT(Trace(), HasSubstr("all_reduce #3 (group 0, 32 B float32): rank 0 entered it; "
                                 "rank 1 left no dump"));
}

TEST_F(MpiPostMortem, MismatchesFailBothRanksAtOnceUnderDetail) {
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  for (const char* name : {"OtherOp", "OtherSize", "OtherDtype"}) {
    SCOPED_TRACE(name);
    ExpectPassed(Job(name));
  }
}

// With MASTER_ADDR and MASTER_PORT set, the default group's store is served
// there (PyTorch's env://): DETAIL's check works through it; a MASTER_PORT
// that is not a port is an error naming it.
TEST_F(MpiPostMortem, MasterAddrAndPortServeTheStoreWhenSet) {
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", absl::StrCat(testing::FreePort()).c_str(), 1);
  ExpectPassed(Job("OtherSize"));
  setenv("MASTER_PORT", "abc", 1);
  ExpectPassed(Job("BadMasterPort"));
}

TEST_F(MpiPostMortem, KilledRankIsNamedByMpirun) {
  MpirunResult job = Job("Sigkill");
  EXPECT_NE(job.exit_code, 0) << job.output;
  EXPECT_FALSE(job.timed_out) << job.output;
  EXPECT_THAT(job.output, HasSubstr("rank 1")) << job.output;
  EXPECT_THAT(job.output, HasSubstr("signal 9")) << job.output;
}

}  // namespace
}  // namespace ember::distributed::mpi
