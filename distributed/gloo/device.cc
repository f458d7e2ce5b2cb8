#include "distributed/gloo/device.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gloo/transport/tcp/device.h"

namespace ember::distributed::gloo {
namespace {

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
