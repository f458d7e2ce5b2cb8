// The launcher's failure summary pieces: process states and caught signals
// read from /proc of real processes, the stderr tail, error files written by
// distributed/error_file.h, and the summary's order (root cause first).
#include "tools/launch/failure_report.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "distributed/error_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(FailureReportTest, ProcessStatesOfRealProcesses) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ProcessState(child), "sleeping");
  kill(child, SIGSTOP);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ProcessState(child), "stopped (SIGSTOP or a debugger)");
  kill(child, SIGKILL);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ProcessState(child), "zombie");
  waitpid(child, nullptr, 0);
  EXPECT_EQ(ProcessState(child), "gone");
}

TEST(FailureReportTest, CatchesSignalReadsTheHandlerMask) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGUSR2, [](int) {});
    signal(SIGUSR1, SIG_DFL);
    pause();
    _exit(0);
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(CatchesSignal(child, SIGUSR2));
  EXPECT_FALSE(CatchesSignal(child, SIGUSR1));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

TEST(FailureReportTest, OutputTailKeepsTheLastLines) {
  OutputTail tail(2);
  tail.Add("one\ntw");
  tail.Add("o\nthree\nfour");
  EXPECT_THAT(tail.Lines(), ElementsAre("three", "four"));
  tail.Add("\n");
  EXPECT_THAT(tail.Lines(), ElementsAre("three", "four"));
}

TEST(FailureReportTest, ReadsTheErrorFileThatRecordWrites) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/error.json");
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  const int code = distributed::record([]() -> absl::Status {
    return absl::DeadlineExceededError("all_reduce (collective #3): timed out \"waiting\"\nfor rank 1");
  });
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(code, 1);
  std::optional<std::string> message = ReadErrorFile(path);
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(*message,
            "DEADLINE_EXCEEDED: all_reduce (collective #3): timed out \"waiting\"\nfor rank 1");
  // No stack, so no py_callstack: torchrun's summary would show an empty
  // traceback in place of the message.
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_THAT(text.str(), ::testing::Not(HasSubstr("py_callstack")));
  EXPECT_THAT(text.str(), HasSubstr("\"extraInfo\": {\"timestamp\": \""));
  EXPECT_FALSE(ReadErrorFile(path + ".absent").has_value());
}

TEST(FailureReportTest, AFatalSignalLeavesTheSignalAndAStack) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/fatal.json");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit no_core{0, 0};  // a core file would only slow the test
    setrlimit(RLIMIT_CORE, &no_core);
    setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
    distributed::record([]() -> absl::Status {
      raise(SIGSEGV);
      return absl::OkStatus();
    });
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  std::optional<std::string> message = ReadErrorFile(path);
  ASSERT_TRUE(message.has_value());
  EXPECT_THAT(*message, StartsWith(absl::StrCat("the process was killed by signal SIGSEGV (pid ",
                                                child, ")\n#0 0x")));
}

TEST(FailureReportTest, TheSummaryPutsTheRootCauseFirst) {
  WorkerReport first{.rank = 0, .local_rank = 0, .host = "n1", .pid = 40,
                     .outcome = "exited with code 1",
                     .when = absl::FromUnixSeconds(1764097200),
                     .message = "all_reduce timed out waiting for rank 1",
                     .message_source = "error file"};
  WorkerReport other{.rank = 1, .local_rank = 1, .host = "n1", .pid = 41,
                     .outcome = "stopped (SIGSTOP or a debugger)"};
  flight::Verdict verdict;
  verdict.diverged = true;
  verdict.culprits = {1};
  verdict.text = "all_reduce #1 (group 0, 32 B float32): rank 0 entered it; rank 1 never did";
  std::vector<std::string> lines = FailureSummary(first, {other}, verdict, "/tmp/d");
  const std::string text = absl::StrJoin(lines, "\n");
  EXPECT_EQ(lines[1],
            "root cause: rank 1 (flight recorder): all_reduce #1 (group 0, 32 B float32): rank 0 "
            "entered it; rank 1 never did");
  EXPECT_EQ(lines[2],
            "first failure: rank 0 (local_rank 0, pid 40 on n1) exited with code 1 at "
            "2025-11-25T19:00:00.000Z");
  EXPECT_THAT(text, HasSubstr("message (error file):\n    all_reduce timed out waiting for rank 1"));
  EXPECT_THAT(text, HasSubstr("rank 1 (local_rank 1, pid 41 on n1): stopped (SIGSTOP"));
  // Without a verdict the first failure is the root cause.
  lines = FailureSummary(first, {}, std::nullopt);
  EXPECT_EQ(lines[1], "root cause: rank 0 (local_rank 0, pid 40 on n1) exited with code 1");
  // Dumps that could not be read are said to be so, not passed over.
  lines = FailureSummary(first, {}, std::nullopt, "/tmp/d", "/tmp/d/fr_1: no 'end' line");
  EXPECT_EQ(lines[1], "root cause: rank 0 (local_rank 0, pid 40 on n1) exited with code 1");
  EXPECT_EQ(lines[lines.size() - 2],
            "flight recorder (/tmp/d): the dumps could not be read: /tmp/d/fr_1: no 'end' line");
}

TEST(FailureReportTest, ASigkilledRankIsTheRootCauseWhenTheDumpsBlameTheRankWaitingForIt) {
  WorkerReport killed{.rank = 3, .local_rank = 1, .host = "n2", .pid = 50,
                      .outcome = "was killed by signal 9 (SIGKILL)",
                      .when = absl::FromUnixSeconds(1764097200),
                      .signal = SIGKILL};
  flight::Verdict verdict;
  verdict.diverged = true;
  verdict.culprits = {2};
  verdict.text = "all_reduce #3 (group 0, 32 B float32): every rank with a dump here entered it; "
                 "rank 2 did not finish it";
  std::vector<std::string> lines = FailureSummary(killed, {}, verdict);
  EXPECT_EQ(lines[1],
            "root cause: rank 3 (local_rank 1, pid 50 on n2) was killed by signal 9 (SIGKILL)");
  // A verdict that names the killed rank itself stands.
  verdict.culprits = {3};
  lines = FailureSummary(killed, {}, verdict);
  EXPECT_THAT(lines[1], StartsWith("root cause: rank 3 (flight recorder)"));
}

}  // namespace
}  // namespace ember::launch
