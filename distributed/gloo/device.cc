#include "distributed/gloo/device.h"

#include <netdb.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gloo/transport/tcp/device.h"

namespace ember::distributed::gloo {

// Note [gloo's network thread]
// gloo's tcp device serves all of its sockets from one thread, an epoll loop
// (level-triggered). When data arrives on a pair whose lock another thread
// holds (a caller posting a send or a receive holds it through the write),
// the loop does not block on the lock: it goes back to epoll_wait, which
// reports the same data at once, and so it spins until the lock is free.
// That costs nothing while the holder runs on another core. It costs a
// whole scheduler tick when the holder has been preempted: the spinner keeps
// its core until the tick, and with two ranks on two cores both ranks'
// loops spin while both holders wait. Measured before this note: 2-rank
// collectives of any size sat at a 4 ms floor in about half of the runs
// (the 4-12 ms cells of BENCHMARKS.md's gloo table); in one such 4 KiB
// all_reduce run 92,416 of the loops' 93,058 try-locks failed, and the
// holders had been preempted inside gloo's writev, which wakes the peer's
// loop thread (a woken thread under the default policy preempts the running
// one).
//
// So the device's thread runs under SCHED_BATCH: Linux's fair scheduler
// never lets a batch thread's wakeup preempt a running thread (it runs on an
// idle core or at the next tick), so posting a message no longer hands the
// core to the thread that will spin on the poster's lock. New threads
// inherit their creator's policy, so the thread creating the device takes
// SCHED_BATCH for the creation only and goes back to SCHED_OTHER; nothing
// else about it changes, and SCHED_BATCH needs no privilege. A creator under
// another policy (real-time, SCHED_IDLE, already batch) is left as it is,
// and its policy is what the thread inherits.
// EMBER_GLOO_BATCH_NETWORK_THREAD=0 keeps the default policy (for
// comparisons).

namespace {

// Switches the calling thread to SCHED_BATCH while it lives (Note [gloo's
// network thread]), when it runs under SCHED_OTHER.
class BatchPolicyScope {
 public:
  BatchPolicyScope() {
    const char* env = std::getenv("EMBER_GLOO_BATCH_NETWORK_THREAD");
    if (env != nullptr && std::string_view(env) == "0") return;
    if (sched_getscheduler(0) != SCHED_OTHER) return;
    const sched_param zero{};
    switched_ = sched_setscheduler(0, SCHED_BATCH, &zero) == 0;
  }
  ~BatchPolicyScope() {
    const sched_param zero{};
    if (switched_) sched_setscheduler(0, SCHED_OTHER, &zero);
  }
  BatchPolicyScope(const BatchPolicyScope&) = delete;
  BatchPolicyScope& operator=(const BatchPolicyScope&) = delete;

 private:
  bool switched_ = false;
};

constexpr char kLoopback[] = "127.0.0.1";

// Whether `hostname` resolves to an address a socket can be bound to (so
// that it is an address of this host), as PyTorch checks before using it.
bool ResolvesToUsableAddress(const std::string& hostname) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(hostname.c_str(), nullptr, &hints, &result) != 0) return false;
  bool usable = false;
  for (addrinfo* rp = result; rp != nullptr && !usable; rp = rp->ai_next) {
    const int fd = socket(rp->ai_family, rp->ai_socktype | SOCK_CLOEXEC, rp->ai_protocol);
    if (fd < 0) continue;
    usable = bind(fd, rp->ai_addr, rp->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(result);
  return usable;
}

}  // namespace

DeviceChoice ChooseDevice() {
  DeviceChoice choice;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    std::vector<std::string> names = absl::StrSplit(ifname, ',', absl::SkipEmpty());
    if (!names.empty()) {
      choice.interface = names[0];
      choice.describe = absl::StrCat("interface ", names[0], " (GLOO_SOCKET_IFNAME");
      if (names.size() > 1) absl::StrAppend(&choice.describe, "; the first of ", names.size());
      absl::StrAppend(&choice.describe, ")");
      return choice;
    }
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0 && ResolvesToUsableAddress(host)) {
    choice.hostname = host;
    choice.describe = absl::StrCat("hostname ", host);
    return choice;
  }
  choice.hostname = kLoopback;
  choice.describe = absl::StrCat("loopback ", kLoopback, " (the host name '", host,
                                 "' resolves to no local address; set GLOO_SOCKET_IFNAME)");
  return choice;
}

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateDevice(
    const DeviceChoice& choice) {
  ::gloo::transport::tcp::attr attr;
  if (!choice.interface.empty()) {
    attr.iface = choice.interface;
  } else {
    attr.hostname = choice.hostname;
  }
  try {
    BatchPolicyScope batch;  // the device's thread inherits it
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    if (!choice.interface.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo backend: cannot use network interface '", choice.interface,
                       "' from GLOO_SOCKET_IFNAME: ", e.what(),
                       "; set it to an interface of this host that is up (see `ip addr`)"));
    }
    return absl::UnavailableError(
        absl::StrCat("gloo backend: cannot create a device on ", choice.describe, ": ", e.what()));
  }
}

}  // namespace ember::distributed::gloo
