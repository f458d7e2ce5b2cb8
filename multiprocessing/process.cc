#include "multiprocessing/process.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <tuple>
#include <utility>

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
// How long the caller waits for its forkserver to take a request and answer
// it with the child's pid, and to report the end of a child it killed.
constexpr absl::Duration kForkserverTimeout = absl::Seconds(60);

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

constexpr std::pair<StartMethod, const char*> kStartMethods[] = {
    {StartMethod::kFork, "fork"},
    {StartMethod::kSpawn, "spawn"},
    {StartMethod::kForkserver, "forkserver"},
};

const char* StartMethodName(StartMethod m) {
  for (const auto& [method, name] : kStartMethods) {
    if (method == m) return name;
  }
  return "?";
}

absl::StatusOr<StartMethod> ParseStartMethod(std::string_view name) {
  for (const auto& [method, known] : kStartMethods) {
    if (name == known) return method;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot find context for '", std::string(name),
                   "'; valid start methods: ", absl::StrJoin(get_all_start_methods(), ", ")));
}

// The socket a spawned child's arguments arrive on ($EMBER_MP_ARGS_FD).
absl::StatusOr<Connection> InheritedArgumentsSocket() {
  const char* var = std::getenv("EMBER_MP_ARGS_FD");
  int fd = -1;
  if (var == nullptr || !absl::SimpleAtoi(var, &fd) || fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a spawned child needs $EMBER_MP_ARGS_FD, got '",
                                                   var == nullptr ? "" : var, "'"));
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return Connection(base::UniqueFd(fd));
}

// The arguments a child was started with, from the socket its parent sends
// them on.
absl::StatusOr<std::vector<Value>> ReceiveArguments(Connection& from_parent) {
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

ExitStatus ExitStatusOf(int wait_status) {
  ExitStatus e;
  if (WIFSIGNALED(wait_status)) {
    e.signal = WTERMSIG(wait_status);
  } else {
    e.exit_code = WEXITSTATUS(wait_status);
  }
  return e;
}

// Runs this binary again: fork, then exec at once (the child takes no
// reference on this process's shared regions: it maps none of them after
// exec), with this process's environment less Ember's per-child variables,
// plus `extra_env`. The descriptors `inherit` stay open across exec. With
// `tie_to_parent` the child dies with the calling thread. When exec fails,
// the child says so on `exec_error_fd` (when >= 0) and exits with 127.
absl::StatusOr<pid_t> ExecSelf(const std::vector<std::string>& extra_env,
                               const std::vector<int>& inherit, bool tie_to_parent,
                               int exec_error_fd) {
  std::string exe = SelfExe();
  // Everything the child needs is built before fork (only exec follows).
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv = *e;
    if (kv.starts_with("EMBER_MP_") || kv.starts_with("EMBER_SHM_MANAGER_SOCKET=")) continue;
    env.emplace_back(kv);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char* argv[] = {exe.data(), nullptr};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  pid_t pid = SharedSegment::ForkToExec();
  if (pid < 0) {
    return absl::UnavailableError(absl::StrCat("Process: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    if (tie_to_parent) TieToParent(parent);
    for (int fd : inherit) ::fcntl(fd, F_SETFD, 0);
    ::execve(argv[0], argv, envp.data());
    static const char kMsg[] = "exec of the current binary failed";
    if (exec_error_fd >= 0) (void)!::write(exec_error_fd, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  return pid;
}

[[noreturn]] void RunEntryPoint(const std::string& entry, int rank, int error_fd,
                                Connection from_parent) {
  absl::StatusOr<std::vector<Value>> args = ReceiveArguments(from_parent);
  from_parent.close();
  if (!args.ok()) FinishChild(args.status(), error_fd);
  absl::StatusOr<EntryPoint> fn = FindEntryPoint(entry);
  absl::Status status = fn.ok() ? RunGuarded([&] { return (*fn)(rank, *args); }) : fn.status();
  args->clear();  // drops the shared tensors before the exit accounting
  FinishChild(status, error_fd);
}

// Note [Forkserver]
// The forkserver start method, as Python's multiprocessing defines it. The
// first start in a process runs ExecSelf with $EMBER_MP_FORKSERVER_FD, the
// server's end of a SOCK_SEQPACKET pair (the control socket), so the server
// is a fresh image of the binary: no threads, locks or shared regions of the
// caller. Its main() reaches maybe_run_spawned_child(), which serves until
// the control socket closes, i.e. until the caller exits (the caller's end is
// close-on-exec, and forked children drop their copy in an atfork handler and
// start a server of their own). The server is not tied to the thread that
// started it (PR_SET_PDEATHSIG would kill it with that thread).
//
// A start sends one request on the control socket, a Value dict encoded as
// queue messages are: "entry_point", "rank", "manager_socket" (the shm
// manager the child should use, which may have started after the server),
// and three descriptors as Connections: "arguments" (the child's end of its
// argument socket, exactly what a spawned child inherits), "errors" (the pipe
// its failure message goes to) and "reports" (the send-only end of a socket
// pair whose other end the caller's Process keeps). The server forks; the
// child ties itself to the server, restores the signal mask and SIGINT, and
// runs RunEntryPoint as a spawned child does. The server answers on
// "reports" with {"pid": pid} (or {"error": why}), and when it has reaped
// the child, with {"wait_status": status}: only the server can wait for its
// children, so Process::join reads the report instead of calling waitpid.
// kill() and terminate() signal the pid directly, after taking any report
// already sent (the server's reaping frees the pid for reuse).
//
// The server exits when the control socket closes; its children die with it
// (PR_SET_PDEATHSIG), so nothing outlives the caller. A server that died is
// noticed (waitpid) and replaced at the next start; one that dies during a
// start fails that start with Unavailable naming it and how it ended, and
// its children's joins report exit code 255 (what Python reports then).

// This process's forkserver.
struct ForkserverState {
  std::mutex mu;
  pid_t pid = -1;      // -1: none running
  Connection control;  // requests go here
};
ForkserverState* g_forkserver = nullptr;

ForkserverState& Forkserver() {
  static ForkserverState* const state = [] {
    g_forkserver = new ForkserverState;
    // A forked child drops its copy of the caller's control socket (which
    // would keep that server alive) and starts its own server when it needs
    // one. The lock may have been held by a thread that does not exist in
    // the child; it is made anew (nothing else runs in the child yet).
    pthread_atfork(nullptr, nullptr, [] {
      new (&g_forkserver->mu) std::mutex;
      g_forkserver->control = Connection();
      g_forkserver->pid = -1;
    });
    return g_forkserver;
  }();
  return *state;
}

// Makes sure `s` names a running server, starting one when there is none or
// it died. Holds s.mu.
absl::Status EnsureForkserverLocked(ForkserverState& s) {
  if (s.pid > 0) {
    int ws = 0;
    if (::waitpid(s.pid, &ws, WNOHANG) == 0) return absl::OkStatus();
    s.pid = -1;  // reaped now (or by another waitpid): start another
    s.control = Connection();
  }
  EMBER_ASSIGN_OR_RETURN(auto control, Pipe(/*duplex=*/true));
  const int fd = control.second.fd();
  absl::StatusOr<pid_t> pid = ExecSelf({absl::StrCat("EMBER_MP_FORKSERVER_FD=", fd)}, {fd},
                                       /*tie_to_parent=*/false, /*exec_error_fd=*/-1);
  if (!pid.ok()) {
    return absl::Status(pid.status().code(),
                        absl::StrCat("starting the forkserver: ", pid.status().message()));
  }
  s.pid = *pid;
  s.control = control.first;
  return absl::OkStatus();
}

// " (it ended with exit code 127)" once the server `server` has ended (waits
// up to a second), "" otherwise; forgets a server it reaps.
std::string DescribeForkserverEnd(pid_t server) {
  ForkserverState& s = Forkserver();
  std::lock_guard lock(s.mu);
  if (s.pid != server) return "";
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  int ws = 0;
  while (::waitpid(server, &ws, WNOHANG) == 0) {
    if (absl::Now() >= deadline) return "";
    absl::SleepFor(absl::Milliseconds(5));
  }
  s.pid = -1;
  s.control = Connection();
  return absl::StrCat(" (it ended with ", ExitStatusOf(ws).str(), ")");
}

// Asks this process's forkserver to fork a child running `entry` as `rank`,
// handing it `arguments` (its argument socket) and `error_pipe` (where its
// failure goes). Returns the child's pid and the connection its end will be
// reported on.
absl::StatusOr<std::pair<pid_t, Connection>> StartFromForkserver(const std::string& entry, int rank,
                                                                 base::UniqueFd error_pipe,
                                                                 const Connection& arguments) {
  EMBER_ASSIGN_OR_RETURN(auto reports, Pipe(/*duplex=*/false));
  // A descriptor crosses a message as a Connection; this one is a pipe.
  Connection errors(std::move(error_pipe));
  const Value request(Value::Dict{{"entry_point", Value(entry)},
                                  {"rank", Value(rank)},
                                  {"manager_socket", Value(ManagerSocketPath())},
                                  {"arguments", Value(arguments)},
                                  {"errors", Value(errors)},
                                  {"reports", Value(reports.second)}});
  ForkserverState& s = Forkserver();
  pid_t server = -1;
  Connection control;
  {
    std::lock_guard lock(s.mu);
    EMBER_RETURN_IF_ERROR(EnsureForkserverLocked(s));
    server = s.pid;
    control = s.control;
  }
  absl::Status sent = control.send(request, kForkserverTimeout);
  // The server holds its copies now (or nobody does): a server that dies
  // closes the reports socket.
  reports.second.close();
  errors.close();
  if (!sent.ok()) {
    return absl::Status(sent.code(),
                        absl::StrCat("sending the request to the forkserver (pid ", server,
                                     "): ", sent.message(), DescribeForkserverEnd(server)));
  }
  absl::StatusOr<Value> reply = reports.first.recv(kForkserverTimeout);
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(
          absl::StrCat("the forkserver (pid ", server, ") ended before starting process ", rank,
                       DescribeForkserverEnd(server), "; the next start starts a new one"));
    }
    return absl::Status(reply.status().code(),
                        absl::StrCat("waiting for the forkserver (pid ", server,
                                     ") to start process ", rank, ": ", reply.status().message()));
  }
  if (const Value* error = reply->find("error"); error != nullptr) {
    return absl::UnavailableError(absl::StrCat("the forkserver (pid ", server,
                                               ") could not start process ", rank, ": ",
                                               error->as<std::string>().value_or("")));
  }
  const Value* pid = reply->find("pid");
  if (pid == nullptr || !pid->is<int64_t>() || *pid->get_if<int64_t>() <= 0) {
    return absl::InternalError(
        absl::StrCat("the forkserver (pid ", server, ") answered a start without a pid"));
  }
  return std::make_pair(static_cast<pid_t>(*pid->get_if<int64_t>()), reports.first);
}

// The server's side of one request: validates it, forks the child, answers.
// `children` maps each running child to its reports connection.
void ServeRequest(const Value& request, const sigset_t& child_mask,
                  const struct sigaction& child_sigint, int exits_fd, Connection& control,
                  std::map<pid_t, Connection>& children) {
  absl::StatusOr<Connection> reports = absl::InvalidArgumentError("no 'reports' connection");
  if (const Value* r = request.find("reports"); r != nullptr) reports = r->as<Connection>();
  if (!reports.ok()) {
    std::fprintf(stderr, "ember forkserver: ignoring a request of kind %s: %s\n",
                 std::string(request.kind()).c_str(),
                 std::string(reports.status().message()).c_str());
    return;
  }
  auto field = [&](const char* key) -> const Value& {
    static const Value kNone;
    const Value* v = request.find(key);
    return v != nullptr ? *v : kNone;
  };
  absl::StatusOr<std::string> entry = field("entry_point").as<std::string>();
  absl::StatusOr<int64_t> rank = field("rank").as<int64_t>();
  absl::StatusOr<std::string> manager_socket = field("manager_socket").as<std::string>();
  absl::StatusOr<Connection> arguments = field("arguments").as<Connection>();
  absl::StatusOr<Connection> errors = field("errors").as<Connection>();
  for (const absl::Status& s : {entry.status(), rank.status(), manager_socket.status(),
                                arguments.status(), errors.status()}) {
    if (!s.ok()) {
      (void)reports->send(
          Value(Value::Dict{{"error", Value(absl::StrCat("bad request: ", s.message()))}}),
          absl::Seconds(1));
      return;
    }
  }
  if (*rank < 0 || *rank > std::numeric_limits<int>::max()) {
    (void)reports->send(
        Value(Value::Dict{{"error", Value(absl::StrCat("bad request: rank ", *rank))}}),
        absl::Seconds(1));
    return;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t server = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    (void)reports->send(
        Value(Value::Dict{{"error", Value(absl::StrCat("fork: ", std::strerror(errno)))}}),
        absl::Seconds(1));
    return;
  }
  if (pid == 0) {
    TieToParent(server);
    ::sigaction(SIGINT, &child_sigint, nullptr);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    ::close(exits_fd);
    control.close();
    for (auto& [other, connection] : children) connection.close();
    reports->close();
    if (!manager_socket->empty()) ::setenv("EMBER_SHM_MANAGER_SOCKET", manager_socket->c_str(), 1);
    const int error_fd = errors->fd();
    RunEntryPoint(*entry, static_cast<int>(*rank), error_fd, *arguments);
  }
  children[pid] = *reports;
  (void)reports->send(Value(Value::Dict{{"pid", Value(static_cast<int64_t>(pid))}}),
                      absl::Seconds(1));
}

// The forkserver's loop (Note [Forkserver]): serves requests on `control`
// and reports each child's end, until `control` closes.
[[noreturn]] void ServeForks(Connection control) {
  // Ctrl-C reaches the whole foreground process group: the caller decides
  // what becomes of its children, as with Python's forkserver.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction child_sigint {};
  ::sigaction(SIGINT, &ignore, &child_sigint);
  sigset_t sigchld, child_mask;
  sigemptyset(&sigchld);
  sigaddset(&sigchld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &sigchld, &child_mask);
  base::UniqueFd exits(::signalfd(-1, &sigchld, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!exits.valid()) {
    std::fprintf(stderr, "ember forkserver: signalfd: %s\n", std::strerror(errno));
    ::_exit(1);
  }
  std::map<pid_t, Connection> children;
  while (true) {
    pollfd fds[2] = {{control.fd(), POLLIN, 0}, {exits.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "ember forkserver: poll: %s\n", std::strerror(errno));
      ::_exit(1);
    }
    if (fds[1].revents != 0) {
      signalfd_siginfo info;
      while (::read(exits.get(), &info, sizeof(info)) > 0) {
      }
      int ws = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &ws, WNOHANG)) > 0) {
        auto it = children.find(pid);
        if (it == children.end()) continue;
        // The caller may be gone or have dropped the Process: nothing to do then.
        (void)it->second.send(Value(Value::Dict{{"wait_status", Value(ws)}}), absl::Seconds(1));
        children.erase(it);
      }
    }
    if (fds[0].revents != 0) {
      absl::StatusOr<Value> request = control.recv(absl::ZeroDuration());
      if (request.ok()) {
        ServeRequest(*request, child_mask, child_sigint, exits.get(), control, children);
      } else if (request.status().code() == absl::StatusCode::kUnavailable) {
        // The caller exited: so does the server, and its children with it.
        std::fflush(stdout);
        std::fflush(stderr);
        ::_exit(0);
      } else if (request.status().code() != absl::StatusCode::kDeadlineExceeded) {
        std::fprintf(stderr, "ember forkserver: ignoring a request: %s\n",
                     std::string(request.status().message()).c_str());
      }
    }
  }
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
  if (const char* server = std::getenv("EMBER_MP_FORKSERVER_FD"); server != nullptr) {
    int fd = -1;
    if (!absl::SimpleAtoi(server, &fd) || fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
      std::fprintf(stderr,
                   "ember forkserver: $EMBER_MP_FORKSERVER_FD='%s' is not an open descriptor; "
                   "the forkserver is started by the forkserver start method, not by hand\n",
                   server);
      ::_exit(2);
    }
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    ::unsetenv("EMBER_MP_FORKSERVER_FD");
    ServeForks(Connection(base::UniqueFd(fd)));
  }
  const char* name = std::getenv("EMBER_MP_ENTRY_POINT");
  if (name == nullptr) return;
  std::string entry = name;
  int rank = 0, error_fd = -1;
  (void)absl::SimpleAtoi(std::getenv("EMBER_MP_RANK") ? std::getenv("EMBER_MP_RANK") : "0", &rank);
  (void)absl::SimpleAtoi(std::getenv("EMBER_MP_ERROR_FD") ? std::getenv("EMBER_MP_ERROR_FD") : "",
                         &error_fd);
  if (error_fd >= 0) ::fcntl(error_fd, F_SETFD, FD_CLOEXEC);
  absl::StatusOr<Connection> from_parent = InheritedArgumentsSocket();
  for (const char* var :
       {"EMBER_MP_ENTRY_POINT", "EMBER_MP_RANK", "EMBER_MP_ERROR_FD", "EMBER_MP_ARGS_FD"}) {
    ::unsetenv(var);  // not for this child's own children
  }
  if (!from_parent.ok()) FinishChild(from_parent.status(), error_fd);
  RunEntryPoint(entry, rank, error_fd, *std::move(from_parent));
}

absl::StatusOr<Process> Process::start(std::function<absl::Status()> fn) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("Process: pipe: ", std::strerror(errno)));
  }
  base::UniqueFd read_end(p[0]), write_end(p[1]);
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
  return StartExecuted(StartMethod::kSpawn, entry_point, rank, std::move(args));
}

absl::StatusOr<Process> Process::start_forkserver(const std::string& entry_point, int rank,
                                                  std::vector<Value> args) {
  return StartExecuted(StartMethod::kForkserver, entry_point, rank, std::move(args));
}

absl::StatusOr<Process> Process::StartExecuted(StartMethod method, const std::string& entry_point,
                                               int rank, std::vector<Value> args) {
  const char* what = method == StartMethod::kSpawn ? "StartSpawn" : "StartForkserver";
  if (absl::StatusOr<EntryPoint> fn = FindEntryPoint(entry_point); !fn.ok()) {
    return absl::NotFoundError(absl::StrCat(what, ": ", fn.status().message()));
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("Process: pipe: ", std::strerror(errno)));
  }
  base::UniqueFd read_end(p[0]), write_end(p[1]);
  // The arguments travel on a socket the child inherits (spawn) or is
  // handed by the forkserver.
  EMBER_ASSIGN_OR_RETURN(auto arguments, Pipe(/*duplex=*/true));
  Process proc;
  proc.error_pipe_ = std::move(read_end);
  if (method == StartMethod::kSpawn) {
    std::vector<std::string> env = {
        "EMBER_MP_ENTRY_POINT=" + entry_point,
        absl::StrCat("EMBER_MP_RANK=", rank),
        absl::StrCat("EMBER_MP_ERROR_FD=", write_end.get()),
        absl::StrCat("EMBER_MP_ARGS_FD=", arguments.second.fd()),
    };
    if (std::string socket = ManagerSocketPath(); !socket.empty()) {
      env.push_back("EMBER_SHM_MANAGER_SOCKET=" + socket);
    }
    EMBER_ASSIGN_OR_RETURN(proc.pid_, ExecSelf(env, {write_end.get(), arguments.second.fd()},
                                               /*tie_to_parent=*/true, write_end.get()));
  } else {
    absl::StatusOr<std::pair<pid_t, Connection>> child =
        StartFromForkserver(entry_point, rank, std::move(write_end), arguments.second);
    if (!child.ok()) {
      return absl::Status(child.status().code(),
                          absl::StrCat(what, ": ", child.status().message()));
    }
    std::tie(proc.pid_, proc.reports_) = *std::move(child);
  }
  write_end.reset();
  arguments.second.close();  // the child's now: a child gone early makes Send fail
  absl::Status sent = arguments.first.send(Value(Value::List(std::move(args))), kArgumentsTimeout);
  if (!sent.ok()) {
    proc.KillAndReap();
    return absl::Status(sent.code(), absl::StrCat(what, ": sending the arguments to process ", rank,
                                                  ": ", sent.message()));
  }
  return proc;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    pid_ = std::exchange(other.pid_, -1);
    error_pipe_ = std::move(other.error_pipe_);
    reports_ = std::move(other.reports_);
    exit_ = std::move(other.exit_);
    error_message_ = std::move(other.error_message_);
  }
  return *this;
}

Process::~Process() { KillAndReap(); }

void Process::KillAndReap() {
  if (pid_ <= 0 || exit_) return;
  kill();
  // A forkserver's child is reported by its server, which may hang; a
  // child of ours is reaped as soon as SIGKILL has taken it.
  (void)join(reports_.valid() ? kForkserverTimeout : absl::InfiniteDuration());
}

void Process::Reap(ExitStatus exit) {
  exit_ = exit;
  char buf[kMaxErrorMessage];
  ::fcntl(error_pipe_.get(), F_SETFL, O_NONBLOCK);
  while (error_message_.size() < kMaxErrorMessage) {
    ssize_t n = ::read(error_pipe_.get(), buf, sizeof(buf));
    if (n <= 0) break;
    error_message_.append(buf, n);
  }
  error_pipe_.reset();
  reports_.close();
}

absl::StatusOr<ExitStatus> Process::join(absl::Duration timeout) {
  if (exit_) return *exit_;
  if (pid_ <= 0) return absl::FailedPreconditionError("Join: no process");
  auto still_running = [&] {
    return absl::DeadlineExceededError(absl::StrCat("Join: process ", pid_, " still running after ",
                                                    absl::FormatDuration(timeout)));
  };
  if (reports_.valid()) {  // a forkserver's child (Note [Forkserver])
    absl::StatusOr<Value> report = reports_.recv(timeout);
    if (report.ok()) {
      const Value* ws = report->find("wait_status");
      if (ws == nullptr || !ws->is<int64_t>()) {
        return absl::InternalError(
            absl::StrCat("Join: the forkserver sent an unexpected report on process ", pid_));
      }
      Reap(ExitStatusOf(static_cast<int>(*ws->get_if<int64_t>())));
      return *exit_;
    }
    if (report.status().code() == absl::StatusCode::kDeadlineExceeded) return still_running();
    if (report.status().code() != absl::StatusCode::kUnavailable) return report.status();
    // The server died (taking the child with it) before reporting.
    Reap(ExitStatus{.exit_code = 255});
    if (error_message_.empty()) {
      error_message_ =
          absl::StrCat("the forkserver ended before reporting how process ", pid_, " ended");
    }
    return *exit_;
  }
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::Duration nap = absl::Microseconds(20);
  while (true) {
    int ws = 0;
    pid_t r = ::waitpid(pid_, &ws, WNOHANG);
    if (r == pid_) {
      Reap(ExitStatusOf(ws));
      return *exit_;
    }
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid(", pid_, "): ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) return still_running();
    absl::SleepFor(std::min(nap, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    nap = std::min(nap * 2, absl::Milliseconds(5));
  }
}

bool Process::is_alive() {
  if (exit_ || pid_ <= 0) return false;
  return !join(absl::ZeroDuration()).ok();
}

void Process::Signal(int signal) {
  if (pid_ <= 0 || exit_) return;
  // A forkserver's child that ended was reaped by its server, freeing its
  // pid for reuse: take a report already sent before signalling.
  if (reports_.valid()) (void)join(absl::ZeroDuration());
  if (!exit_) ::kill(pid_, signal);
}

void Process::terminate() { Signal(SIGTERM); }

void Process::kill() { Signal(SIGKILL); }

absl::Status spawn(std::function<absl::Status(int rank)> fn, int nprocs,
                   const SpawnOptions& options) {
  if (nprocs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Spawn: nprocs must be >= 1, got ", nprocs));
  }
  if (options.start_method == StartMethod::kFork && !fn && options.entry_point.empty()) {
    return absl::InvalidArgumentError(
        "Spawn: nothing to run (kFork needs a function or options.entry_point; kSpawn and "
        "kForkserver take options.entry_point)");
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

std::vector<std::string> get_all_start_methods() {
  std::vector<std::string> names;
  for (const auto& [method, name] : kStartMethods) names.push_back(name);
  return names;
}

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
  if (method_ == StartMethod::kForkserver) {
    return Process::start_forkserver(target, rank, std::move(args));
  }
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
