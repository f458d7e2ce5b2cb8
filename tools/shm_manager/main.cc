// shm_manager: the daemon that unlinks file_system shared-memory regions left
// behind by processes that died (see tools/shm_manager/server.h).
//
// Processes start it on demand (multiprocessing/manager_client.h); by hand:
//   shm_manager --socket=/tmp/dir/manager.sock [--grace_ms=1000] [--ready_fd=N]
//   shm_manager --help | --version
//
// Before detaching it checks what it needs (the socket's directory, shared
// memory at /dev/shm), so that a missing one is reported to the starter with
// exit status 1; usage errors exit 2 (kUsage).
//
// It detaches into its own session and ignores the terminal's signals, so a
// Ctrl-C aimed at the program that started it cannot stop it before it has
// cleaned up after that program.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "tools/shm_manager/server.h"
#include "tools/version.h"

namespace {

constexpr char kUsage[] =
    "usage: shm_manager --socket=PATH [--grace_ms=N] [--ready_fd=FD]\n"
    "       shm_manager --help | --version\n"
    "Serves PATH (a UNIX socket in a directory private to its user) for the processes that\n"
    "share tensors with the file_system strategy, and unlinks the shared memory of those\n"
    "that die; exits --grace_ms (default 1000) after the last client left. It detaches\n"
    "into its own session; with --ready_fd it writes \"ok\" there once it serves.\n"
    "Exit status: 0 the daemon has detached, 1 it cannot run here (what is missing on\n"
    "stderr), 2 usage error.\n";

int Usage(std::string_view bad) {
  std::fprintf(stderr, "shm_manager: bad argument '%.*s'\n%s", static_cast<int>(bad.size()),
               bad.data(), kUsage);
  return 2;
}

// What the daemon needs from this machine, checked before it detaches so
// that the starter sees the failure: the socket's directory and POSIX shared
// memory (a tmpfs at /dev/shm). Returns the problem, or "" when all is there.
std::string Missing(const std::string& socket_path) {
  std::string dir = socket_path.substr(0, socket_path.rfind('/') + 1);
  if (dir.empty()) dir = ".";
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return "the socket's directory '" + dir + "' does not exist; create it (mode 0700) first";
  }
  if (::stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) {
    return "/dev/shm is missing: POSIX shared memory needs a tmpfs mounted there "
           "(mount -t tmpfs tmpfs /dev/shm)";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  ember::shm_manager::ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    int64_t n = 0;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--version") {
      std::printf("%s\n", ember::tools::version_line("shm_manager").c_str());
      return 0;
    } else if (arg.starts_with("--socket=")) {
      options.socket_path = std::string(arg.substr(9));
    } else if (arg.starts_with("--grace_ms=") &&
               absl::SimpleAtoi(std::string(arg.substr(11)), &n) && n >= 0) {
      options.grace = absl::Milliseconds(n);
    } else if (arg.starts_with("--ready_fd=") &&
               absl::SimpleAtoi(std::string(arg.substr(11)), &n) && n >= 0) {
      options.ready_fd = static_cast<int>(n);
    } else {
      return Usage(arg);
    }
  }
  if (options.socket_path.empty()) return Usage("(no --socket)");
  if (std::string missing = Missing(options.socket_path); !missing.empty()) {
    std::fprintf(stderr, "shm_manager: %s\n", missing.c_str());
    return 1;
  }

  // Detach: the starter waits for this process to exit, then for "ok" on
  // the ready pipe from the daemon proper.
  if (pid_t pid = ::fork(); pid != 0) return pid < 0 ? 1 : 0;
  ::setsid();
  for (int sig : {SIGINT, SIGQUIT, SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE}) {
    ::signal(sig, SIG_IGN);
  }
  (void)!::chdir("/");
  // Hold nothing of the starter's but stderr: an inherited socket or pipe
  // end would keep its peer from seeing EOF.
  if (DIR* d = ::opendir("/proc/self/fd")) {
    int self = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
      int fd = 0;
      if (absl::SimpleAtoi(e->d_name, &fd) && fd > STDERR_FILENO && fd != self &&
          fd != options.ready_fd) {
        ::close(fd);
      }
    }
    ::closedir(d);
  }
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, STDIN_FILENO);
    ::dup2(devnull, STDOUT_FILENO);
    if (devnull > STDERR_FILENO) ::close(devnull);
  }

  absl::Status status = ember::shm_manager::RunServer(options);
  if (!status.ok()) {
    std::fprintf(stderr, "shm_manager: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
