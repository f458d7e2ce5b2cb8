#include "multiprocessing/manager_client.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "multiprocessing/manager_protocol.h"
#include "tensor/status_macros.h"

extern char** environ;

namespace ember::multiprocessing {
namespace {

constexpr absl::Duration kAckTimeout = absl::Seconds(10);
constexpr absl::Duration kStartTimeout = absl::Seconds(10);

// Note [Manager connection across fork]: a forked child inherits the parent's
// connection descriptor and socket path. The child must not speak on the
// parent's connection (the daemon would attribute its regions to the parent),
// so every call first checks the owner pid and, in a child, drops the
// inherited descriptor and connects afresh to the same daemon.
struct State {
  std::mutex mu;
  std::string socket_path;  // inherited by forked children
  base::UniqueFd conn;
  pid_t conn_pid = 0;
  FrameReader reader;
};

State& GetState() {
  static State* state = [] {
    auto* s = new State;
    // Keep the mutex usable in a child forked while another thread held it.
    pthread_atfork([] { GetState().mu.lock(); }, [] { GetState().mu.unlock(); },
                   [] { GetState().mu.unlock(); });
    return s;
  }();
  return *state;
}

bool IsExecutable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

absl::Duration GraceFromEnv() {
  int64_t ms = 1000;
  if (const char* v = std::getenv("EMBER_SHM_MANAGER_GRACE_MS")) {
    if (!absl::SimpleAtoi(v, &ms) || ms < 0) ms = 1000;
  }
  return absl::Milliseconds(ms);
}

// Starts a daemon listening in a fresh private directory; returns its socket.
absl::StatusOr<std::string> StartManager() {
  EMBER_ASSIGN_OR_RETURN(std::string binary, FindManagerBinary());
  std::string base = "/tmp";
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0' && std::strlen(t) < 60) {
    base = t;
  }
  std::string dir = base + "/ember-shm-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {  // mode 0700
    return absl::UnavailableError(absl::StrCat("shm manager: cannot create a directory in '", base,
                                               "': ", std::strerror(errno)));
  }
  std::string socket = dir + "/manager.sock";
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) {
    ::rmdir(dir.c_str());
    return absl::UnavailableError(absl::StrCat("shm manager: pipe: ", std::strerror(errno)));
  }
  base::UniqueFd ready_read(ready[0]);
  base::UniqueFd ready_write(ready[1]);
  constexpr int kReadyFd = 3;  // where the daemon finds the pipe
  std::string args[] = {binary, "--socket=" + socket,
                        absl::StrCat("--grace_ms=", absl::ToInt64Milliseconds(GraceFromEnv())),
                        absl::StrCat("--ready_fd=", kReadyFd)};
  char* argv[] = {args[0].data(), args[1].data(), args[2].data(), args[3].data(), nullptr};
  // posix_spawn, not fork: it runs no atfork handlers, and this runs with the
  // client's lock held. The daemon forks once more itself, so it is nobody's
  // child here and never becomes our zombie.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ready_write.get(), kReadyFd);
  pid_t pid = -1;
  int err = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ready_write.reset();
  if (err != 0) {
    ::rmdir(dir.c_str());
    return absl::UnavailableError(
        absl::StrCat("shm manager: cannot run '", binary, "': ", std::strerror(err)));
  }
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  std::string reply;
  absl::Time deadline = absl::Now() + kStartTimeout;
  while (reply.find('\n') == std::string::npos) {
    pollfd p{ready_read.get(), POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("shm manager '", binary,
                                                      "' did not report ready within ",
                                                      absl::FormatDuration(kStartTimeout)));
    }
    if (::poll(&p, 1, ms) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(ready_read.get(), buf, sizeof(buf));
    if (n == 0) break;
    if (n > 0) reply.append(buf, n);
  }
  if (reply != "ok\n") {
    ::rmdir(dir.c_str());
    return absl::UnavailableError(absl::StrCat(
        "shm manager '", binary, "' failed to start: ", reply.empty() ? "it exited" : reply));
  }
  return socket;
}

absl::StatusOr<base::UniqueFd> Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm manager socket path '", path, "' is too long"));
  }
  std::strcpy(addr.sun_path, path.c_str());
  base::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("shm manager at '", path, "' is not reachable: ", std::strerror(errno)));
  }
  return fd;
}

// Sends `frame` and, when `want_ack`, waits for the answer.
absl::Status Exchange(State& s, const std::string& frame, bool want_ack) {
  absl::Time deadline = absl::Now() + kAckTimeout;
  EMBER_RETURN_IF_ERROR(WriteAll(s.conn.get(), frame, deadline));
  if (!want_ack) return absl::OkStatus();
  EMBER_ASSIGN_OR_RETURN(Frame reply, ReadFrame(s.conn.get(), s.reader, deadline));
  if (reply.type == FrameType::kError) {
    return absl::InvalidArgumentError(absl::StrCat("shm manager refused: ", reply.payload));
  }
  if (reply.type != FrameType::kAck) {
    return absl::InternalError("shm manager answered with an unexpected frame");
  }
  return absl::OkStatus();
}

// Makes sure `s.conn` is this process's live connection. Holds s.mu.
absl::Status EnsureConnectedLocked(State& s) {
  if (s.conn.valid() && s.conn_pid == ::getpid()) return absl::OkStatus();
  s.conn.reset();  // closes a descriptor inherited from the parent
  s.reader = FrameReader();
  if (s.socket_path.empty()) {
    if (const char* env = std::getenv("EMBER_SHM_MANAGER_SOCKET"); env && *env) {
      s.socket_path = env;
    }
  }
  absl::StatusOr<base::UniqueFd> fd = absl::UnavailableError("no daemon yet");
  if (!s.socket_path.empty()) fd = Connect(s.socket_path);
  if (!fd.ok()) {  // none yet, or it left after its grace period
    EMBER_ASSIGN_OR_RETURN(s.socket_path, StartManager());
    fd = Connect(s.socket_path);
    if (!fd.ok()) return fd.status();
  }
  s.conn = std::move(*fd);
  s.conn_pid = ::getpid();
  absl::Status hello = Exchange(s, EncodeFrame(FrameType::kHello, absl::StrCat(::getpid())),
                                /*want_ack=*/true);
  if (!hello.ok()) s.conn.reset();
  return hello;
}

}  // namespace

absl::Status RegisterRegion(const std::string& name) {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  // One retry: the daemon may have left (idle) or died since the last call.
  absl::Status status;
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = EnsureConnectedLocked(s);
    if (status.ok()) status = Exchange(s, EncodeFrame(FrameType::kRegister, name), true);
    if (status.ok() || absl::IsInvalidArgument(status)) return status;
    s.conn.reset();
  }
  return status;
}

void UnregisterRegion(const std::string& name) {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  if (!s.conn.valid() || s.conn_pid != ::getpid()) return;
  (void)Exchange(s, EncodeFrame(FrameType::kUnregister, name), false);
}

absl::Status ConnectToManager() {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  return EnsureConnectedLocked(s);
}

void DisconnectFromManager() {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  if (s.conn.valid() && s.conn_pid == ::getpid()) {
    (void)Exchange(s, EncodeFrame(FrameType::kGoodbye), false);
  }
  s.conn.reset();
}

std::string ManagerSocketPath() {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  return s.socket_path;
}

absl::StatusOr<std::string> FindManagerBinary() {
  std::vector<std::string> tried;
  if (const char* env = std::getenv("EMBER_SHM_MANAGER"); env && *env) {
    if (IsExecutable(env)) return std::string(env);
    return absl::NotFoundError(absl::StrCat("$EMBER_SHM_MANAGER='", env,
                                            "' is not an executable file; point it at the "
                                            "shm_manager binary or unset it"));
  }
  std::string exe = SelfExe();
  std::string dir = exe.substr(0, exe.rfind('/'));
  const std::string rel = "ember/tools/shm_manager/shm_manager";
  std::vector<std::string> candidates = {dir + "/shm_manager"};
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* v = std::getenv(var); v && *v) candidates.push_back(absl::StrCat(v, "/", rel));
  }
  candidates.push_back(exe + ".runfiles/" + rel);
  candidates.push_back(dir + "/../tools/shm_manager/shm_manager");  // bazel-bin layout
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
    tried.push_back(c);
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find the shm_manager binary, which the file_system "
                   "sharing strategy needs; "
                   "tried: ",
                   absl::StrJoin(tried, ", "),
                   ". Set $EMBER_SHM_MANAGER to its path, or add "
                   "//tools/shm_manager to the target's data"));
}

}  // namespace ember::multiprocessing
