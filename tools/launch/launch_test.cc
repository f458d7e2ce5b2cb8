// The launch binary end to end: it runs launch_test_worker (both are data of
// this test) and checks the environment the workers saw, fail-fast with the
// failing rank named, exit codes and signals, SIGTERM forwarding, workers
// dying with a SIGKILLed launcher, --max_restarts, usage errors, and a real
// env:// rendezvous between the workers.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

using ::ember::distributed::testing::FreePort;

using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, counter++);
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// A started launcher; its stderr goes to a file.
struct Launched {
  pid_t pid;
  std::string stderr_path;
};

Launched Start(std::vector<std::string> args) {
  static std::atomic<int> counter{0};
  Launched launched{-1, absl::StrCat(std::getenv("TEST_TMPDIR"), "/launch_stderr", counter++)};
  args.insert(args.begin(), Runfile("tools/launch/launch"));
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(launched.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    unsetenv("OMP_NUM_THREADS");
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(126);
  }
  launched.pid = pid;
  return launched;
}

// Waits for the launcher, up to `timeout`; SIGKILLs it and fails after that.
int Finish(const Launched& launched, absl::Duration timeout = absl::Seconds(40)) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(launched.pid, &status, WNOHANG) == launched.pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 1000 + WTERMSIG(status);
    }
    if (absl::Now() >= deadline) {
      kill(launched.pid, SIGKILL);
      waitpid(launched.pid, &status, 0);
      ADD_FAILURE() << "launch did not finish within " << timeout;
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string Worker() { return Runfile("tools/launch/launch_test_worker"); }

bool WaitForFiles(const std::vector<std::string>& paths, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    bool all = true;
    for (const std::string& path : paths) all = all && Exists(path) && !ReadFile(path).empty();
    if (all) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST(LaunchTest, EnvironmentMatchesPyTorchsLauncher) {
  std::string out = FreshDir("env");
  Launched launched =
      Start({"--nproc_per_node=3", "--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3",
             "--master_port", "1234", Worker(), "--mode=env", "--out=" + out});
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  for (int local = 0; local < 3; ++local) {
    std::string seen = ReadFile(absl::StrCat(out, "/rank", 3 + local));
    EXPECT_THAT(seen, HasSubstr("MASTER_ADDR=10.1.2.3\n"));
    EXPECT_THAT(seen, HasSubstr("MASTER_PORT=1234\n"));
    EXPECT_THAT(seen, HasSubstr("WORLD_SIZE=6\n"));
    EXPECT_THAT(seen, HasSubstr(absl::StrCat("\nRANK=", 3 + local, "\n")));
    EXPECT_THAT(seen, HasSubstr(absl::StrCat("\nLOCAL_RANK=", local, "\n")));
    EXPECT_THAT(seen, HasSubstr("LOCAL_WORLD_SIZE=3\n"));
    EXPECT_THAT(seen, HasSubstr("GROUP_RANK=1\n"));
    EXPECT_THAT(seen, HasSubstr("OMP_NUM_THREADS=1\n"));
    EXPECT_THAT(seen, HasSubstr("TORCHELASTIC_RESTART_COUNT=0\n"));
    // --local_rank comes first, then the program's own arguments.
    EXPECT_THAT(seen, HasSubstr(absl::StrCat("args=--local_rank=", local, " --mode=env --out=", out,
                                             "\n")));
  }
  EXPECT_FALSE(Exists(out + "/rank0")) << "node 1 must not start ranks 0..2";
}

TEST(LaunchTest, UseEnvPassesNoLocalRankArgument) {
  std::string out = FreshDir("use_env");
  Launched launched =
      Start({"--nproc_per_node=2", "--use_env", "--", Worker(), "--mode=env", "--out=" + out});
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  for (int rank = 0; rank < 2; ++rank) {
    std::string seen = ReadFile(absl::StrCat(out, "/rank", rank));
    EXPECT_THAT(seen, HasSubstr("--local_rank=<absent>\n"));
    EXPECT_THAT(seen, HasSubstr("MASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nWORLD_SIZE=2\n"));
  }
}

TEST(LaunchTest, FailingWorkerStopsTheOthersAndIsNamed) {
  absl::Time start = absl::Now();
  Launched launched =
      Start({"--nproc_per_node=3", Worker(), "--mode=fail", "--fail_rank=1", "--code=7"});
  EXPECT_EQ(Finish(launched), 7);
  // The others sleep for a minute unless stopped.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  std::string err = ReadFile(launched.stderr_path);
  EXPECT_THAT(err, HasSubstr("worker rank 1 (local_rank 1, pid "));
  EXPECT_THAT(err, HasSubstr("exited with code 7; stopped the other workers"));
}

TEST(LaunchTest, WorkerKilledBySignalIsNamed) {
  Launched launched =
      Start({"--nproc_per_node=2", Worker(), "--mode=fail", "--fail_rank=0", "--code=kill"});
  EXPECT_EQ(Finish(launched), 128 + SIGKILL);
  EXPECT_THAT(ReadFile(launched.stderr_path), HasSubstr("worker rank 0 (local_rank 0, pid "));
  EXPECT_THAT(ReadFile(launched.stderr_path), HasSubstr("was killed by signal 9 (SIGKILL)"));
}

TEST(LaunchTest, SigtermIsForwardedToEveryWorker) {
  std::string out = FreshDir("sigterm");
  Launched launched = Start({"--nproc_per_node=2", Worker(), "--mode=sleep", "--out=" + out});
  ASSERT_TRUE(WaitForFiles({out + "/pid0", out + "/pid1"}, absl::Seconds(20)));
  kill(launched.pid, SIGTERM);
  EXPECT_EQ(Finish(launched), 128 + SIGTERM);
  EXPECT_TRUE(Exists(out + "/sigterm0"));
  EXPECT_TRUE(Exists(out + "/sigterm1"));
  EXPECT_THAT(ReadFile(launched.stderr_path), HasSubstr("received SIGTERM"));
}

// Whether `pid` is gone (or a zombie nobody has reaped yet).
bool Gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// The pids the "grandchild" workers wrote for `attempt`, for ranks 0..n-1.
std::vector<pid_t> Grandchildren(const std::string& out, int n, int attempt) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = std::atoi(ReadFile(absl::StrCat(out, "/grandchild", rank, "_", attempt)).c_str());
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

// Expects every pid in `pids` to be gone within a few seconds; kills the
// survivors so that a failing test leaves nothing behind.
void ExpectAllGone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!Gone(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_TRUE(Gone(pid)) << "grandchild " << pid << " outlived its worker";
    if (!Gone(pid)) kill(pid, SIGKILL);
  }
}

TEST(LaunchTest, SigtermStopsTheWorkersChildrenToo) {
  std::string out = FreshDir("grandchild_sigterm");
  Launched launched = Start({"--nproc_per_node=2", Worker(), "--mode=grandchild", "--out=" + out});
  ASSERT_TRUE(WaitForFiles({out + "/grandchild0_0", out + "/grandchild1_0"}, absl::Seconds(20)));
  kill(launched.pid, SIGTERM);
  EXPECT_EQ(Finish(launched), 128 + SIGTERM);
  std::vector<pid_t> grandchildren = Grandchildren(out, 2, 0);
  ASSERT_EQ(grandchildren.size(), 2u);
  ExpectAllGone(grandchildren);
}

TEST(LaunchTest, AFailingWorkerStopsEveryWorkersChildren) {
  std::string out = FreshDir("grandchild_fail");
  Launched launched = Start({"--nproc_per_node=3", Worker(), "--mode=grandchild", "--fail_rank=1",
                             "--code=7", "--out=" + out});
  EXPECT_EQ(Finish(launched), 7) << ReadFile(launched.stderr_path);
  std::vector<pid_t> grandchildren = Grandchildren(out, 3, 0);
  ASSERT_EQ(grandchildren.size(), 3u);
  ExpectAllGone(grandchildren);  // the failed worker's own child too
}

TEST(LaunchTest, ARestartStartsAfterTheFailedAttemptsChildrenAreGone) {
  std::string out = FreshDir("grandchild_restart");
  Launched launched = Start({"--nproc_per_node=2", "--max_restarts=1", Worker(),
                             "--mode=grandchild", "--fail_rank=0", "--code=5", "--out=" + out});
  EXPECT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(ReadFile(absl::StrCat(out, "/check", rank)), "gone");
  ExpectAllGone(Grandchildren(out, 2, 0));
}

TEST(LaunchTest, WorkersDieWithTheLauncher) {
  // Orphaned workers are re-parented to this test, so it can see how they died.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  std::string out = FreshDir("orphans");
  Launched launched = Start({"--nproc_per_node=2", Worker(), "--mode=sleep", "--out=" + out});
  ASSERT_TRUE(WaitForFiles({out + "/pid0", out + "/pid1"}, absl::Seconds(20)));
  kill(launched.pid, SIGKILL);
  EXPECT_EQ(Finish(launched), 1000 + SIGKILL);
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = std::atoi(ReadFile(absl::StrCat(out, "/pid", rank)).c_str());
    ASSERT_GT(pid, 0);
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    pid_t reaped = 0;
    while ((reaped = waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(reaped, pid) << "worker " << rank << " outlived the launcher";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    EXPECT_FALSE(Exists(absl::StrCat(out, "/sigterm", rank)));
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(LaunchTest, MaxRestartsRestartsAFailedAttempt) {
  Launched restarted = Start({"--nproc_per_node=2", "--max_restarts=1", Worker(), "--mode=flaky"});
  EXPECT_EQ(Finish(restarted), 0) << ReadFile(restarted.stderr_path);
  EXPECT_THAT(ReadFile(restarted.stderr_path),
              HasSubstr("restarting all workers (restart 1 of 1)"));

  Launched no_restarts = Start({"--nproc_per_node=2", Worker(), "--mode=flaky"});
  EXPECT_EQ(Finish(no_restarts), 5);
  EXPECT_THAT(ReadFile(no_restarts.stderr_path), HasSubstr("exited with code 5"));
}

// Python programs as torchrun runs them: `python3 -u script`, `-m module`,
// and --no-python for a script that is its own executable.
TEST(LaunchTest, RunsPythonScriptsAndModulesAsTorchrunDoes) {
  if (std::system("python3 -c pass 2>/dev/null") != 0) GTEST_SKIP() << "no python3 on PATH";
  std::string out = FreshDir("python");
  const std::string script = out + "/train.py";
  {
    std::ofstream py(script);
    py << "import os, sys\n"
       << "path = os.path.join(" << '"' << out << '"' << ", 'rank' + os.environ['RANK'])\n"
       << "open(path, 'w').write(' '.join([os.environ['WORLD_SIZE'], str(int('-u' in sys.orig_argv)),"
       << " os.path.basename(sys.argv[0])] + sys.argv[1:]))\n";
  }
  Launched launched = Start({"--nproc_per_node=2", "--use_env", script, "--lr=0.1"});
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(ReadFile(absl::StrCat(out, "/rank", rank)), "2 1 train.py --lr=0.1");

  // -m: a module on PYTHONPATH (the launcher passes its environment on).
  std::string module_dir = FreshDir("module");
  {
    std::ofstream py(module_dir + "/ember_launch_probe.py");
    py << "import os, sys\n"
       << "open(os.path.join(" << '"' << module_dir << '"'
       << ", 'rank' + os.environ['RANK']), 'w').write(' '.join(sys.argv[1:]))\n";
  }
  setenv("PYTHONPATH", module_dir.c_str(), 1);
  launched = Start({"--nproc_per_node=2", "-m", "ember_launch_probe", "--epochs=3"});
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  unsetenv("PYTHONPATH");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ReadFile(absl::StrCat(module_dir, "/rank", rank)),
              absl::StrCat("--local_rank=", rank, " --epochs=3"));
  }

  // --no-python: the script is run as it is (here it is not executable).
  launched = Start({"--no-python", script});
  EXPECT_EQ(Finish(launched), 2);
  EXPECT_THAT(ReadFile(launched.stderr_path), HasSubstr("cannot run"));
  launched = Start({"--nproc_per_node=1", out + "/missing.py"});
  EXPECT_EQ(Finish(launched), 2);
  EXPECT_THAT(ReadFile(launched.stderr_path), HasSubstr("missing.py"));
}

TEST(LaunchTest, UsageErrorsNameTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  std::vector<Case> cases = {
      {{"--nproc_per_node=2"}, "no program to launch"},
      {{"--nproc_per_node=0", "true"}, "--nproc_per_node=0 is not an integer in [1, 4096]"},
      {{"--nnodes=2", "--node_rank=2", "true"}, "--node_rank=2 is not in [0, --nnodes=2)"},
      {{"--master_port=70000", "true"}, "--master_port=70000"},
      {{"--colour=red", "true"}, "unknown option --colour"},
      {{"--master_addr"}, "--master_addr needs a value"},
      {{"no-such-program-anywhere"}, "cannot run 'no-such-program-anywhere'"},
      {{"-m", "--no-python", "pkg"}, "-m and --no-python exclude each other"},
  };
  for (const Case& c : cases) {
    Launched launched = Start(c.args);
    EXPECT_EQ(Finish(launched), 2) << c.expected;
    EXPECT_THAT(ReadFile(launched.stderr_path), HasSubstr(c.expected));
  }
}

TEST(LaunchTest, WorkersRendezvousThroughEnv) {
  std::string out = FreshDir("rendezvous");
  Launched launched = Start({"--nproc_per_node=3", absl::StrCat("--master_port=", FreePort()),
                             "--use_env", Worker(), "--mode=rendezvous", "--out=" + out});
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(ReadFile(absl::StrCat(out, "/joined", rank)), "3");
}

TEST(LaunchTest, ServeStoreOutlivesRankZero) {
  std::string out = FreshDir("serve_store");
  Launched launched = Start({"--nproc_per_node=3", absl::StrCat("--master_port=", FreePort()),
                             "--use_env", "--serve_store", Worker(), "--mode=rendezvous",
                             "--rank0_leaves_early=1", "--out=" + out});
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  for (int rank = 1; rank < 3; ++rank) EXPECT_EQ(ReadFile(absl::StrCat(out, "/joined", rank)), "3");
}

TEST(LaunchTest, ServeStoreGivesEachAttemptAFreshStore) {
  std::string out = FreshDir("serve_store_restart");
  Launched launched = Start({"--nproc_per_node=2", absl::StrCat("--master_port=", FreePort()),
                             "--use_env", "--serve_store", "--max_restarts=1", Worker(),
                             "--mode=flaky_rendezvous", "--out=" + out});
  // The second attempt's ranks would find the first's rank claims in a kept store.
  ASSERT_EQ(Finish(launched), 0) << ReadFile(launched.stderr_path);
  EXPECT_EQ(ReadFile(out + "/joined0"), "1");
  EXPECT_EQ(ReadFile(out + "/joined1"), "1");
}

TEST(LaunchTest, ServeStoreOnAPortInUseNamesThePort) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  Launched launched = Start({absl::StrCat("--master_port=", port), "--serve_store", "true"});
  EXPECT_EQ(Finish(launched), 1);
  EXPECT_THAT(ReadFile(launched.stderr_path),
              HasSubstr(absl::StrCat("port ", port, " is already in use")));
  close(fd);
}

}  // namespace
}  // namespace ember::launch
