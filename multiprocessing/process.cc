#include "multiprocessing/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/manager_client.h"
#include "multiprocessing/shared_segment.h"
#include "tensor/status_macros.h"
#include "tensor/thread_pool.h"

extern char** environ;

namespace ember::multiprocessing {
namespace {

constexpr size_t kMaxErrorMessage = 4096;
// How long a spawned child waits for its arguments, and the parent for room
// to send them (they exceed the socket buffer only when large).
constexpr absl::Duration kArgumentsTimeout = absl::Seconds(60);

std::map<std::string, EntryPoint>& EntryPoints() {
  static auto* m = new std::map<std::string, EntryPoint>;
  return *m;
}
std::mutex& EntryPointsMu() {
  static auto* mu = new std::mutex;
  return *mu;
}

// The registered entry point `name`, or NotFound naming it.
absl::StatusOr<EntryPoint> FindEntryPoint(const std::string& name) {
  std::lock_guard lock(EntryPointsMu());
  auto it = EntryPoints().find(name);
  if (it == EntryPoints().end()) {
    return absl::NotFoundError(absl::StrCat("no entry point '", name,
                                            "' is registered in this binary; register it with "
                                            "EMBER_REGISTER_ENTRY_POINT"));
  }
  return it->second;
}

// The process-wide start method; unset until set or first asked for.
std::mutex g_start_method_mu;
std::optional<StartMethod> g_start_method;

const char* StartMethodName(StartMethod m) { return m == StartMethod::kFork ? "fork" : "spawn"; }

absl::StatusOr<StartMethod> ParseStartMethod(std::string_view name) {
  if (name == "fork") return StartMethod::kFork;
  if (name == "spawn") return StartMethod::kSpawn;
  return absl::InvalidArgumentError(absl::StrCat("cannot find context for '", std::string(name),
                                                 "'; valid start methods: fork, spawn"));
}

// The arguments a spawned child was started with, from the socket its parent
// sends them on.
absl::StatusOr<std::vector<Value>> ReceiveArguments() {
  const char* var = std::getenv("EMBER_MP_ARGS_FD");
  int fd = -1;
  if (var == nullptr || !absl::SimpleAtoi(var, &fd) || fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a spawned child needs $EMBER_MP_ARGS_FD, got '",
                                                   var == nullptr ? "" : var, "'"));
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  Connection from_parent{UniqueFd(fd)};
  absl::StatusOr<Value> args = from_parent.recv(kArgumentsTimeout);
  if (!args.ok()) {
    return absl::Status(
        args.status().code(),
        absl::StrCat("receiving the arguments from the parent: ", args.status().message()));
  }
  if (!args->is<Value::List>()) {
    return absl::InvalidArgumentError(absl::StrCat("the arguments from the parent are a ",
                                                   std::string(args->kind()), ", not a list"));
  }
  return args->list();
}

// Runs in the child: reports a failure on `error_fd`, drops this process's
// shared-memory references, and exits without running the parent's
// destructors or atexit handlers (Note [Segment reference counting]).
[[noreturn]] void FinishChild(const absl::Status& status, int error_fd) {
  int code = 0;
  if (!status.ok()) {
    std::string msg(status.message().substr(0, kMaxErrorMessage));
    if (msg.empty()) msg = absl::StatusCodeToString(status.code());
    (void)!::write(error_fd, msg.data(), msg.size());
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  SharedSegment::ReleaseAllAtExit();
  ::_exit(code);
}

absl::Status RunGuarded(const std::function<absl::Status()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("uncaught exception: ", e.what()));
  } catch (...) {
    return absl::InternalError("uncaught exception of unknown type");
  }
}

// Dies with the parent; exits at once if the parent is already gone.
void TieToParent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

}  // namespace

std::string ExitStatus::str() const {
  if (signal != 0) {
    const char* abbrev = ::sigabbrev_np(signal);
    return abbrev != nullptr ? absl::StrCat("signal SIG", abbrev) : absl::StrCat("signal ", signal);
  }
  return absl::StrCat("exit code ", exit_code);
}

void register_entry_point(const std::string& name, EntryPoint fn) {
  std::lock_guard lock(EntryPointsMu());
  EntryPoints()[name] = fn;
}

void maybe_run_spawned_child() {
  const char* name = std::getenv("EMBER_MP_ENTRY_POINT");
  if (name == nullptr) return;
  std::string entry = name;
  int rank = 0, error_fd = -1;
  (void)absl::SimpleAtoi(std::getenv("EMBER_MP_RANK") ? std::getenv("EMBER_MP_RANK") : "0", &rank);
  (void)absl::SimpleAtoi(std::getenv("EMBER_MP_ERROR_FD") ? std::getenv("EMBER_MP_ERROR_FD") : "",
                         &error_fd);
  if (error_fd >= 0) ::fcntl(error_fd, F_SETFD, FD_CLOEXEC);
  absl::StatusOr<std::vector<Value>> args = ReceiveArguments();
  for (const char* var :
       {"EMBER_MP_ENTRY_POINT", "EMBER_MP_RANK", "EMBER_MP_ERROR_FD", "EMBER_MP_ARGS_FD"}) {
    ::unsetenv(var);  // not for this child's own children
  }
  if (!args.ok()) FinishChild(args.status(), error_fd);
  absl::StatusOr<EntryPoint> fn = FindEntryPoint(entry);
  absl::Status status = fn.ok() ? RunGuarded([&] { return (*fn)(rank, *args); }) : fn.status();
  args->clear();  // drops the shared tensors before the exit accounting
  FinishChild(status, error_fd);
}

absl::StatusOr<Process> Process::start(std::function<absl::Status()> fn) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("Process: pipe: ", std::strerror(errno)));
  }
  UniqueFd read_end(p[0]), write_end(p[1]);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    return absl::UnavailableError(absl::StrCat("Process: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    TieToParent(parent);
    // The intra-op pool's worker threads do not survive fork(); run tensor
    // ops inline here rather than queue work that nobody would pick up.
    set_num_threads(1);
    read_end.reset();
    FinishChild(RunGuarded(fn), write_end.get());
  }
  Process proc;
  proc.pid_ = pid;
  proc.error_pipe_ = std::move(read_end);
  return proc;
}

absl::StatusOr<Process> Process::start_spawn(const std::string& entry_point, int rank,
                                             std::vector<Value> args) {
  if (absl::StatusOr<EntryPoint> fn = FindEntryPoint(entry_point); !fn.ok()) {
    return absl::NotFoundError(absl::StrCat("StartSpawn: ", fn.status().message()));
  }
  std::string exe = SelfExe();
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("Process: pipe: ", std::strerror(errno)));
  }
  UniqueFd read_end(p[0]), write_end(p[1]);
  // The arguments travel on a socket the child inherits.
  EMBER_ASSIGN_OR_RETURN(auto arguments, Pipe(/*duplex=*/true));
  // Everything the child needs is built before fork (only exec follows).
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv = *e;
    if (kv.starts_with("EMBER_MP_") || kv.starts_with("EMBER_SHM_MANAGER_SOCKET=")) continue;
    env.emplace_back(kv);
  }
  env.push_back("EMBER_MP_ENTRY_POINT=" + entry_point);
  env.push_back(absl::StrCat("EMBER_MP_RANK=", rank));
  env.push_back(absl::StrCat("EMBER_MP_ERROR_FD=", write_end.get()));
  env.push_back(absl::StrCat("EMBER_MP_ARGS_FD=", arguments.second.fd()));
  if (std::string socket = ManagerSocketPath(); !socket.empty()) {
    env.push_back("EMBER_SHM_MANAGER_SOCKET=" + socket);
  }
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char* argv[] = {exe.data(), nullptr};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const int error_fd = write_end.get();
  const int arguments_fd = arguments.second.fd();
  // The child execs at once: it takes no references on this process's
  // shared regions (it maps none of them after exec).
  pid_t pid = SharedSegment::ForkToExec();
  if (pid < 0) {
    return absl::UnavailableError(absl::StrCat("Process: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    TieToParent(parent);
    ::fcntl(error_fd, F_SETFD, 0);
    ::fcntl(arguments_fd, F_SETFD, 0);
    ::execve(argv[0], argv, envp.data());
    static const char kMsg[] = "exec of the current binary failed";
    (void)!::write(error_fd, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  Process proc;
  proc.pid_ = pid;
  proc.error_pipe_ = std::move(read_end);
  arguments.second.close();  // the child's now: a child gone early makes Send fail
  absl::Status sent = arguments.first.send(Value(Value::List(std::move(args))), kArgumentsTimeout);
  if (!sent.ok()) {
    proc.kill();
    (void)proc.join();
    return absl::Status(sent.code(), absl::StrCat("StartSpawn: sending the arguments to process ",
                                                  rank, ": ", sent.message()));
  }
  return proc;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !exit_) {
      kill();
      (void)join();
    }
    pid_ = std::exchange(other.pid_, -1);
    error_pipe_ = std::move(other.error_pipe_);
    exit_ = std::move(other.exit_);
    error_message_ = std::move(other.error_message_);
  }
  return *this;
}

Process::~Process() {
  if (pid_ > 0 && !exit_) {
    kill();
    (void)join();
  }
}

void Process::Reap(int wait_status) {
  ExitStatus e;
  if (WIFSIGNALED(wait_status)) {
    e.signal = WTERMSIG(wait_status);
  } else {
    e.exit_code = WEXITSTATUS(wait_status);
  }
  exit_ = e;
  char buf[kMaxErrorMessage];
  ::fcntl(error_pipe_.get(), F_SETFL, O_NONBLOCK);
  while (error_message_.size() < kMaxErrorMessage) {
    ssize_t n = ::read(error_pipe_.get(), buf, sizeof(buf));
    if (n <= 0) break;
    error_message_.append(buf, n);
  }
  error_pipe_.reset();
}

absl::StatusOr<ExitStatus> Process::join(absl::Duration timeout) {
  if (exit_) return *exit_;
  if (pid_ <= 0) return absl::FailedPreconditionError("Join: no process");
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::Duration nap = absl::Microseconds(20);
  while (true) {
    int ws = 0;
    pid_t r = ::waitpid(pid_, &ws, WNOHANG);
    if (r == pid_) {
      Reap(ws);
      return *exit_;
    }
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid(", pid_, "): ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Join: process ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(nap, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    nap = std::min(nap * 2, absl::Milliseconds(5));
  }
}

bool Process::is_alive() {
  if (exit_ || pid_ <= 0) return false;
  return !join(absl::ZeroDuration()).ok();
}

void Process::terminate() {
  if (pid_ > 0 && !exit_) ::kill(pid_, SIGTERM);
}

void Process::kill() {
  if (pid_ > 0 && !exit_) ::kill(pid_, SIGKILL);
}

absl::Status spawn(std::function<absl::Status(int rank)> fn, int nprocs,
                   const SpawnOptions& options) {
  if (nprocs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Spawn: nprocs must be >= 1, got ", nprocs));
  }
  if (options.start_method == StartMethod::kFork && !fn && options.entry_point.empty()) {
    return absl::InvalidArgumentError(
        "Spawn: nothing to run (kFork needs a function or options.entry_point; kSpawn takes "
        "options.entry_point)");
  }
  const Context context(options.start_method);
  std::vector<Process> procs;
  auto stop_all = [&] {
    for (Process& p : procs) p.terminate();
    absl::Time deadline = absl::Now() + options.terminate_grace;
    for (Process& p : procs) {
      if (!p.join(std::max(deadline - absl::Now(), absl::ZeroDuration())).ok()) {
        p.kill();
        (void)p.join();
      }
    }
  };
  for (int rank = 0; rank < nprocs; ++rank) {
    absl::StatusOr<Process> p = options.start_method == StartMethod::kFork && fn
                                    ? Process::start([&fn, rank] { return fn(rank); })
                                    : context.process(options.entry_point, options.args, rank);
    if (!p.ok()) {
      stop_all();
      return absl::Status(p.status().code(), absl::StrCat("Spawn: starting process ", rank, ": ",
                                                          p.status().message()));
    }
    procs.push_back(*std::move(p));
  }
  const absl::Time deadline = options.timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + options.timeout;
  absl::Duration nap = absl::Microseconds(50);
  while (true) {
    bool all_done = true;
    for (int rank = 0; rank < nprocs; ++rank) {
      absl::StatusOr<ExitStatus> e = procs[rank].join(absl::ZeroDuration());
      if (!e.ok()) {
        all_done = false;
        continue;
      }
      if (!e->ok()) {
        std::string message = procs[rank].error_message();
        stop_all();
        return absl::InternalError(absl::StrCat("process ", rank, " terminated with ", e->str(),
                                                message.empty() ? "" : ": " + message));
      }
    }
    if (all_done) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      std::vector<int> running;
      for (int rank = 0; rank < nprocs; ++rank) {
        if (procs[rank].is_alive()) running.push_back(rank);
      }
      stop_all();
      return absl::DeadlineExceededError(
          absl::StrCat("Spawn: process(es) ", absl::StrJoin(running, ", "), " still running after ",
                       absl::FormatDuration(options.timeout), "; all were terminated"));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(5));
  }
}

std::vector<std::string> get_all_start_methods() { return {"fork", "spawn"}; }

absl::Status set_start_method(std::string_view method, bool force) {
  EMBER_ASSIGN_OR_RETURN(StartMethod m, ParseStartMethod(method));
  std::lock_guard lock(g_start_method_mu);
  if (g_start_method.has_value() && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "set_start_method('", std::string(method), "'): context has already been set (to '",
        StartMethodName(*g_start_method), "'); pass force=true to change it"));
  }
  g_start_method = m;
  return absl::OkStatus();
}

std::string get_start_method(bool allow_none) {
  std::lock_guard lock(g_start_method_mu);
  if (!g_start_method.has_value()) {
    if (allow_none) return "";
    g_start_method = StartMethod::kFork;
  }
  return StartMethodName(*g_start_method);
}

absl::StatusOr<Context> get_context(std::string_view method) {
  if (method.empty()) {
    EMBER_ASSIGN_OR_RETURN(StartMethod m, ParseStartMethod(get_start_method()));
    return Context(m);
  }
  EMBER_ASSIGN_OR_RETURN(StartMethod m, ParseStartMethod(method));
  return Context(m);
}

std::string Context::get_start_method() const { return StartMethodName(method_); }

absl::StatusOr<Process> Context::process(const std::string& target, std::vector<Value> args,
                                         int rank) const {
  if (method_ == StartMethod::kSpawn) return Process::start_spawn(target, rank, std::move(args));
  absl::StatusOr<EntryPoint> fn = FindEntryPoint(target);
  if (!fn.ok()) return absl::NotFoundError(absl::StrCat("process: ", fn.status().message()));
  return Process::start(
      [fn = *fn, rank, args = std::move(args)]() -> absl::Status { return fn(rank, args); });
}

absl::Status Context::spawn(const std::string& entry_point, std::vector<Value> args, int nprocs,
                            SpawnOptions options) const {
  options.start_method = method_;
  options.entry_point = entry_point;
  options.args = std::move(args);
  return multiprocessing::spawn(nullptr, nprocs, options);
}

}  // namespace ember::multiprocessing
