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
#include "distributed/testing/process_group_suite.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::tcp {
namespace {

TEST(TcpProcessesTest, AllReduceAcrossProcesses) {
  // Shared memory with direct reads (where the kernel allows them), the
  // rings alone, then sockets.
  for (const char* shm : {"1", "ring", "0"}) {
    setenv("EMBER_TCP_SHM", std::string(shm) == "0" ? "0" : "1", 1);
    setenv("EMBER_TCP_DIRECT", std::string(shm) == "ring" ? "0" : "1", 1);
    SCOPED_TRACE(absl::StrCat("shm=", shm));
    testing::ExpectAllReduceAcrossProcesses("tcp");
  }
  unsetenv("EMBER_TCP_SHM");
  unsetenv("EMBER_TCP_DIRECT");
}

// The shared fault case (distributed/testing/process_group_suite.h) over
// shared memory ("1") or sockets ("0").
void ExpectSurvivorsFail(int fault, const char* shm) {
  setenv("EMBER_TCP_SHM", shm, 1);
  testing::ExpectSurvivorsFail("tcp", fault);
  unsetenv("EMBER_TCP_SHM");
}

TEST(TcpFaultTest, SigkillMidAllReduceOverSharedMemory) { ExpectSurvivorsFail(SIGKILL, "1"); }
TEST(TcpFaultTest, SigkillMidAllReduceOverSockets) { ExpectSurvivorsFail(SIGKILL, "0"); }
TEST(TcpFaultTest, SigstopMidAllReduceOverSharedMemory) { ExpectSurvivorsFail(SIGSTOP, "1"); }
TEST(TcpFaultTest, SigstopMidAllReduceOverSockets) { ExpectSurvivorsFail(SIGSTOP, "0"); }

}  // namespace
}  // namespace ember::distributed::tcp
