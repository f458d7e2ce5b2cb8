// lighthouse: the quorum service of fault-tolerant jobs
// (distributed/elastic/lighthouse.h), started once per job before its
// replica groups, with torchft_lighthouse's flags:
//   lighthouse [--bind=HOST:PORT] [--min_replicas=N] [--join_timeout_ms=N]
//              [--heartbeat_timeout_ms=N]
//   lighthouse --help | --version
// It prints "lighthouse: serving on HOST:PORT" once it serves (the port
// chosen when --bind's is 0) and serves until SIGINT or SIGTERM. Exit
// status: 0 after a signal, 1 when it cannot serve (why on stderr), 2 usage
// error.
#include <signal.h>

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "distributed/elastic/lighthouse.h"
#include "tools/version.h"

namespace {

constexpr char kUsage[] =
    "usage: lighthouse [--bind=HOST:PORT] [--min_replicas=N] [--join_timeout_ms=N]\n"
    "                  [--heartbeat_timeout_ms=N]\n"
    "       lighthouse --help | --version\n"
    "Serves the quorums of a fault-tolerant job's replica groups on HOST:PORT (default\n"
    "0.0.0.0:29510; port 0 picks one). A quorum needs --min_replicas groups (default 1);\n"
    "it waits for every group alive (heard from within --heartbeat_timeout_ms, default\n"
    "5000) and at most --join_timeout_ms (default 60000) for late ones. Prints\n"
    "\"lighthouse: serving on HOST:PORT\" once it serves; stops on SIGINT or SIGTERM.\n"
    "Exit status: 0 stopped by a signal, 1 it cannot serve (why on stderr), 2 usage error.\n";

int Usage(std::string_view bad) {
  std::fprintf(stderr, "lighthouse: bad argument '%.*s'\n%s", static_cast<int>(bad.size()),
               bad.data(), kUsage);
  return 2;
}

bool Millis(std::string_view arg, std::string_view flag, absl::Duration* out) {
  if (!arg.starts_with(flag)) return false;
  int64_t ms = 0;
  const std::string_view value = arg.substr(flag.size());
  if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &ms) || ms < 0) {
    return false;
  }
  *out = absl::Milliseconds(ms);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ember::distributed::elastic::LighthouseOptions options{
      .bind = "0.0.0.0:29510",
      .min_replicas = 1,
      .join_timeout = absl::Seconds(60),
      .heartbeat_timeout = absl::Seconds(5)};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--version") {
      std::printf("%s\n", ember::tools::version_line("lighthouse").c_str());
      return 0;
    } else if (arg.starts_with("--bind=")) {
      options.bind = std::string(arg.substr(7));
    } else if (arg.starts_with("--min_replicas=")) {
      const std::string_view value = arg.substr(15);
      if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &options.min_replicas) ||
          options.min_replicas < 1) {
        return Usage(arg);
      }
    } else if (!Millis(arg, "--join_timeout_ms=", &options.join_timeout) &&
               !Millis(arg, "--heartbeat_timeout_ms=", &options.heartbeat_timeout)) {
      return Usage(arg);
    }
  }
  // Block the signals before gRPC starts its threads, then wait for one.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto server = ember::distributed::elastic::LighthouseServer::create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "lighthouse: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("lighthouse: serving on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop, &signal);
  std::printf("lighthouse: stopping (%d quorums decided)\n",
              static_cast<int>((*server)->quorums_decided()));
  return 0;
}
