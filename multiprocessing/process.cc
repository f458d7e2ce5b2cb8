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
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "multiprocessing/manager_client.h"
#include "multiprocessing/shared_segment.h"
#include "tensor/status_macros.h"
#include "tensor/thread_pool.h"

extern char** environ;

namespace ember::multiprocessing {
namespace {

constexpr size_t kMaxErrorMessage = 4096;
constexpr char kArgSeparator = '\x1f';

std::map<std::string, EntryPoint>& EntryPoints() {
  static auto* m = new std::map<std::string, EntryPoint>;
  return *m;
}
std::mutex& EntryPointsMu() {
  static auto* mu = new std::mutex;
  return *mu;
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

std::string ExitStatus::ToString() const {
  if (signal != 0) {
    const char* abbrev = ::sigabbrev_np(signal);
    return abbrev != nullptr ? absl::StrCat("signal SIG", abbrev)
                             : absl::StrCat("signal ", signal);
  }
  return absl::StrCat("exit code ", exit_code);
}

void RegisterEntryPoint(const std::string& name, EntryPoint fn) {
  std::lock_guard lock(EntryPointsMu());
  EntryPoints()[name] = fn;
}

void MaybeRunSpawnedChild() {
  const char* name = std::getenv("EMBER_MP_ENTRY_POINT");
  if (name == nullptr) return;
  std::string entry = name;
  int rank = 0, error_fd = -1;
  (void)absl::SimpleAtoi(
      std::getenv("EMBER_MP_RANK") ? std::getenv("EMBER_MP_RANK") : "0", &rank);
  (void)absl::SimpleAtoi(
      std::getenv("EMBER_MP_ERROR_FD") ? std::getenv("EMBER_MP_ERROR_FD") : "",
      &error_fd);
  std::vector<std::string> args;
  if (const char* a = std::getenv("EMBER_MP_ARGS");
      a != nullptr && *a != '\0') {
    args = absl::StrSplit(a, kArgSeparator);
  }
  for (const char* var : {"EMBER_MP_ENTRY_POINT", "EMBER_MP_RANK",
                          "EMBER_MP_ERROR_FD", "EMBER_MP_ARGS"}) {
    ::unsetenv(var);  // not for this child's own children
  }
  if (error_fd >= 0) ::fcntl(error_fd, F_SETFD, FD_CLOEXEC);
  EntryPoint fn = nullptr;
  {
    std::lock_guard lock(EntryPointsMu());
    if (auto it = EntryPoints().find(entry); it != EntryPoints().end())
      fn = it->second;
  }
  absl::Status status =
      fn == nullptr
          ? absl::NotFoundError(absl::StrCat(
                "entry point '", entry, "' is not registered in this binary"))
          : RunGuarded([&] { return fn(rank, args); });
  FinishChild(status, error_fd);
}

absl::StatusOr<Process> Process::Start(std::function<absl::Status()> fn) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    return absl::UnavailableError(
        absl::StrCat("Process: pipe: ", std::strerror(errno)));
  }
  UniqueFd read_end(p[0]), write_end(p[1]);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    return absl::UnavailableError(
        absl::StrCat("Process: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    TieToParent(parent);
    // The intra-op pool's worker threads do not survive fork(); run tensor
    // ops inline here rather than queue work that nobody would pick up.
    SetNumThreads(1);
    read_end.reset();
    FinishChild(RunGuarded(fn), write_end.get());
  }
  Process proc;
  proc.pid_ = pid;
  proc.error_pipe_ = std::move(read_end);
  return proc;
}

absl::StatusOr<Process> Process::StartSpawn(const std::string& entry_point,
                                            int rank,
                                            std::vector<std::string> args) {
  {
    std::lock_guard lock(EntryPointsMu());
    if (!EntryPoints().contains(entry_point)) {
      return absl::NotFoundError(
          absl::StrCat("StartSpawn: no entry point '", entry_point,
                       "' is registered in this binary; register it with "
                       "EMBER_REGISTER_ENTRY_POINT"));
    }
  }
  std::string exe = SelfExe();
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    return absl::UnavailableError(
        absl::StrCat("Process: pipe: ", std::strerror(errno)));
  }
  UniqueFd read_end(p[0]), write_end(p[1]);
  // Everything the child needs is built before fork (only exec follows).
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv = *e;
    if (kv.starts_with("EMBER_MP_") ||
        kv.starts_with("EMBER_SHM_MANAGER_SOCKET="))
      continue;
    env.emplace_back(kv);
  }
  env.push_back("EMBER_MP_ENTRY_POINT=" + entry_point);
  env.push_back(absl::StrCat("EMBER_MP_RANK=", rank));
  env.push_back(absl::StrCat("EMBER_MP_ERROR_FD=", write_end.get()));
  env.push_back("EMBER_MP_ARGS=" +
                absl::StrJoin(args, std::string(1, kArgSeparator)));
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
  pid_t pid = ::fork();
  if (pid < 0) {
    return absl::UnavailableError(
        absl::StrCat("Process: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    TieToParent(parent);
    ::fcntl(error_fd, F_SETFD, 0);
    ::execve(argv[0], argv, envp.data());
    static const char kMsg[] = "exec of the current binary failed";
    (void)!::write(error_fd, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  Process proc;
  proc.pid_ = pid;
  proc.error_pipe_ = std::move(read_end);
  return proc;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !exit_) {
      Kill();
      (void)Join();
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
    Kill();
    (void)Join();
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

absl::StatusOr<ExitStatus> Process::Join(absl::Duration timeout) {
  if (exit_) return *exit_;
  if (pid_ <= 0) return absl::FailedPreconditionError("Join: no process");
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + timeout;
  absl::Duration nap = absl::Microseconds(20);
  while (true) {
    int ws = 0;
    pid_t r = ::waitpid(pid_, &ws, WNOHANG);
    if (r == pid_) {
      Reap(ws);
      return *exit_;
    }
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waitpid(", pid_, "): ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("Join: process ", pid_, " still running after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(
        std::min(nap, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    nap = std::min(nap * 2, absl::Milliseconds(5));
  }
}

bool Process::is_alive() {
  if (exit_ || pid_ <= 0) return false;
  return !Join(absl::ZeroDuration()).ok();
}

void Process::Terminate() {
  if (pid_ > 0 && !exit_) ::kill(pid_, SIGTERM);
}

void Process::Kill() {
  if (pid_ > 0 && !exit_) ::kill(pid_, SIGKILL);
}

absl::Status Spawn(std::function<absl::Status(int rank)> fn, int nprocs,
                   const SpawnOptions& options) {
  if (nprocs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Spawn: nprocs must be >= 1, got ", nprocs));
  }
  if (options.start_method == StartMethod::kFork && !fn) {
    return absl::InvalidArgumentError(
        "Spawn: no function to run (kFork needs one; kSpawn takes "
        "options.entry_point)");
  }
  std::vector<Process> procs;
  auto stop_all = [&] {
    for (Process& p : procs) p.Terminate();
    absl::Time deadline = absl::Now() + options.terminate_grace;
    for (Process& p : procs) {
      if (!p.Join(std::max(deadline - absl::Now(), absl::ZeroDuration()))
               .ok()) {
        p.Kill();
        (void)p.Join();
      }
    }
  };
  for (int rank = 0; rank < nprocs; ++rank) {
    absl::StatusOr<Process> p =
        options.start_method == StartMethod::kFork
            ? Process::Start([&fn, rank] { return fn(rank); })
            : Process::StartSpawn(options.entry_point, rank, options.args);
    if (!p.ok()) {
      stop_all();
      return absl::Status(p.status().code(),
                          absl::StrCat("Spawn: starting process ", rank, ": ",
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
      absl::StatusOr<ExitStatus> e = procs[rank].Join(absl::ZeroDuration());
      if (!e.ok()) {
        all_done = false;
        continue;
      }
      if (!e->ok()) {
        std::string message = procs[rank].error_message();
        stop_all();
        return absl::InternalError(
            absl::StrCat("process ", rank, " terminated with ", e->ToString(),
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
      return absl::DeadlineExceededError(absl::StrCat(
          "Spawn: process(es) ", absl::StrJoin(running, ", "),
          " still running after ", absl::FormatDuration(options.timeout),
          "; all were terminated"));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(5));
  }
}

}  // namespace ember::multiprocessing
