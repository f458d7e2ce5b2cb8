// Ember's launch running PyTorch 2.x scripts (testdata/torch_env_rank.py):
// `launch --serve_store train.py` serves the job's store, PyTorch's env://
// connects every rank to it (TORCHELASTIC_USE_AGENT_STORE), and gloo
// all_reduces over it; without --serve_store PyTorch's rank 0 serves its
// own. Skips, saying why, where the PyTorch 2.x peer is not installed
// (tools/install_peers.sh).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/peers.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs launch with `args`, python3 being the peer's; its exit status and
// stderr.
std::pair<int, std::string> Launch(const std::string& python, std::vector<std::string> args) {
  const std::string err = absl::StrCat(std::getenv("TEST_TMPDIR"), "/launch_stderr");
  args.insert(args.begin(), Runfile("tools/launch/launch"));
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    const std::string bin = python.substr(0, python.rfind('/'));
    const char* path = std::getenv("PATH");
    setenv("PATH", absl::StrCat(bin, ":", path != nullptr ? path : "/usr/bin:/bin").c_str(), 1);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(126);
  }
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return {-1, "launch did not finish within 120 s\n" + ReadFile(err)};
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), ReadFile(err)};
}

void RunJob(bool serve_store) {
  absl::StatusOr<std::string> python = ember::testing::torch2_python();
  if (!python.ok()) GTEST_SKIP() << python.status().message();
  const std::string out =
      absl::StrCat(std::getenv("TEST_TMPDIR"), serve_store ? "/served" : "/own");
  mkdir(out.c_str(), 0755);
  std::vector<std::string> args = {"--nproc_per_node=3", "--use_env",
                                   absl::StrCat("--master_port=", distributed::testing::FreePort())};
  if (serve_store) args.push_back("--serve_store");
  args.push_back(Runfile("tools/launch/testdata/torch_env_rank.py"));
  args.push_back(out);
  auto [code, err] = Launch(*python, args);
  ASSERT_EQ(code, 0) << err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(ReadFile(absl::StrCat(out, "/rank", rank)), serve_store ? "6 True" : "6 ")
        << "rank " << rank;
  }
}

TEST(LaunchTorchTest, ServeStoreServesPyTorchRanks) { RunJob(true); }

TEST(LaunchTorchTest, PyTorchRankZeroServesItsOwnStoreWithoutServeStore) { RunJob(false); }

}  // namespace
}  // namespace ember::launch
