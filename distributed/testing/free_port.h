// FreePort(): a TCP port that was free a moment before the call, for tests
// that start servers (stores, launchers) on an explicit port.
//
//   const std::string url = absl::StrCat("tcp://127.0.0.1:", FreePort());
//
// The kernel picks the port by binding port 0 on every interface; the socket
// is closed before returning, so another process may take the port in the
// meantime (tests accept that small race). Thread-safe.
#ifndef EMBER_DISTRIBUTED_TESTING_FREE_PORT_H_
#define EMBER_DISTRIBUTED_TESTING_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ember::distributed::testing {

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace ember::distributed::testing

#endif  // EMBER_DISTRIBUTED_TESTING_FREE_PORT_H_
