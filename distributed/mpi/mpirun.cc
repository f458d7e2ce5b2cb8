#include "distributed/mpi/mpirun.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/mpi/runtime.h"

extern char** environ;

namespace ember::distributed::mpi {
namespace {

// Variables of the Bazel test that the ranks must not inherit: each would
// write its own report over the test's.
constexpr const char* kDropped[] = {
    "XML_OUTPUT_FILE=",          "GTEST_OUTPUT=",      "TEST_PREMATURE_EXIT_FILE=",
    "TEST_TOTAL_SHARDS=",        "TEST_SHARD_INDEX=",  "TEST_SHARD_STATUS_FILE=",
    "GTEST_TOTAL_SHARDS=",       "GTEST_SHARD_INDEX=", "TMPDIR=",
    "EMBER_TEST_JOB_START_MPI=",
};

// Inside a job this helper started, every process starts MPI as the
// program starts: MPI_Init is collective over the whole job, and a process
// beyond a test's world size would otherwise never call it.
const bool kStartedMpi = [] {
  const char* job = std::getenv("EMBER_TEST_JOB_STORE");
  const char* start = std::getenv("EMBER_TEST_JOB_START_MPI");
  if (job == nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return false;
  if (start != nullptr && std::string(start) == "0") return false;
  const absl::Status s = EnsureMpi();
  if (!s.ok()) fprintf(stderr, "%s\n", s.ToString().c_str());
  return s.ok();
}();

std::string SelfPath() {
  char path[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : std::string();
}

}  // namespace

MpirunResult RunThisTestUnderMpirun(int ranks, const std::string& gtest_filter,
                                    const MpirunOptions& options) {
  const absl::Duration timeout = options.timeout;
  MpirunResult result;
  // A short directory: Open MPI keeps its session sockets under TMPDIR, and
  // Unix socket paths are short.
  char templ[] = "/tmp/ember-mpirun-XXXXXX";
  const char* dir = mkdtemp(templ);
  if (dir == nullptr) {
    result.output = "could not create a directory under /tmp for the job";
    return result;
  }
  const std::string store = absl::StrCat(dir, "/store");
  const std::string log = absl::StrCat(dir, "/output");
  const int seconds = static_cast<int>(absl::ToInt64Seconds(timeout));

  std::vector<std::string> args = {"mpirun", "--oversubscribe", "--bind-to", "none", "-np",
                                   absl::StrCat(ranks),
                                   // Loopback only: shared memory between the ranks, TCP over lo.
                                   "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include",
                                   "lo", "--mca", "oob_tcp_if_include", "lo",
                                   // The shared-memory segments in this job's own directory:
                                   // in /dev/shm their names carry pids and job ids, which
                                   // jobs in separate pid namespaces (Bazel's sandboxes, run
                                   // side by side) share, and the jobs then map each other's.
                                   "--mca", "btl_vader_backing_directory", dir,
                                   // mpirun ends the job itself a little before the test gives up.
                                   "--timeout", absl::StrCat(std::max(seconds - 10, 10))};
  args.insert(args.end(), options.mpirun_args.begin(), options.mpirun_args.end());
  args.insert(args.end(), {SelfPath(), absl::StrCat("--gtest_filter=", gtest_filter)});
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool drop = false;
    for (const char* name : kDropped) drop |= absl::StartsWith(*e, name);
    if (!drop) env.push_back(*e);
  }
  env.push_back(absl::StrCat("TMPDIR=", dir));
  env.push_back(absl::StrCat("EMBER_TEST_JOB_STORE=", store));
  env.push_back(absl::StrCat("EMBER_TEST_JOB_START_MPI=", options.start_mpi ? 1 : 0));
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    execvpe("mpirun", argv.data(), envp.data());
    fprintf(stderr, "could not run mpirun (install Debian's openmpi-bin)\n");
    _exit(127);
  }
  setpgid(pid, pid);
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  bool signalled = false;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    const absl::Time now = absl::Now();
    if (now > deadline && !signalled) {
      result.timed_out = true;
      signalled = true;
      killpg(pid, SIGTERM);
    } else if (now > deadline + absl::Seconds(5)) {
      killpg(pid, SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  if (result.timed_out) absl::StrAppend(&result.output, "\n(mpirun stopped at the timeout)");
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return result;
}

}  // namespace ember::distributed::mpi
