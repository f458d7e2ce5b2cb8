#include "multiprocessing/process.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;

// Spawned children of this binary run their entry point here, before any
// test (gtest_main owns main()).
class SpawnedChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { maybe_run_spawned_child(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SpawnedChildEnvironment);

absl::Status EchoArgsEntry(int rank, absl::Span<const Value> args) {
  if (args.size() != 2 || args[0].as<std::string>().value_or("") != "alpha" ||
      args[1].as<std::string>().value_or("") != "beta gamma") {
    return absl::InvalidArgumentError("arguments did not arrive intact");
  }
  if (rank == 1) return absl::FailedPreconditionError("rank 1 refuses");
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("echo_args", EchoArgsEntry);

// A fresh process whose $EMBER_SHM_MANAGER points nowhere.
absl::Status ShareWithoutManagerEntry(int, absl::Span<const Value>) {
  EMBER_RETURN_IF_ERROR(set_sharing_strategy("file_system"));
  return share_memory_(ones({16}));
}
EMBER_REGISTER_ENTRY_POINT("share_without_manager", ShareWithoutManagerEntry);

// True when `pid` is gone or a zombie (dead, not yet reaped by its parent).
bool IsDead(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

SpawnOptions Options(absl::Duration timeout, absl::Duration grace = absl::Seconds(1)) {
  SpawnOptions o;
  o.timeout = timeout;
  o.terminate_grace = grace;
  return o;
}

TEST(ProcessTest, ReportsExitCodeAndFailureMessage) {
  absl::StatusOr<Process> ok = Process::start([] { return absl::OkStatus(); });
  ASSERT_TRUE(ok.ok());
  absl::StatusOr<ExitStatus> e = ok->join(absl::Seconds(10));
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->ok());

  absl::StatusOr<Process> bad =
      Process::start([] { return absl::InvalidArgumentError("bad batch size 0"); });
  ASSERT_TRUE(bad.ok());
  e = bad->join(absl::Seconds(10));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->exit_code, 1);
  EXPECT_EQ(e->str(), "exit code 1");
  EXPECT_EQ(bad->error_message(), "bad batch size 0");

  absl::StatusOr<Process> thrower =
      Process::start([]() -> absl::Status { throw std::runtime_error("shape mismatch"); });
  ASSERT_TRUE(thrower.ok());
  ASSERT_TRUE(thrower->join(absl::Seconds(10)).ok());
  EXPECT_THAT(thrower->error_message(), HasSubstr("shape mismatch"));
}

TEST(ProcessTest, ReportsTheKillingSignal) {
  absl::StatusOr<Process> p = Process::start([] {
    ::raise(SIGSEGV);
    return absl::OkStatus();
  });
  ASSERT_TRUE(p.ok());
  absl::StatusOr<ExitStatus> e = p->join(absl::Seconds(10));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->signal, SIGSEGV);
  EXPECT_EQ(e->str(), "signal SIGSEGV");
}

TEST(ProcessTest, JoinTimesOutThenKillWorks) {
  absl::StatusOr<Process> p = Process::start([] {
    absl::SleepFor(absl::Seconds(30));
    return absl::OkStatus();
  });
  ASSERT_TRUE(p.ok());
  absl::StatusOr<ExitStatus> e = p->join(absl::Milliseconds(50));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(p->is_alive());
  p->kill();
  e = p->join(absl::Seconds(10));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->signal, SIGKILL);
  EXPECT_FALSE(p->is_alive());
}

TEST(ProcessTest, ChildrenDieWithTheirParent) {
  auto pipe = Pipe();
  ASSERT_TRUE(pipe.ok());
  absl::StatusOr<Process> parent = Process::start([&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(Process grandchild, Process::start([] {
                             absl::SleepFor(absl::Seconds(60));
                             return absl::OkStatus();
                           }));
    EMBER_RETURN_IF_ERROR(pipe->second.send(Value(static_cast<int64_t>(grandchild.pid()))));
    absl::SleepFor(absl::Seconds(60));
    return absl::OkStatus();
  });
  ASSERT_TRUE(parent.ok());
  absl::StatusOr<Value> v = pipe->first.recv(absl::Seconds(10));
  ASSERT_TRUE(v.ok()) << v.status();
  pid_t grandchild = static_cast<pid_t>(*v->get_if<int64_t>());
  EXPECT_FALSE(IsDead(grandchild));
  parent->kill();
  ASSERT_TRUE(parent->join(absl::Seconds(10)).ok());
  EXPECT_TRUE(testing::WaitUntil([&] { return IsDead(grandchild); }, absl::Seconds(10)));
}

TEST(SpawnTest, AllRanksRunAndWriteSharedMemory) {
  Tensor seen = zeros({4}, kInt64);
  ASSERT_TRUE(share_memory_(seen).ok());
  absl::Status s = spawn(
      [&](int rank) {
        seen[rank].fill_(rank + 10);
        return absl::OkStatus();
      },
      4, Options(absl::Seconds(30)));
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 4; ++r) EXPECT_EQ(seen[r].item<int64_t>(), r + 10);
}

TEST(SpawnTest, AFailingRankStopsTheOthersAndIsNamed) {
  absl::Time start = absl::Now();
  absl::Status s = spawn(
      [](int rank) -> absl::Status {
        if (rank == 2) return absl::InternalError("loss is NaN at step 7");
        absl::SleepFor(absl::Seconds(60));
        return absl::OkStatus();
      },
      4, Options(absl::Seconds(120), absl::Milliseconds(200)));
  EXPECT_EQ(s.message(), "process 2 terminated with exit code 1: loss is NaN at step 7");
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(SpawnTest, TimeoutTerminatesEveryone) {
  absl::Status s = spawn(
      [](int) {
        absl::SleepFor(absl::Seconds(60));
        return absl::OkStatus();
      },
      2, Options(absl::Milliseconds(200), absl::Milliseconds(100)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("0, 1 still running"));
}

TEST(SpawnTest, RejectsNoProcesses) {
  EXPECT_EQ(spawn([](int) { return absl::OkStatus(); }, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spawn(nullptr, 2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpawnTest, ReExecRunsTheRegisteredEntryPoint) {
  SpawnOptions options = Options(absl::Seconds(30));
  options.start_method = StartMethod::kSpawn;
  options.entry_point = "echo_args";
  options.args = {"alpha", "beta gamma"};
  absl::Status s = spawn(nullptr, 2, options);
  EXPECT_EQ(s.message(), "process 1 terminated with exit code 1: rank 1 refuses");
}

TEST(SpawnTest, AMissingManagerBinaryIsNamed) {
  ::setenv("EMBER_SHM_MANAGER", "/nonexistent/shm_manager", 1);
  absl::StatusOr<Process> p = Process::start_spawn("share_without_manager", 0);
  ::unsetenv("EMBER_SHM_MANAGER");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->join(absl::Seconds(20)).ok());
  EXPECT_THAT(p->error_message(),
              HasSubstr("$EMBER_SHM_MANAGER='/nonexistent/shm_manager' is not an "
                        "executable file"));
}

TEST(SpawnTest, UnknownEntryPointIsNotFound) {
  absl::StatusOr<Process> p = Process::start_spawn("no_such_entry", 0);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("'no_such_entry'"));
}

}  // namespace
}  // namespace ember::multiprocessing
