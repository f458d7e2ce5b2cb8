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
//   workers which attempt they are. With --replica_groups a failed worker is
//   restarted alone instead (Note [Replica groups]).
// - SIGINT, SIGTERM and SIGHUP are forwarded to every worker group; the
//   launcher then waits for them (SIGKILL after the grace, or on a second
//   signal) and exits with 128 + the signal.
// - When every worker succeeded, processes still left in their groups get the
//   same SIGTERM and grace before the launcher exits.
// - With --serve_store, node 0's launcher serves the job's TcpStore on
//   master_port, a fresh one for every attempt so that a restarted job does
//   not meet the keys of the failed one.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <dirent.h>
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
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"
#include "tools/launch/elastic_agent.h"
#include "tools/launch/failure_report.h"
#include "tools/launch/flight_analysis.h"
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
  // The read end of the worker's stderr, forwarded to the launcher's
  // (Note [Failure summary] in failure_report.cc); -1 once closed.
  int err_fd = -1;
  OutputTail tail;
  std::string error_file;  // its TORCHELASTIC_ERROR_FILE
  std::string outcome;     // how it ended, once reaped
  int signal = 0;          // the signal that killed it; 0 if it exited
  bool failed = false;     // it ended with a non-zero code or a signal
  int restarts = 0;        // --replica_groups: its own restarts so far
};

// Whether the process group `pgid` still has a member.
bool GroupAlive(pid_t pgid) { return kill(-pgid, 0) == 0 || errno == EPERM; }

// How long to wait for groups to empty after SIGKILL before giving up on them
// (a process in uninterruptible sleep dies only when it wakes).
constexpr absl::Duration kAfterKill = absl::Seconds(5);
// How long the survivors of a failure get to write their flight recorder
// dumps (Note [Failure summary]).
constexpr absl::Duration kDumpWait = absl::Seconds(1);

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
    if (options_.elastic()) return RunElastic(omp_set);
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
      MakeRunDir(attempt);
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
      CloseOutputs();
      if (outcome.kind == Outcome::kAllSucceeded) {
        StopAll();  // what the workers left in their groups
        RemoveRunDir();
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
    // kRoundChanged: an elastic round must restart for a reason outside
    // this node's workers (a node lost or waiting to join, another node
    // restarted the round).
    enum Kind { kAllSucceeded, kWorkerFailed, kSignalled, kRoundChanged } kind;
    int code = 0;  // exit code for kWorkerFailed, signal for kSignalled
    std::string description;
    size_t worker = 0;  // kWorkerFailed: which
    absl::Time when = absl::InfinitePast();
    bool scale_up = false;  // kRoundChanged: only nodes waiting to join
  };

  // Note [Elastic launch]
  // With --rdzv_endpoint the launcher runs rounds instead of attempts: each
  // round it joins the rendezvous (ElasticAgent), which gives this node its
  // rank among the round's nodes and the store its workers rendezvous
  // through, starts its workers with that world, and while they run checks
  // every --monitor_interval whether the round must end (a node lost, a node
  // waiting to join, another node restarted it). A local worker's failure
  // ends the round for every node. Failures and lost nodes count against
  // --max_restarts; a node waiting to join does not (torchrun's rule:
  // membership changes are not retries). When the restarts are used up the
  // launcher closes the rendezvous, so that the other nodes stop too.
  int RunElastic(bool omp_set) {
    absl::StatusOr<std::unique_ptr<ElasticAgent>> agent = ElasticAgent::create(
        {.endpoint_host = options_.rdzv_endpoint_host,
         .endpoint_port = options_.rdzv_endpoint_port,
         .run_id = options_.rdzv_id,
         .min_nodes = options_.min_nodes,
         .max_nodes = options_.max_nodes,
         .nproc_per_node = options_.nproc_per_node,
         .local_addr = options_.local_addr,
         .join_timeout = options_.rdzv_join_timeout,
         .last_call = options_.rdzv_last_call,
         .heartbeat_timeout = options_.rdzv_heartbeat_timeout});
    if (!agent.ok()) {
      Say(std::string(agent.status().message()));
      return 1;
    }
    ElasticAgent& a = **agent;
    Say(absl::StrCat("node ", a.node_id(), " joins rendezvous '", options_.rdzv_id, "' at ",
                     options_.rdzv_endpoint_host, ":", options_.rdzv_endpoint_port,
                     a.serves_endpoint() ? " (served here)" : "", " for ", options_.min_nodes,
                     " to ", options_.max_nodes, " nodes"));
    int restarts = 0;
    for (int attempt = 0;; ++attempt) {
      workers_.clear();
      absl::StatusOr<RoundSetup> round = a.NextRound();
      if (!round.ok()) {
        Say(absl::StrCat("node ", a.node_id(), ": ", round.status().message()));
        return 1;
      }
      Say(absl::StrCat("round ", round->round, ": node rank ", round->node_rank, " of ",
                       round->num_nodes, " nodes, world size ", round->world_size));
      LaunchOptions per_round = options_;
      per_round.nnodes = round->num_nodes;
      per_round.node_rank = round->node_rank;
      per_round.master_addr = round->master_addr;
      per_round.master_port = round->master_port;
      MakeRunDir(attempt);
      for (int local = 0; local < options_.nproc_per_node; ++local) {
        Worker worker;
        worker.spec = MakeWorkerSpec(per_round, local, restarts, omp_set);
        for (const auto& [name, value] : round->env) worker.spec.env[name] = value;
        if (!Start(worker)) {
          StopAll();
          a.Failed("a worker could not be started");
          return 1;
        }
        workers_.push_back(std::move(worker));
      }
      Outcome outcome = Supervise(&a);
      CloseOutputs();
      if (outcome.kind == Outcome::kSignalled) {
        a.Failed(absl::StrCat("its launcher received ", SignalName(outcome.code)));
        Say(absl::StrCat("received ", SignalName(outcome.code),
                         "; forwarded it to the workers and stopped them"));
        return 128 + outcome.code;
      }
      if (outcome.kind == Outcome::kAllSucceeded) {
        StopAll();
        absl::Status done = a.Succeeded();
        if (done.ok()) {
          RemoveRunDir();
          return 0;
        }
        if (done.code() != absl::StatusCode::kAborted) {
          Say(std::string(done.message()));
          return 1;
        }
        outcome = Outcome{Outcome::kRoundChanged, 1, std::string(done.message())};
      }
      const bool counts = !(outcome.kind == Outcome::kRoundChanged && outcome.scale_up);
      if (counts && restarts >= options_.max_restarts) {
        const std::string why =
            absl::StrCat(outcome.description, "; stopped the workers",
                         options_.max_restarts > 0
                             ? absl::StrCat(" (no restarts left of ", options_.max_restarts, ")")
                             : " (--max_restarts=0)");
        Say(why);
        a.Failed(why);
        return outcome.kind == Outcome::kWorkerFailed ? outcome.code : 1;
      }
      (void)a.Restart(outcome.description);
      if (counts) ++restarts;
      Say(absl::StrCat(outcome.description, "; starting a new round",
                       counts ? absl::StrCat(" (restart ", restarts, " of ", options_.max_restarts, ")")
                              : " (a membership change, not counted as a restart)"));
    }
  }

  // A fresh directory per attempt for the workers' error files and flight
  // recorder dumps (Note [Failure summary]); kept when the job fails.
  void MakeRunDir(int attempt) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                     "/ember_launch_", getpid(), "_", attempt, "_XXXXXX");
    run_dir_ = mkdtemp(templ.data()) != nullptr ? templ : "";
    const char* pattern = std::getenv("TORCH_FR_DUMP_TEMP_FILE");
    if (pattern != nullptr && *pattern != '\0') {
      const std::string p = pattern;
      dump_dir_ = p.find('/') == std::string::npos ? "." : p.substr(0, p.rfind('/'));
    } else {
      dump_dir_ = run_dir_;
    }
  }

  void RemoveRunDir() {
    if (run_dir_.empty()) return;
    if (DIR* dir = opendir(run_dir_.c_str())) {
      while (dirent* e = readdir(dir)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") unlink((run_dir_ + "/" + name).c_str());
      }
      closedir(dir);
    }
    rmdir(run_dir_.c_str());
  }

  // Forwards what the workers wrote to stderr, keeping each one's tail.
  void DrainOutputs() {
    char buf[4096];
    for (Worker& worker : workers_) {
      while (worker.err_fd >= 0) {
        const ssize_t n = read(worker.err_fd, buf, sizeof(buf));
        if (n > 0) {
          worker.tail.Add(std::string_view(buf, n));
          (void)!write(2, buf, n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
          close(worker.err_fd);
          worker.err_fd = -1;
        }
        break;  // EAGAIN: nothing more for now
      }
    }
  }

  void CloseOutputs() {
    DrainOutputs();
    for (Worker& worker : workers_) {
      if (worker.err_fd >= 0) close(worker.err_fd);
      worker.err_fd = -1;
    }
  }

  WorkerReport Report(const Worker& worker) const {
    WorkerReport r;
    r.rank = worker.spec.rank;
    r.local_rank = worker.spec.local_rank;
    r.host = host_;
    r.pid = worker.pid;
    if (std::optional<std::string> m = ReadErrorFile(worker.error_file)) {
      r.message = *m;
      r.message_source = "error file";
    } else {
      std::vector<std::string> lines = worker.tail.Lines();
      if (lines.size() > 5) lines.erase(lines.begin(), lines.end() - 5);
      r.message = absl::StrJoin(lines, "\n");
      r.message_source = "last lines of stderr";
    }
    return r;
  }

  // Note [Failure summary]: states, dumps, then the summary.
  void ReportFailure(const Outcome& failure, const std::vector<std::string>& states) {
    WorkerReport first = Report(workers_[failure.worker]);
    first.outcome = workers_[failure.worker].outcome;
    first.signal = workers_[failure.worker].signal;
    first.when = failure.when;
    std::vector<WorkerReport> others;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (i == failure.worker) continue;
      WorkerReport r = Report(workers_[i]);
      r.outcome = states[i];
      others.push_back(std::move(r));
    }
    std::optional<flight::Verdict> verdict;
    std::string dump_problem;
    if (!dump_dir_.empty()) {
      absl::StatusOr<std::vector<flight::RankDump>> dumps = flight::ReadDumps({dump_dir_});
      if (!dumps.ok()) {
        dump_problem = std::string(dumps.status().message());
      } else if (!dumps->empty()) {
        // Only this node's dumps are here: name missing ranks on one node only.
        verdict = flight::Analyse(*dumps, options_.nnodes == 1 ? options_.nproc_per_node : 0);
      }
    }
    for (const std::string& line :
         FailureSummary(first, others, verdict, dump_dir_, dump_problem)) {
      Say(line);
    }
  }

  // Asks the workers that catch SIGUSR1 to dump their flight recorders and
  // waits up to kDumpWait for the dumps.
  void RequestDumps() {
    std::vector<const Worker*> asked;
    const absl::Time sent = absl::Now();
    for (const Worker& worker : workers_) {
      if (worker.running && CatchesSignal(worker.pid, SIGUSR1) && kill(worker.pid, SIGUSR1) == 0) {
        asked.push_back(&worker);
      }
    }
    if (asked.empty()) return;
    const absl::Time until = sent + kDumpWait;
    while (absl::Now() < until) {
      bool all = dump_dir_ == run_dir_;  // only our own pattern names files by rank
      for (const Worker* worker : asked) {
        if (!all) break;
        all = DumpedSince(worker->spec.rank, sent);
      }
      if (all && dump_dir_ == run_dir_) return;
      NextSignal(absl::Milliseconds(20));  // keeps forwarding stderr
    }
  }

  // Whether rank's dump (fr_<rank>.<host>) was written since `since`.
  bool DumpedSince(int rank, absl::Time since) const {
    struct stat st;
    const std::string path = absl::StrCat(run_dir_, "/fr_", rank, ".", host_);
    return stat(path.c_str(), &st) == 0 &&
           absl::TimeFromTimespec(st.st_mtim) >= since - absl::Milliseconds(10);
  }

  bool Start(Worker& worker) {
    // Everything the child needs is built before fork: with --serve_store the
    // launcher runs the store's server thread, and a forked child may only
    // make async-signal-safe calls.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view entry(*e);
      std::string name(entry.substr(0, entry.find('=')));
      if (!worker.spec.env.contains(name)) env_strings.emplace_back(entry);
    }
    // Note [Failure summary]: where the worker's error and dumps go.
    if (!run_dir_.empty()) {
      worker.error_file = absl::StrCat(run_dir_, "/error_", worker.spec.rank, ".json");
      worker.spec.env["TORCHELASTIC_ERROR_FILE"] = worker.error_file;
      if (dump_dir_ == run_dir_) {
        worker.spec.env["TORCH_FR_DUMP_TEMP_FILE"] = absl::StrCat(run_dir_, "/fr_%r.%h");
      }
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

    int err_pipe[2] = {-1, -1};
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
      Say(absl::StrCat("pipe failed: ", strerror(errno)));
      return false;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      Say(absl::StrCat("fork failed: ", strerror(errno)));
      close(err_pipe[0]);
      close(err_pipe[1]);
      return false;
    }
    if (pid == 0) {
      dup2(err_pipe[1], 2);  // the launcher forwards it (and keeps a tail)
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
    close(err_pipe[1]);
    fcntl(err_pipe[0], F_SETFL, fcntl(err_pipe[0], F_GETFL) | O_NONBLOCK);
    worker.err_fd = err_pipe[0];
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
      for (size_t i = 0; i < workers_.size(); ++i) {
        Worker& worker = workers_[i];
        if (worker.pid != pid || !worker.running) continue;
        worker.running = false;
        worker.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        worker.outcome = WIFSIGNALED(status)
                             ? absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                                            SignalName(WTERMSIG(status)), ")")
                             : absl::StrCat("exited with code ", WEXITSTATUS(status));
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        worker.failed = !ok;
        if (!ok && !failure) {
          failure = Outcome{Outcome::kWorkerFailed,
                            WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status),
                            Describe(worker, status), i, absl::Now()};
        }
      }
    }
    return failure;
  }

  // Note [Replica groups]
  // With --replica_groups each worker is a replica group of a fault-tolerant
  // job (parallel/fault_tolerance.h): the others train on without it, so a
  // failed worker is restarted alone, with its own rank and a restart count
  // of its own, while the others keep running. Returns false, leaving the
  // failure to the usual path (stop everyone, report), once a failed worker
  // has used up --max_restarts or cannot be started.
  bool RestartFailedAlone() {
    const bool omp_set = std::getenv("OMP_NUM_THREADS") != nullptr;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& worker = workers_[i];
      if (worker.running || !worker.failed) continue;
      if (worker.restarts >= options_.max_restarts) return false;
      ++worker.restarts;
      Say(absl::StrCat("worker rank ", worker.spec.rank, " ", worker.outcome,
                       "; restarting it alone (restart ", worker.restarts, " of ",
                       options_.max_restarts, "), the other workers go on"));
      DrainOutputs();
      if (worker.err_fd >= 0) close(worker.err_fd);
      kill(-worker.pid, SIGKILL);  // what the failed worker left in its group
      Worker fresh;
      fresh.spec = MakeWorkerSpec(options_, static_cast<int>(i), worker.restarts, omp_set);
      fresh.restarts = worker.restarts;
      if (!Start(fresh)) return false;
      worker = std::move(fresh);
    }
    return true;
  }

  int Running() const {
    int n = 0;
    for (const Worker& worker : workers_) n += worker.running;
    return n;
  }

  // The next signal, or nullopt after `wait`.
  // Meanwhile forwards the workers' stderr.
  std::optional<int> NextSignal(absl::Duration wait) {
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
    for (const Worker& worker : workers_) {
      if (worker.err_fd >= 0) fds.push_back({worker.err_fd, POLLIN, 0});
    }
    int ms =
        wait == absl::InfiniteDuration() ? -1 : static_cast<int>(absl::ToInt64Milliseconds(wait));
    const absl::Time until = absl::Now() + wait;
    while (true) {
      if (poll(fds.data(), fds.size(), ms) <= 0) return std::nullopt;
      if (fds[0].revents & POLLIN) break;
      DrainOutputs();
      fds.resize(1);
      for (const Worker& worker : workers_) {
        if (worker.err_fd >= 0) fds.push_back({worker.err_fd, POLLIN, 0});
      }
      if (ms >= 0) {
        ms = static_cast<int>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(until - absl::Now())));
        if (ms == 0) return std::nullopt;
      }
    }
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

  // Watches the workers until they all succeed, one fails or a signal comes;
  // with an elastic `agent`, also until the round must restart.
  Outcome Supervise(ElasticAgent* agent = nullptr) {
    absl::Time next_check = absl::Now() + options_.monitor_interval;
    while (true) {
      std::optional<Outcome> failure = Reap();
      if (failure && options_.replica_groups && RestartFailedAlone()) failure.reset();
      if (failure) {
        // Note [Failure summary]: the others' states, their dumps, then stop.
        std::vector<std::string> states;
        for (const Worker& worker : workers_) {
          states.push_back(worker.running ? ProcessState(worker.pid) : worker.outcome);
        }
        RequestDumps();
        StopAll();
        DrainOutputs();
        for (size_t i = 0; i < workers_.size(); ++i) {
          if (i != failure->worker && !workers_[i].outcome.empty() &&
              states[i] != workers_[i].outcome) {
            states[i] += absl::StrCat("; then ", workers_[i].outcome);
          }
        }
        ReportFailure(*failure, states);
        return *failure;
      }
      if (Running() == 0) return Outcome{Outcome::kAllSucceeded, 0, ""};
      if (agent != nullptr && absl::Now() >= next_check) {
        next_check = absl::Now() + options_.monitor_interval;
        absl::StatusOr<std::optional<RoundChange>> change = agent->Check();
        if (!change.ok() || change->has_value()) {
          Outcome changed{Outcome::kRoundChanged, 1,
                          change.ok() ? (*change)->reason : std::string(change.status().message())};
          changed.scale_up = change.ok() && (*change)->membership_only;
          StopAll();
          DrainOutputs();
          return changed;
        }
      }
      std::optional<int> sig = NextSignal(agent != nullptr ? options_.monitor_interval
                                                           : absl::Seconds(1));
      if (sig && *sig != SIGCHLD) {
        StopAll(*sig);
        return Outcome{Outcome::kSignalled, *sig, ""};
      }
    }
  }

  const LaunchOptions options_;
  const std::string executable_;
  const int signal_fd_;
  const std::string host_ = [] {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    return std::string(host);
  }();
  std::string run_dir_;   // this attempt's error files (and dumps)
  std::string dump_dir_;  // where the workers' dumps go
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
  const std::vector<std::string> command = ProgramCommand(*options);
  std::optional<std::string> executable = Resolve(command[0]);
  if (!executable) {
    Say(absl::StrCat("cannot run '", command[0], "': no such executable file",
                     command[0].find('/') == std::string::npos ? " on PATH" : "",
                     command.size() > 1 ? " (python programs run with python3 from PATH)" : ""));
    return 2;
  }
  if (command.size() == 3 && access(command[2].c_str(), R_OK) != 0) {
    Say(absl::StrCat("cannot run '", command[2], "': ", strerror(errno)));
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
