// Ranks as processes, and what survivors see when one of them is killed or
// stopped in the middle of an all_reduce.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/process_group.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::tcp {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::testing::HasSubstr;

TEST(TcpProcessesTest, AllReduceAcrossProcesses) {
  // Shared memory with direct reads (where the kernel allows them), the
  // rings alone, then sockets.
  for (const char* shm : {"1", "ring", "0"}) {
    setenv("EMBER_TCP_SHM", std::string(shm) == "0" ? "0" : "1", 1);
    setenv("EMBER_TCP_DIRECT", std::string(shm) == "ring" ? "0" : "1", 1);
    std::vector<ProcessResult> results = RunRankProcesses(3, [](Rank& me) -> absl::Status {
      Tensor t = full({4 << 20}, me.rank + 1, kFloat32);
      EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
      if (!t.equal(full({4 << 20}, 6, kFloat32))) return absl::InternalError("wrong sum");
      std::vector<Tensor> all = {zeros({1 << 18}), zeros({1 << 18}), zeros({1 << 18})};
      EMBER_RETURN_IF_ERROR(Finish(me.group->allgather(all, full({1 << 18}, me.rank, kFloat32))));
      for (int r = 0; r < 3; ++r) {
        if (!all[r].equal(full({1 << 18}, r, kFloat32))) return absl::InternalError("all_gather");
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(results[r].exit_code, 0) << "shm=" << shm << " rank " << r << ": "
                                         << results[r].output;
    }
  }
  unsetenv("EMBER_TCP_SHM");
  unsetenv("EMBER_TCP_DIRECT");
}

// Every survivor's all_reduce fails within about the timeout, naming the
// missing rank and the op. `fault` is the signal rank 2 raises in the
// middle of its all_reduce, just before the others join it.
void ExpectSurvivorsFail(int fault, const char* shm) {
  setenv("EMBER_TCP_SHM", shm, 1);
  RunRanksOptions options;
  options.timeout = absl::Seconds(3);
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [fault](Rank& me) -> absl::Status {
        Tensor t = ones({4 << 20}, kFloat32);  // 16 MiB: the op takes a while
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));  // everyone is up
        if (me.rank == 2) {
          // Inside its second all_reduce (which waits for the others) when
          // it is killed or stopped; the others join a moment later.
          EMBER_ASSIGN_OR_RETURN(auto work, me.group->allreduce(t));
          absl::SleepFor(absl::Milliseconds(50));
          if (work->is_completed()) return absl::InternalError("the all_reduce ended too soon");
          raise(fault);
          absl::SleepFor(absl::Seconds(30));
          return absl::InternalError("rank 2 survived its own signal");
        }
        absl::SleepFor(absl::Milliseconds(100));
        const absl::Time start = absl::Now();
        absl::Status s = Finish(me.group->allreduce(t));
        const absl::Duration took = absl::Now() - start;
        fprintf(stderr, "after %s: %s\n", absl::FormatDuration(took).c_str(),
                s.ToString().c_str());
        if (s.ok()) return absl::InternalError("all_reduce succeeded without rank 2");
        if (took > absl::Seconds(6)) return absl::InternalError("the error came too late");
        if (!absl::StrContains(s.message(), "rank 2") ||
            !absl::StrContains(s.message(), "all_reduce")) {
          return absl::InternalError("the error names neither the op nor rank 2");
        }
        return absl::OkStatus();
      },
      options, absl::Seconds(30));
  unsetenv("EMBER_TCP_SHM");
  for (int r = 0; r < 2; ++r) {
    std::cerr << "rank " << r << " " << results[r].output;  // what the survivor saw
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
    EXPECT_THAT(results[r].output, HasSubstr("rank 2"));
  }
  EXPECT_EQ(results[2].signal, SIGKILL);  // by the signal, or by the runner after SIGSTOP
}

TEST(TcpFaultTest, SigkillMidAllReduceOverSharedMemory) { ExpectSurvivorsFail(SIGKILL, "1"); }
TEST(TcpFaultTest, SigkillMidAllReduceOverSockets) { ExpectSurvivorsFail(SIGKILL, "0"); }
TEST(TcpFaultTest, SigstopMidAllReduceOverSharedMemory) { ExpectSurvivorsFail(SIGSTOP, "1"); }
TEST(TcpFaultTest, SigstopMidAllReduceOverSockets) { ExpectSurvivorsFail(SIGSTOP, "0"); }

}  // namespace
}  // namespace ember::distributed::tcp
