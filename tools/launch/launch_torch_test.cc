// Ember's launch and PyTorch 2.x's torchrun, each starting the other's
// programs. Ember's launch runs PyTorch scripts (testdata/torch_env_rank.py):
// `launch --serve_store train.py` serves the job's store, PyTorch's env://
// connects every rank to it (TORCHELASTIC_USE_AGENT_STORE), and gloo
// all_reduces over it; without --serve_store PyTorch's rank 0 serves its
// own. torchrun runs Ember programs (post_mortem_worker, --no-python): its
// agent serves the store, Ember's env:// connects every rank to it, the
// ranks all_reduce over tcp and gloo and check the sums, and a rank's
// failure reaches torchrun's summary through TORCHELASTIC_ERROR_FILE. Skips,
// saying why, where the PyTorch 2.x peer is not installed
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

// Runs `args` (a program and its arguments) with the peer's bin first on
// PATH; its exit status and stderr.
std::pair<int, std::string> Run(const std::string& python, std::vector<std::string> args) {
  const std::string err = absl::StrCat(std::getenv("TEST_TMPDIR"), "/stderr");
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
      return {-1, args[0] + " did not finish within 120 s\n" + ReadFile(err)};
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
  args.insert(args.begin(), Runfile("tools/launch/launch"));
  auto [code, err] = Run(*python, args);
  ASSERT_EQ(code, 0) << err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(ReadFile(absl::StrCat(out, "/rank", rank)), serve_store ? "6 True" : "6 ")
        << "rank " << rank;
  }
}

TEST(LaunchTorchTest, ServeStoreServesPyTorchRanks) { RunJob(true); }

TEST(LaunchTorchTest, PyTorchRankZeroServesItsOwnStoreWithoutServeStore) { RunJob(false); }

// torchrun --no-python on Ember's post_mortem_worker, 3 ranks.
std::pair<int, std::string> Torchrun(const std::string& python,
                                     const std::vector<std::string>& worker_args) {
  std::vector<std::string> args = {python,
                                   "-m",
                                   "torch.distributed.run",
                                   "--nproc_per_node=3",
                                   absl::StrCat("--master_port=", distributed::testing::FreePort()),
                                   "--no-python",
                                   Runfile("tools/launch/post_mortem_worker")};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return Run(python, args);
}

TEST(LaunchTorchTest, TorchrunStartsEmberRanksOnItsAgentsStore) {
  absl::StatusOr<std::string> python = ember::testing::torch2_python();
  if (!python.ok()) GTEST_SKIP() << python.status().message();
  for (const std::string backend : {"tcp", "gloo"}) {
    SCOPED_TRACE(backend);
    auto [code, err] = Torchrun(*python, {"--backend=" + backend});
    EXPECT_EQ(code, 0) << err;
  }
}

TEST(LaunchTorchTest, TorchrunReportsAnEmberRanksErrorFile) {
  absl::StatusOr<std::string> python = ember::testing::torch2_python();
  if (!python.ok()) GTEST_SKIP() << python.status().message();
  auto [code, err] = Torchrun(*python, {"--backend=tcp", "--fault=other_size", "--fault_rank=1"});
  EXPECT_NE(code, 0) << err;
  // torchrun's summary quotes the message Ember's record() wrote.
  EXPECT_THAT(err, ::testing::HasSubstr("ChildFailedError")) << err;
  EXPECT_THAT(err, ::testing::HasSubstr("mismatched collectives")) << err;
  EXPECT_THAT(err, ::testing::HasSubstr("error_file")) << err;
}

}  // namespace
}  // namespace ember::launch
