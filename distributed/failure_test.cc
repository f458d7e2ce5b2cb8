// Failing cleanly (Note [Failing cleanly] in distributed.cc), with real rank
// processes over tcp and gloo: a peer killed (SIGKILL) or stopped (SIGSTOP)
// in the middle of an all_reduce, then abort() or destroy_process_group on
// the survivors; and shrink_group, which the survivors use to go on without
// the dead rank.
//
// Groups get a 10-minute timeout, far beyond what RunRankProcesses waits
// for its children (60 s): a survivor that waited for a dead or stopped peer
// instead of failing at once would be killed by the runner and the test
// would fail, so no test asserts a time.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/distributed.h"
#include "distributed/file_store.h"
#include "distributed/prefix_store.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using testing::ProcessResult;
using testing::Rank;
using testing::RunRankProcesses;
using testing::RunRanksOptions;

constexpr absl::Duration kGroupTimeout = absl::Minutes(10);

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z'), or 'X' once
// the process is gone.
char ProcState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return 'X';
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? 'X' : line[paren + 2];
}

// How many entries a /proc directory lists (threads, descriptors).
int CountEntries(const char* dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++n;
  }
  return n;
}

// Waits until `pid` is stopped (SIGSTOP) or dead (SIGKILL).
absl::Status AwaitFault(pid_t pid, int fault) {
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (absl::Now() < until) {
    const char state = ProcState(pid);
    if (fault == SIGSTOP ? state == 'T' : (state == 'X' || state == 'Z')) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(2));
  }
  return absl::DeadlineExceededError(absl::StrCat("pid ", pid, " never showed signal ", fault));
}

// The default group of this rank process, over the run's FileStore under
// `prefix` (one per iteration).
absl::Status InitWorld(const Rank& me, const std::string& backend,
                       const std::shared_ptr<Store>& files, const std::string& prefix) {
  return init_process_group({.backend = backend,
                             .world_size = me.world_size,
                             .rank = me.rank,
                             .timeout = kGroupTimeout,
                             .store = std::make_shared<PrefixStore>(prefix, files)});
}

absl::StatusOr<std::shared_ptr<Store>> OpenFiles(const Rank& me) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> files,
                         FileStore::open(me.temp_dir + "/files", absl::Seconds(60)));
  return std::shared_ptr<Store>(std::move(files));
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// `status` is the abort's: kAborted naming why.
absl::Status ExpectAborted(const absl::Status& status, const std::string& what,
                           const std::string& reason) {
  if (status.code() == absl::StatusCode::kAborted && absl::StrContains(status.message(), reason)) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat(what, ": expected kAborted with '", reason, "', got ", status.ToString()));
}

RunRanksOptions ProcessOptions() {
  RunRanksOptions options;
  options.make_group = false;
  return options;
}

void ExpectAllExitedCleanly(const std::vector<ProcessResult>& results,
                            const std::vector<int>& survivors) {
  for (int r : survivors) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
  }
}

// One fault case: rank 2 of 3 is killed or stopped inside an all_reduce;
// ranks 0 and 1 then have that all_reduce and the next, a receive from
// rank 2 and a thread blocked in wait() pending, and end the group with abort() (then destroy)
// or with destroy_process_group alone. Every pending op must fail with
// kAborted (a killed peer may have failed them first, with kUnavailable
// naming rank 2), an op issued afterwards fails with kAborted at once, and
// destroy_process_group returns.
absl::Status FaultIteration(const Rank& me, const std::string& backend,
                            const std::shared_ptr<Store>& files, int fault, bool use_abort,
                            int iteration) {
  const std::string prefix = absl::StrCat("fault", iteration, "/");
  EMBER_RETURN_IF_ERROR(InitWorld(me, backend, files, prefix));
  EMBER_ASSIGN_OR_RETURN(Group world, get_default_group());
  Tensor t = full({4}, me.rank + 1, kFloat32);
  EMBER_RETURN_IF_ERROR(all_reduce(t));  // everyone is up
  EMBER_RETURN_IF_ERROR(Expect(t.equal(full({4}, 6, kFloat32)), "first all_reduce is wrong"));
  if (me.rank == 2) {
    EMBER_RETURN_IF_ERROR(files->set(absl::StrCat(prefix, "victim"), absl::StrCat(getpid())));
    // Inside its all_reduce, which waits for the others, when the signal
    // comes; the others join only once it has.
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, world->allreduce(t));
    raise(fault);
    // Stopped, then continued by rank 0 once the survivors are done: the
    // survivors have left, so this rank's op fails or is aborted here.
    world->abort();
    (void)work->wait();
    return destroy_process_group();
  }
  EMBER_ASSIGN_OR_RETURN(std::string victim,
                         files->get(absl::StrCat(prefix, "victim"), absl::Seconds(30)));
  pid_t pid = 0;
  EMBER_RETURN_IF_ERROR(Expect(absl::SimpleAtoi(victim, &pid), "bad victim pid"));
  EMBER_RETURN_IF_ERROR(AwaitFault(pid, fault));
  // The victim's all_reduce: its data may have left before it stopped, so
  // this one may even complete; the next needs the victim and stays pending.
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> same, world->allreduce(t));
  Tensor next = ones({4}, kFloat32);
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> collective, world->allreduce(next));
  Tensor in = zeros({4}, kFloat32);
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<RecvWork> recv, world->recv(in, 2));
  absl::Status blocked;
  std::thread waiter([&] { blocked = collective->wait(); });
  // Rank 0 ends its group first, so its ops are still pending when it does;
  // rank 1's may fail before it ends its own, having lost rank 0.
  const std::string done = absl::StrCat(prefix, "rank0-done");
  if (me.rank == 1) EMBER_RETURN_IF_ERROR(files->get(done, absl::Seconds(30)).status());
  const std::string reason = use_abort ? "aborted" : "destroyed";
  if (use_abort) world->abort();
  // destroy_process_group shuts down a group not aborted before.
  EMBER_RETURN_IF_ERROR(destroy_process_group());
  waiter.join();
  (void)same->wait();  // returns, whatever its outcome
  for (const auto& [status, what] :
       std::vector<std::pair<absl::Status, std::string>>{{blocked, "the blocked wait()"},
                                                         {collective->wait(), "the all_reduce"},
                                                         {recv->wait(), "the recv from rank 2"}}) {
    if (status.code() == absl::StatusCode::kUnavailable &&
        ((fault == SIGKILL && absl::StrContains(status.message(), "rank 2")) ||
         (me.rank == 1 && absl::StrContains(status.message(), "rank 0")))) {
      continue;  // the death, or rank 0 leaving, was seen first
    }
    EMBER_RETURN_IF_ERROR(ExpectAborted(status, what, reason));
  }
  if (me.rank == 0) EMBER_RETURN_IF_ERROR(files->set(done, "1"));
  // Rank 2 goes on once both survivors have seen it stopped and are done.
  const std::string rank1_done = absl::StrCat(prefix, "rank1-done");
  if (me.rank == 1) EMBER_RETURN_IF_ERROR(files->set(rank1_done, "1"));
  // Ops after the abort fail at once, through the handle still held.
  absl::StatusOr<std::shared_ptr<Work>> later = world->barrier();
  const absl::Status after = later.ok() ? (*later)->wait() : later.status();
  EMBER_RETURN_IF_ERROR(ExpectAborted(after, "a barrier after the abort", reason));
  if (fault == SIGSTOP && me.rank == 0) {
    EMBER_RETURN_IF_ERROR(files->get(rank1_done, absl::Seconds(30)).status());
    kill(pid, SIGCONT);
  }
  return absl::OkStatus();
}

struct FaultCase {
  std::string backend;
  int fault;
  bool use_abort;
};

std::string CaseName(const ::testing::TestParamInfo<FaultCase>& info) {
  return absl::StrCat(info.param.backend, info.param.fault == SIGKILL ? "Sigkill" : "Sigstop",
                      info.param.use_abort ? "Abort" : "Destroy");
}

class FaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultTest, SurvivorsFailAtOnce) {
  const FaultCase c = GetParam();
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [&](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> files, OpenFiles(me));
        return FaultIteration(me, c.backend, files, c.fault, c.use_abort, 0);
      },
      ProcessOptions());
  ExpectAllExitedCleanly(results, {0, 1});
  if (c.fault == SIGKILL) {
    EXPECT_EQ(results[2].signal, SIGKILL);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, FaultTest,
    ::testing::Values(FaultCase{"tcp", SIGKILL, true}, FaultCase{"tcp", SIGKILL, false},
                      FaultCase{"tcp", SIGSTOP, true}, FaultCase{"tcp", SIGSTOP, false},
                      FaultCase{"gloo", SIGKILL, true}, FaultCase{"gloo", SIGKILL, false},
                      FaultCase{"gloo", SIGSTOP, true}, FaultCase{"gloo", SIGSTOP, false}),
    CaseName);

// 100 rounds in the same three processes: rank 2 stops itself inside an
// all_reduce, the survivors end the group (abort() or destroy_process_group,
// alternately), rank 0 continues rank 2, and the next round makes a fresh
// group. Any round that hung or failed its checks ends the run, and each
// process ends with the threads and descriptors it had after round 0.
class FaultLoopTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultLoopTest, HundredStoppedPeers) {
  const std::string backend = GetParam();
  constexpr int kRounds = 100;
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [&](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> files, OpenFiles(me));
        int threads = 0, fds = 0;
        for (int i = 0; i < kRounds; ++i) {
          absl::Status s = FaultIteration(me, backend, files, SIGSTOP, i % 2 == 0, i);
          if (!s.ok()) return absl::Status(s.code(), absl::StrCat("round ", i, ": ", s.message()));
          // What the first round left (process-wide helpers started once) is
          // all that is ever left: every later group's threads and
          // descriptors are released with it.
          if (i == 0) {
            threads = CountEntries("/proc/self/task");
            fds = CountEntries("/proc/self/fd");
          }
        }
        EMBER_RETURN_IF_ERROR(Expect(CountEntries("/proc/self/task") == threads,
                                     absl::StrCat("threads: ", threads, " after round 0, ",
                                                  CountEntries("/proc/self/task"), " at the end")));
        return Expect(CountEntries("/proc/self/fd") == fds,
                      absl::StrCat("descriptors: ", fds, " after round 0, ",
                                   CountEntries("/proc/self/fd"), " at the end"));
      },
      ProcessOptions(), absl::Seconds(120));
  ExpectAllExitedCleanly(results, {0, 1, 2});
}

// 100 rounds of a peer killed in mid-all_reduce, each a fresh set of
// processes (a killed rank cannot go on).
TEST_P(FaultLoopTest, HundredKilledPeers) {
  const std::string backend = GetParam();
  for (int i = 0; i < 100; ++i) {
    std::vector<ProcessResult> results = RunRankProcesses(
        3,
        [&](Rank& me) -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> files, OpenFiles(me));
          return FaultIteration(me, backend, files, SIGKILL, i % 2 == 0, 0);
        },
        ProcessOptions());
    ASSERT_EQ(results[0].exit_code, 0) << "round " << i << ": " << results[0].output;
    ASSERT_EQ(results[1].exit_code, 0) << "round " << i << ": " << results[1].output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultLoopTest, ::testing::Values("tcp", "gloo"));

// --- shrink_group -------------------------------------------------------------------

struct ShrinkCase {
  std::string backend;
  int world;
  int victim;
};

std::string ShrinkName(const ::testing::TestParamInfo<ShrinkCase>& info) {
  return absl::StrCat(info.param.backend, info.param.world, "RanksKill", info.param.victim);
}

class ShrinkTest : public ::testing::TestWithParam<ShrinkCase> {};

// The victim dies inside an all_reduce; the survivors abort, shrink the
// default group and run collectives on it, renumbered as torch numbers them
// (the survivors in their old order).
TEST_P(ShrinkTest, SurvivorsGoOnWithoutTheDeadRank) {
  const ShrinkCase c = GetParam();
  std::vector<ProcessResult> results = RunRankProcesses(
      c.world,
      [&](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> files, OpenFiles(me));
        EMBER_RETURN_IF_ERROR(InitWorld(me, c.backend, files, "shrink/"));
        EMBER_ASSIGN_OR_RETURN(Group world, get_default_group());
        Tensor t = full({8}, me.rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(t));
        if (me.rank == c.victim) {
          EMBER_RETURN_IF_ERROR(files->set("victim", absl::StrCat(getpid())));
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, world->allreduce(t));
          raise(SIGKILL);
          return absl::InternalError("survived SIGKILL");
        }
        EMBER_ASSIGN_OR_RETURN(std::string victim, files->get("victim", absl::Seconds(30)));
        pid_t pid = 0;
        EMBER_RETURN_IF_ERROR(Expect(absl::SimpleAtoi(victim, &pid), "bad victim pid"));
        EMBER_RETURN_IF_ERROR(AwaitFault(pid, SIGKILL));
        // The victim's all_reduce (which its data may have let complete) and
        // one that needs it.
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> same, world->allreduce(t));
        Tensor next = ones({8}, kFloat32);
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> pending, world->allreduce(next));
        world->abort();
        (void)same->wait();
        EMBER_RETURN_IF_ERROR(Expect(!pending->wait().ok(), "the all_reduce without the victim"));
        EMBER_ASSIGN_OR_RETURN(Group shrunk, shrink_group({c.victim}));
        // The survivors, renumbered in order.
        const int expected_rank = me.rank < c.victim ? me.rank : me.rank - 1;
        EMBER_RETURN_IF_ERROR(
            Expect(get_rank() == expected_rank,
                   absl::StrCat("get_rank() is ", get_rank(), ", expected ", expected_rank)));
        EMBER_RETURN_IF_ERROR(Expect(get_world_size() == c.world - 1, "get_world_size()"));
        EMBER_RETURN_IF_ERROR(Expect(shrunk->rank() == expected_rank, "shrunk->rank()"));
        EMBER_ASSIGN_OR_RETURN(Group now, get_default_group());
        EMBER_RETURN_IF_ERROR(Expect(now == shrunk, "the shrunken group is the default one"));
        // The old group stays aborted.
        absl::StatusOr<std::shared_ptr<Work>> old = world->barrier();
        EMBER_RETURN_IF_ERROR(
            ExpectAborted(old.ok() ? (*old)->wait() : old.status(), "the old group", "aborted"));
        // Sum of (old rank + 1) over the survivors.
        const int sum = c.world * (c.world + 1) / 2 - (c.victim + 1);
        Tensor u = full({8}, me.rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(u));
        EMBER_RETURN_IF_ERROR(
            Expect(u.equal(full({8}, sum, kFloat32)),
                   absl::StrCat("all_reduce on the shrunken group: expected ", sum)));
        // New rank 1 broadcasts its old rank.
        const int old_of_new1 = 1 < c.victim ? 1 : 2;
        Tensor b = full({3}, me.rank, kInt64);
        EMBER_RETURN_IF_ERROR(broadcast(b, 1));
        EMBER_RETURN_IF_ERROR(
            Expect(b.equal(full({3}, old_of_new1, kInt64)), "broadcast from new rank 1"));
        std::vector<Tensor> gathered;
        for (int r = 0; r < c.world - 1; ++r) gathered.push_back(zeros({2}, kInt64));
        EMBER_RETURN_IF_ERROR(all_gather(gathered, full({2}, me.rank, kInt64)));
        for (int r = 0, old_rank = 0; r < c.world - 1; ++r, ++old_rank) {
          if (old_rank == c.victim) ++old_rank;
          EMBER_RETURN_IF_ERROR(Expect(gathered[r].equal(full({2}, old_rank, kInt64)),
                                       absl::StrCat("all_gather slot ", r)));
        }
        // new_group works after the shrink, in the new numbering.
        EMBER_ASSIGN_OR_RETURN(Group pair, new_group({0, 1}));
        Tensor p = ones({2}, kFloat32);
        if (pair->rank() >= 0) {
          EMBER_RETURN_IF_ERROR(all_reduce(p, ReduceOp::kSum, pair));
          EMBER_RETURN_IF_ERROR(Expect(p.equal(full({2}, 2, kFloat32)), "new_group all_reduce"));
        }
        return destroy_process_group();
      },
      ProcessOptions());
  std::vector<int> survivors;
  for (int r = 0; r < c.world; ++r) {
    if (r != c.victim) survivors.push_back(r);
  }
  ExpectAllExitedCleanly(results, survivors);
  EXPECT_EQ(results[c.victim].signal, SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Backends, ShrinkTest,
                         ::testing::Values(ShrinkCase{"tcp", 3, 2}, ShrinkCase{"tcp", 4, 1},
                                           ShrinkCase{"gloo", 3, 2}, ShrinkCase{"gloo", 4, 1}),
                         ShrinkName);

class ShrinkSubgroupTest : public ::testing::TestWithParam<std::string> {};

// Shrinking a group made by new_group: the default group stays, the
// shrunken group keeps the survivors' global ranks for the free functions.
TEST_P(ShrinkSubgroupTest, SurvivorsOfANewGroupKeepTheirGlobalRanks) {
  const std::string backend = GetParam();
  std::vector<ProcessResult> results = RunRankProcesses(
      4,
      [&](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> files, OpenFiles(me));
        EMBER_RETURN_IF_ERROR(InitWorld(me, backend, files, "sub/"));
        EMBER_ASSIGN_OR_RETURN(Group trio, new_group({1, 2, 3}));
        if (me.rank == 0) return absl::OkStatus();  // not a member; leaves
        Tensor t = full({4}, me.rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(t, ReduceOp::kSum, trio));
        if (me.rank == 3) {
          EMBER_RETURN_IF_ERROR(files->set("victim", absl::StrCat(getpid())));
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, trio->allreduce(t));
          raise(SIGKILL);
          return absl::InternalError("survived SIGKILL");
        }
        EMBER_ASSIGN_OR_RETURN(std::string victim, files->get("victim", absl::Seconds(30)));
        pid_t pid = 0;
        EMBER_RETURN_IF_ERROR(Expect(absl::SimpleAtoi(victim, &pid), "bad victim pid"));
        EMBER_RETURN_IF_ERROR(AwaitFault(pid, SIGKILL));
        trio->abort();
        // Rank 3 of the world is rank 2 of the trio.
        EMBER_ASSIGN_OR_RETURN(Group pair, shrink_group({2}, trio, kShrinkAbort));
        EMBER_RETURN_IF_ERROR(Expect(get_rank() == me.rank, "the global rank stays"));
        EMBER_RETURN_IF_ERROR(Expect(get_world_size() == 4, "the world stays"));
        EMBER_RETURN_IF_ERROR(Expect(get_rank(pair) == me.rank - 1, "rank in the shrunken group"));
        EMBER_RETURN_IF_ERROR(Expect(get_world_size(pair) == 2, "size of the shrunken group"));
        Tensor u = full({4}, me.rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(u, ReduceOp::kSum, pair));
        EMBER_RETURN_IF_ERROR(Expect(u.equal(full({4}, 5, kFloat32)), "all_reduce: 2 + 3"));
        Tensor b = full({2}, me.rank, kInt64);
        EMBER_RETURN_IF_ERROR(broadcast(b, /*src=*/2, pair));  // a global rank
        EMBER_RETURN_IF_ERROR(Expect(b.equal(full({2}, 2, kInt64)), "broadcast from global 2"));
        // The old group is gone from the job's groups.
        EMBER_RETURN_IF_ERROR(Expect(
            all_reduce(u, ReduceOp::kSum, trio).code() == absl::StatusCode::kFailedPrecondition,
            "the old group is destroyed"));
        return absl::OkStatus();
      },
      ProcessOptions());
  ExpectAllExitedCleanly(results, {0, 1, 2});
  EXPECT_EQ(results[3].signal, SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Backends, ShrinkSubgroupTest, ::testing::Values("tcp", "gloo"));

// What shrink_group refuses, before any communication.
TEST(ShrinkGroupTest, BadArguments) {
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [](Rank& me) -> absl::Status {
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> files, OpenFiles(me));
        EMBER_RETURN_IF_ERROR(
            Expect(shrink_group({1}).status().code() == absl::StatusCode::kFailedPrecondition,
                   "before init_process_group"));
        EMBER_RETURN_IF_ERROR(InitWorld(me, "tcp", files, "bad/"));
        struct Bad {
          std::vector<int> ranks;
          int flags;
          absl::StatusCode code;
          std::string says;
        };
        const int other = me.rank == 0 ? 1 : 0;
        for (const Bad& bad : std::vector<Bad>{
                 {{}, kShrinkDefault, absl::StatusCode::kInvalidArgument, "empty"},
                 {{5}, kShrinkDefault, absl::StatusCode::kInvalidArgument, "rank 5"},
                 {{-1}, kShrinkDefault, absl::StatusCode::kInvalidArgument, "rank -1"},
                 {{other, other}, kShrinkDefault, absl::StatusCode::kInvalidArgument, "twice"},
                 {{0, 1, 2}, kShrinkDefault, absl::StatusCode::kInvalidArgument, "all 3 ranks"},
                 {{me.rank},
                  kShrinkDefault,
                  absl::StatusCode::kFailedPrecondition,
                  "is in ranks_to_exclude"},
                 {{other}, 7, absl::StatusCode::kInvalidArgument, "shrink_flags 7"}}) {
          absl::Status s = shrink_group(bad.ranks, nullptr, bad.flags).status();
          if (s.code() != bad.code || !absl::StrContains(s.message(), bad.says)) {
            return absl::InternalError(
                absl::StrCat("expected '", bad.says, "', got ", s.ToString()));
          }
        }
        // The group is untouched by the refusals.
        Tensor t = ones({2}, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(t));
        EMBER_RETURN_IF_ERROR(Expect(t.equal(full({2}, 3, kFloat32)), "all_reduce after refusals"));
        return destroy_process_group();
      },
      ProcessOptions());
  ExpectAllExitedCleanly(results, {0, 1, 2});
}

}  // namespace
}  // namespace ember::distributed
