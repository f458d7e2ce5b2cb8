// Post-mortems of mpi jobs (issue 27): 2 and 4 ranks under mpirun, started
// through init_process_group({.backend = "mpi"}) with no store (the group
// makes its own: Note [mpi's store] in process_group_mpi.cc), a 3 s timeout,
// three agreeing all_reduces, then the last rank's fault at all_reduce #3:
// - stuck in user code (skip) or SIGSTOPped: the others' errors come within
//   the timeout + 2 s and their desync reports name the last rank and its
//   last collective (#2); fr_trace over the job's dumps names it and
//   all_reduce #3;
// - another op, another size, another dtype (TORCH_DISTRIBUTED_DEBUG=DETAIL,
//   compared through the group's store): every rank fails at once naming
//   both calls, and the group goes on;
// - SIGKILLed: mpirun names the rank and the signal and stops the others
//   with SIGTERM, on which they dump their flight recorders: fr_trace names
//   the killed rank and all_reduce #3; with --mca odls_base_sigkill_timeout
//   6, mpirun waits longer than the timeout + 2 s before that SIGTERM and
//   the others' desync reports name the killed rank (Note [mpi
//   post-mortems] in process_group_mpi.cc);
// - crashed (SIGSEGV): its own dump names the signal, under Open MPI's own
//   handler;
// - with MASTER_ADDR and MASTER_PORT set, the store is served there.
// Run by Bazel, this binary starts itself again under mpirun (mpirun.h) for
// each case; inside the job it runs that case's MpiFaultJob test.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(3);

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

// --- Inside the job ------------------------------------------------------------------

// Three agreeing all_reduces; then the last rank runs `fault` where
// all_reduce #3 is due, and the others run all_reduce #3 and return its
// status and how long it took. Afterwards the ranks meet in a barrier with
// a long timeout, so that the job ends cleanly once the last rank is back.
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
  if (rank == get_world_size() - 1) {
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

int Last() { return get_world_size() - 1; }

// Every rank but the last: its error names the last rank within the timeout
// + 2 s.
void ExpectStallNamed(const Outcome& out) {
  if (get_rank() == Last()) return;
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDeadlineExceeded) << out.status;
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("all_reduce (collective #3)"));
  EXPECT_THAT(std::string(out.status.message()),
              HasSubstr(absl::StrCat("desync report: rank ", Last(),
                                     " is behind: its last collective is #2 all_reduce")));
  EXPECT_LT(out.took, kTimeout + absl::Seconds(2)) << out.status;
  std::printf("rank %d: all_reduce #3 failed after %lld ms\n", get_rank(),
              static_cast<long long>(absl::ToInt64Milliseconds(out.took)));
}

TEST_F(MpiFaultJob, Skip) {
  // The last rank is busy in its own code past rank 0's timeout, then catches up.
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
// through the group's store fails every rank before MPI sees the calls.
void ExpectMismatchNamed(const Outcome& out, const std::string& last_call) {
  const int rank = get_rank();
  EXPECT_EQ(out.status.code(), absl::StatusCode::kFailedPrecondition) << out.status;
  EXPECT_LT(out.took, kTimeout + absl::Seconds(2)) << out.status;
  if (rank != Last()) {
    EXPECT_THAT(std::string(out.status.message()),
                HasSubstr(absl::StrCat("mismatched collectives: all_reduce (collective #3): rank ",
                                       Last(), " ran ", last_call, " but this rank (", rank,
                                       ") ran all_reduce of 32 B float32 (SUM)")))
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

// The last rank is SIGKILLed (once its progress is published, as for
// SIGSTOP). With mpirun's defaults the others are stopped (SIGTERM) before
// their timeout; the outer test reads their dumps. With
// odls_base_sigkill_timeout above the timeout + 2 s, they get there first and
// check their errors here, then end at once (their collective is stuck in
// MPI, and mpirun ends the job anyway).
TEST_F(MpiFaultJob, Sigkill) {
  Outcome out = RunUpToTheFault([]() -> absl::Status {
    absl::SleepFor(absl::Milliseconds(300));
    raise(SIGKILL);
    return absl::OkStatus();
  });
  ExpectStallNamed(out);
  std::printf("rank %d checked its error: %s\n", get_rank(), HasFailure() ? "FAILED" : "passed");
  std::fflush(nullptr);
  // Rank 0 serves the group's store: it stays while the others read their
  // desync reports from it.
  absl::SleepFor(get_rank() == 0 ? absl::Seconds(2) : absl::Milliseconds(500));
  _exit(HasFailure() ? 1 : 0);
}

// The last rank crashes (SIGSEGV) where all_reduce #3 is due. Open MPI's
// own SIGSEGV handler (installed by MPI_Init) prints a backtrace after the
// flight recorder's dump (the recorder, installed later, chains to it).
TEST_F(MpiFaultJob, Sigsegv) {
  RunUpToTheFault([]() -> absl::Status {
    const rlimit no_core{0, 0};  // a core file would only slow the test
    setrlimit(RLIMIT_CORE, &no_core);
    raise(SIGSEGV);
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
  // Runs case `name` at `ranks` ranks with its dumps in a directory of its
  // own; `mpirun_args` are added to mpirun's.
  MpirunResult Job(const std::string& name, int ranks = 2,
                   std::vector<std::string> mpirun_args = {}) {
    ranks_ = ranks;
    dumps_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/dumps_", name, "_", ranks, "_",
                          mpirun_args.size());
    mkdir(dumps_.c_str(), 0755);
    setenv("TORCH_FR_DUMP_TEMP_FILE", absl::StrCat(dumps_, "/trace_").c_str(), 1);
    MpirunResult job = RunThisTestUnderMpirun(
        ranks, absl::StrCat("MpiFaultJob.", name),
        {.timeout = absl::Seconds(90), .mpirun_args = std::move(mpirun_args)});
    // Each rank's time from all_reduce #3 to its error, for the log.
    for (size_t at = job.output.find("failed after"); at != std::string::npos;
         at = job.output.find("failed after", at + 1)) {
      const size_t begin = job.output.rfind('\n', at) + 1;
      std::printf("%s: %s\n", name.c_str(),
                  job.output.substr(begin, job.output.find('\n', at) - begin).c_str());
    }
    return job;
  }
  // fr_trace over the job's dumps.
  std::string Trace() {
    const std::string out = absl::StrCat(dumps_, ".trace");
    const std::string command = absl::StrCat(Runfile("tools/launch/fr_trace"), " --world_size=",
                                             ranks_, " ", dumps_, " > ", out, " 2>&1");
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    FILE* f = std::fopen(out.c_str(), "r");
    std::string text;
    if (f == nullptr) return text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    std::fclose(f);
    return text;
  }
  // fr_trace's words: every rank but the last entered all_reduce #3, and
  // then what the last rank did.
  std::string EnteredByAllButTheLast(const std::string& last_did) const {
    std::vector<std::string> others;
    for (int r = 0; r + 1 < ranks_; ++r) others.push_back(absl::StrCat(r));
    return absl::StrCat("all_reduce #3 (group 0, 32 B float32): ",
                        others.size() == 1 ? "rank " : "ranks ", absl::StrJoin(others, ", "),
                        " entered it; rank ", ranks_ - 1, " ", last_did);
  }
  void ExpectPassed(const MpirunResult& job) {
    EXPECT_EQ(job.exit_code, 0) << job.output;
    EXPECT_FALSE(job.timed_out) << job.output;
    EXPECT_THAT(job.output, HasSubstr("[  PASSED  ] 1 test")) << job.output;
  }
  std::string dumps_;
  int ranks_ = 2;
};

// The cases at 2 and 4 ranks.
class MpiPostMortemAtRanks : public MpiPostMortem, public ::testing::WithParamInterface<int> {};

TEST_P(MpiPostMortemAtRanks, RankStuckInUserCodeIsNamedByTheOthersAndTheAnalyser) {
  ExpectPassed(Job("Skip", GetParam()));
  EXPECT_THAT(Trace(), HasSubstr(EnteredByAllButTheLast("left no dump")));
}

TEST_P(MpiPostMortemAtRanks, StoppedRankIsNamedByTheOthersAndTheAnalyser) {
  ExpectPassed(Job("Sigstop", GetParam()));
  EXPECT_THAT(Trace(), HasSubstr(EnteredByAllButTheLast("left no dump")));
}

// mpirun's defaults: it names the rank and the signal, and stops the others
// (SIGCONT; SIGTERM a second later; SIGKILL a second after that) before
// their timeout; each dumps its flight recorder on the SIGTERM, and fr_trace
// over the dumps names the killed rank and all_reduce #3. On a loaded
// machine a survivor may not finish its dump within mpirun's second before
// the SIGKILL, so the trace must name the killed rank among those that left
// no dump and show at least one dump taken on the SIGTERM, not every one.
TEST_P(MpiPostMortemAtRanks, KilledRankIsNamedByMpirunAndByTheOthersDumps) {
  const int ranks = GetParam();
  MpirunResult job = Job("Sigkill", ranks);
  EXPECT_NE(job.exit_code, 0) << job.output;
  EXPECT_FALSE(job.timed_out) << job.output;
  EXPECT_THAT(job.output, HasSubstr(absl::StrCat("rank ", ranks - 1))) << job.output;
  EXPECT_THAT(job.output, HasSubstr("signal 9")) << job.output;
  const std::string trace = Trace();
  EXPECT_THAT(trace, ContainsRegex(absl::StrCat(
                         "all_reduce #3 \\(group 0, 32 B float32\\): ranks? [0-9, ]+ entered it; "
                         "ranks? ([0-9]+, )*",
                         ranks - 1, " left no dump")));
  EXPECT_THAT(trace, HasSubstr("dumped on: SIGTERM"));
}

// With --mca odls_base_sigkill_timeout 6 mpirun waits longer than the
// timeout + 2 s before its SIGTERM: the others reach their timeout, and
// their errors' desync reports name the killed rank (checked inside the
// job, which prints each rank's verdict).
TEST_P(MpiPostMortemAtRanks, KilledRankIsNamedByTheOthersErrorsGivenTime) {
  const int ranks = GetParam();
  MpirunResult job = Job("Sigkill", ranks, {"--mca", "odls_base_sigkill_timeout", "6"});
  EXPECT_NE(job.exit_code, 0) << job.output;
  EXPECT_FALSE(job.timed_out) << job.output;
  for (int r = 0; r + 1 < ranks; ++r) {
    EXPECT_THAT(job.output, HasSubstr(absl::StrCat("rank ", r, " checked its error: passed")))
        << job.output;
  }
  EXPECT_THAT(Trace(), HasSubstr(EnteredByAllButTheLast("left no dump")));
}

TEST_P(MpiPostMortemAtRanks, MismatchesFailEveryRankAtOnceUnderDetail) {
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  for (const char* name : {"OtherOp", "OtherSize", "OtherDtype"}) {
    SCOPED_TRACE(name);
    ExpectPassed(Job(name, GetParam()));
  }
}

// A fatal signal in a rank leaves its dump, which names the signal and
// where the rank got to; mpirun names the rank and the signal, and fr_trace
// over the dumps (the others' written on mpirun's SIGTERM) says that every
// other rank entered all_reduce #3 and the crashed one never did.
TEST_P(MpiPostMortemAtRanks, CrashedRankLeavesADump) {
  const int ranks = GetParam();
  MpirunResult job = Job("Sigsegv", ranks);
  EXPECT_NE(job.exit_code, 0) << job.output;
  EXPECT_FALSE(job.timed_out) << job.output;
  EXPECT_THAT(job.output, HasSubstr(absl::StrCat("rank ", ranks - 1))) << job.output;
  EXPECT_THAT(job.output, HasSubstr("signal 11")) << job.output;
  const std::string trace = Trace();
  EXPECT_THAT(trace, HasSubstr(EnteredByAllButTheLast("never did"))) << trace;
  EXPECT_THAT(trace, HasSubstr("dumped on: fatal signal SIGSEGV")) << trace;
}

INSTANTIATE_TEST_SUITE_P(Ranks, MpiPostMortemAtRanks, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Ranks");
                         });

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

}  // namespace
}  // namespace ember::distributed::mpi
