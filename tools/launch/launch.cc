// launch: starts the workers of a distributed job on this node and supervises
// them (torch.distributed.launch for any program). See launch_options.h for
// the command line and the environment each worker gets.
//
// Supervision (Note [Launcher supervision]):
// - The launcher waits on a signalfd for SIGCHLD, SIGINT, SIGTERM and SIGHUP;
//   it runs no other threads, so a worker's PR_SET_PDEATHSIG (SIGKILL) fires
//   exactly when the launcher dies, however it dies.
// - Each worker leads a process group of its own, and every signal the
//   launcher sends goes to the whole group, so the processes a worker starts
//   (data loaders, compilers, shells) stop with it, as under PyTorch's
//   elastic agent. The launcher is also a child subreaper: what a dying
//   worker leaves behind is re-parented to it and reaped, so "the group is
//   empty" is something it can wait for. A process that leaves its group
//   (setsid, setpgid) is on its own.
// - The first worker to fail (non-zero exit code, or killed by a signal)
//   stops the others: SIGTERM to every worker's group (the failed one's too),
//   then SIGKILL to the groups not yet empty after --stop_grace. The launcher
//   then exits with that worker's exit code (128 + signal for a signal) after
//   a message naming its rank, local rank, pid and code or signal.
// - With --max_restarts=R, a failed attempt stops every worker group and
//   starts them all again, up to R times; TORCHELASTIC_RESTART_COUNT tells
//   workers which attempt they are.
// - SIGINT, SIGTERM and SIGHUP are forwarded to every worker group; the
//   launcher then waits for them (SIGKILL after the grace, or on a second
//   signal) and exits with 128 + the signal.
// - When every worker succeeded, processes still left in their groups get the
//   same SIGTERM and grace before the launcher exits.
// - With --serve_store, node 0's launcher serves the job's TcpStore on
//   master_port, a fresh one for every attempt so that a restarted job does
//   not meet the keys of the failed one.
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"
#include "tools/launch/launch_options.h"
#include "tools/version.h"

namespace ember::launch {
namespace {

void Say(const std::string& message) { std::fprintf(stderr, "launch: %s\n", message.c_str()); }

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

// The executable `program` names, searched on PATH when it has no '/'.
std::optional<std::string> Resolve(const std::string& program) {
  auto executable = [](const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return program;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", program);
    if (executable(candidate)) return candidate;
  }
  return std::nullopt;
}

struct Worker {
  WorkerSpec spec;
  pid_t pid = -1;  // also its process group's id
  bool running = false;
};

// Whether the process group `pgid` still has a member.
bool GroupAlive(pid_t pgid) { return kill(-pgid, 0) == 0 || errno == EPERM; }

// How long to wait for groups to empty after SIGKILL before giving up on them
// (a process in uninterruptible sleep dies only when it wakes).
constexpr absl::Duration kAfterKill = absl::Seconds(5);

class Supervisor {
 public:
  Supervisor(LaunchOptions options, std::string executable, int signal_fd)
      : options_(std::move(options)), executable_(std::move(executable)), signal_fd_(signal_fd) {}

  // Runs every attempt; returns the launcher's exit code.
  int Run() {
    bool omp_set = std::getenv("OMP_NUM_THREADS") != nullptr;
    if (!omp_set && options_.nproc_per_node > 1) {
      Say("OMP_NUM_THREADS is unset; each worker gets OMP_NUM_THREADS=1 so that " +
          std::to_string(options_.nproc_per_node) +
          " workers do not oversubscribe the cores. Set it to tune.");
    }
    for (int attempt = 0;; ++attempt) {
      workers_.clear();
      if (options_.serve_store && options_.node_rank == 0) {
        store_server_.reset();  // the previous attempt's keys go with it
        absl::StatusOr<std::unique_ptr<distributed::TcpStoreServer>> server =
            distributed::TcpStoreServer::start({.port = options_.master_port});
        if (!server.ok()) {
          Say(absl::StrCat("--serve_store: ", std::string(server.status().message())));
          return 1;
        }
        store_server_ = std::move(*server);
      }
      for (int local = 0; local < options_.nproc_per_node; ++local) {
        Worker worker;
        worker.spec = MakeWorkerSpec(options_, local, attempt, omp_set);
        if (!Start(worker)) {
          StopAll();
          return 1;
        }
        workers_.push_back(std::move(worker));
      }
      Outcome outcome = Supervise();
      if (outcome.kind == Outcome::kAllSucceeded) {
        StopAll();  // what the workers left in their groups
        return 0;
      }
      if (outcome.kind == Outcome::kSignalled) {
        Say(absl::StrCat("received ", SignalName(outcome.code),
                         "; forwarded it to the workers and stopped them"));
        return 128 + outcome.code;
      }
      if (attempt < options_.max_restarts) {
        Say(absl::StrCat(outcome.description, "; restarting all workers (restart ", attempt + 1,
                         " of ", options_.max_restarts, ")"));
        continue;
      }
      Say(absl::StrCat(outcome.description, "; stopped the other workers",
                       options_.max_restarts > 0
                           ? absl::StrCat(" (no restarts left of ", options_.max_restarts, ")")
                           : ""));
      return outcome.code;
    }
  }

 private:
  struct Outcome {
    enum Kind { kAllSucceeded, kWorkerFailed, kSignalled } kind;
    int code = 0;  // exit code for kWorkerFailed, signal for kSignalled
    std::string description;
  };

  bool Start(Worker& worker) {
    // Everything the child needs is built before fork: with --serve_store the
    // launcher runs gRPC threads, and a forked child may only make
    // async-signal-safe calls.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view entry(*e);
      std::string name(entry.substr(0, entry.find('=')));
      if (!worker.spec.env.contains(name)) env_strings.emplace_back(entry);
    }
    for (const auto& [name, value] : worker.spec.env) env_strings.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (std::string& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (std::string& arg : worker.spec.argv) argv.push_back(arg.data());
    argv.push_back(nullptr);
    std::string exec_failed = absl::StrCat("launch: cannot run ", executable_, "\n");
    sigset_t none;
    sigemptyset(&none);

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      Say(absl::StrCat("fork failed: ", strerror(errno)));
      return false;
    }
    if (pid == 0) {
      // A process group of its own, which the launcher signals as a whole.
      setpgid(0, 0);
      // Die with the launcher; close the race with a launcher that died
      // before the prctl.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execve(executable_.c_str(), argv.data(), envp.data());
      (void)!write(2, exec_failed.data(), exec_failed.size());
      _exit(127);
    }
    // Also here, so that the group exists before any signal is sent to it
    // (whichever of the two calls runs first wins; the other is a no-op or
    // fails harmlessly after the exec).
    setpgid(pid, pid);
    worker.pid = pid;
    worker.running = true;
    return true;
  }

  std::string Describe(const Worker& worker, int status) const {
    std::string who = absl::StrCat("worker rank ", worker.spec.rank, " (local_rank ",
                                   worker.spec.local_rank, ", pid ", worker.pid, ")");
    if (WIFSIGNALED(status))
      return absl::StrCat(who, " was killed by signal ", WTERMSIG(status), " (",
                          SignalName(WTERMSIG(status)), ")");
    return absl::StrCat(who, " exited with code ", WEXITSTATUS(status));
  }

  // Reaps exited workers (and whatever else was re-parented to the launcher);
  // returns the first failure among the workers, if any.
  std::optional<Outcome> Reap() {
    std::optional<Outcome> failure;
    while (true) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (Worker& worker : workers_) {
        if (worker.pid != pid || !worker.running) continue;
        worker.running = false;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !failure) {
          failure = Outcome{Outcome::kWorkerFailed,
                            WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status),
                            Describe(worker, status)};
        }
      }
    }
    return failure;
  }

  int Running() const {
    int n = 0;
    for (const Worker& worker : workers_) n += worker.running;
    return n;
  }

  // The next signal, or nullopt after `wait`.
  std::optional<int> NextSignal(absl::Duration wait) {
    pollfd p = {signal_fd_, POLLIN, 0};
    int ms =
        wait == absl::InfiniteDuration() ? -1 : static_cast<int>(absl::ToInt64Milliseconds(wait));
    if (poll(&p, 1, ms) <= 0) return std::nullopt;
    signalfd_siginfo info;
    if (read(signal_fd_, &info, sizeof(info)) != sizeof(info)) return std::nullopt;
    return static_cast<int>(info.ssi_signo);
  }

  // Whether a worker runs or its group still has a member.
  bool AnyAlive() const {
    for (const Worker& worker : workers_) {
      if (worker.running || GroupAlive(worker.pid)) return true;
    }
    return false;
  }

  // Sends `sig` to every worker's process group that still has a member.
  void SendAll(int sig) {
    for (const Worker& worker : workers_) {
      if (worker.running || GroupAlive(worker.pid)) kill(-worker.pid, sig);
    }
  }

  // SIGTERM (or `first`) to every worker group, then SIGKILL after the grace
  // or on a further signal; returns once every group is empty (or
  // kAfterKill after the SIGKILL).
  void StopAll(int first = SIGTERM) {
    if (!AnyAlive()) return;
    SendAll(first);
    absl::Time deadline = absl::Now() + options_.stop_grace;
    bool killed = false;
    while (true) {
      Reap();
      if (!AnyAlive()) return;
      if (absl::Now() >= deadline) {
        if (killed) {
          Say("some processes of the workers' groups survived SIGKILL; leaving them");
          return;
        }
        SendAll(SIGKILL);
        killed = true;
        deadline = absl::Now() + kAfterKill;
      }
      std::optional<int> sig = NextSignal(absl::Milliseconds(20));
      if (sig && *sig != SIGCHLD && !killed) {
        SendAll(SIGKILL);
        killed = true;
        deadline = absl::Now() + kAfterKill;
      }
    }
  }

  Outcome Supervise() {
    while (true) {
      if (std::optional<Outcome> failure = Reap()) {
        StopAll();
        return *failure;
      }
      if (Running() == 0) return Outcome{Outcome::kAllSucceeded, 0, ""};
      std::optional<int> sig = NextSignal(absl::Seconds(1));
      if (sig && *sig != SIGCHLD) {
        StopAll(*sig);
        return Outcome{Outcome::kSignalled, *sig, ""};
      }
    }
  }

  const LaunchOptions options_;
  const std::string executable_;
  const int signal_fd_;
  std::vector<Worker> workers_;
  std::unique_ptr<distributed::TcpStoreServer> store_server_;  // --serve_store
};

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--version") {
    std::printf("%s\n", tools::version_line("launch").c_str());
    return 0;
  }
  absl::StatusOr<LaunchOptions> options = ParseLaunchArgs(args);
  if (!options.ok()) {
    if (absl::StrContains(options.status().message(), "help requested")) {
      std::printf("%s\n", Usage().c_str());
      return 0;
    }
    std::fprintf(stderr, "%s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  std::optional<std::string> executable = Resolve(options->program[0]);
  if (!executable) {
    Say(absl::StrCat("cannot run '", options->program[0], "': no such executable file",
                     options->program[0].find('/') == std::string::npos ? " on PATH" : ""));
    return 2;
  }
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  // Orphans of the workers come to the launcher, which reaps them (Note
  // [Launcher supervision]).
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  int signal_fd = signalfd(-1, &handled, SFD_CLOEXEC);
  if (signal_fd < 0) {
    Say(absl::StrCat("signalfd failed: ", strerror(errno)));
    return 1;
  }
  Supervisor supervisor(*std::move(options), *std::move(executable), signal_fd);
  return supervisor.Run();
}

}  // namespace
}  // namespace ember::launch

int main(int argc, char** argv) { return ember::launch::Main(argc, argv); }
