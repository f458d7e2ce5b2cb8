// shm_manager: the daemon that unlinks file_system shared-memory regions left
// behind by processes that died (see tools/shm_manager/server.h).
//
// Processes start it on demand (multiprocessing/manager_client.h); by hand:
//   shm_manager --socket=/tmp/dir/manager.sock [--grace_ms=1000] [--ready_fd=N]
//
// It detaches into its own session and ignores the terminal's signals, so a
// Ctrl-C aimed at the program that started it cannot stop it before it has
// cleaned up after that program.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "tools/shm_manager/server.h"

namespace {

int Usage(std::string_view bad) {
  std::fprintf(stderr,
               "shm_manager: bad argument '%.*s'\n"
               "usage: shm_manager --socket=PATH [--grace_ms=N] [--ready_fd=FD]\n",
               static_cast<int>(bad.size()), bad.data());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ember::shm_manager::ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    int64_t n = 0;
    if (arg.starts_with("--socket=")) {
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
