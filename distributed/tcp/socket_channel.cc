#include "distributed/tcp/socket_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::distributed::tcp {
namespace {

constexpr size_t kBufferBytes = 4 << 20;
constexpr absl::Duration kPollSlice = absl::Milliseconds(50);

int PollMs(absl::Time until) {
  absl::Duration left = std::min(until - absl::Now(), kPollSlice);
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(left) + 1));
}

void Tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace

absl::StatusOr<Listener> Listener::Create() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), 128) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on a TCP port: ", strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  return Listener(std::move(fd), ntohs(addr.sin_port));
}

absl::StatusOr<UniqueFd> Listener::Accept(absl::Time deadline) {
  while (true) {
    UniqueFd conn(accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.valid()) {
      Tune(conn.get());
      return conn;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("accept: ", strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("timed out waiting for a peer to connect");
    }
    pollfd p{fd_.get(), POLLIN, 0};
    poll(&p, 1, PollMs(deadline));
  }
}

absl::StatusOr<UniqueFd> ConnectTo(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(result->ai_addr);
  freeaddrinfo(result);
  std::string last_error;
  while (true) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      Tune(fd.get());
      return fd;
    }
    last_error = strerror(errno);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("cannot connect to ", host, ":", port, ": ", last_error));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::string> LocalAddress() {
  const char* wanted = std::getenv("EMBER_SOCKET_IFNAME");
  if (wanted == nullptr || *wanted == '\0') wanted = std::getenv("GLOO_SOCKET_IFNAME");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::string("127.0.0.1");
  std::string found;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    const bool named = wanted != nullptr && *wanted != '\0';
    if (named ? std::strcmp(it->ifa_name, wanted) != 0 : (it->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text, sizeof(text));
    found = text;
    break;
  }
  freeifaddrs(list);
  if (found.empty() && wanted != nullptr && *wanted != '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket interface '", wanted,
        "' (EMBER_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) has no IPv4 address that is up"));
  }
  return found.empty() ? std::string("127.0.0.1") : found;
}

absl::Status WriteFully(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("timed out sending");
    pollfd pfd{fd, POLLOUT, 0};
    poll(&pfd, 1, PollMs(deadline));
  }
  return absl::OkStatus();
}

absl::Status ReadFully(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= k;
      continue;
    }
    if (k == 0) return absl::UnavailableError("the peer closed the connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("timed out receiving");
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, PollMs(deadline));
  }
  return absl::OkStatus();
}

SocketChannel::SocketChannel(UniqueFd fd, int peer_rank, std::string peer_address)
    : fd_(std::move(fd)),
      peer_rank_(peer_rank),
      peer_address_(std::move(peer_address)),
      buffer_(new char[kBufferBytes]) {}

absl::Status SocketChannel::Write(const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (interrupted_.load()) return absl::AbortedError("the process group was aborted");
    ssize_t k = send(fd_.get(), p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("connection to rank ", peer_rank_, " (",
                                                 peer_address_, ") failed: ", strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out writing to rank ", peer_rank_,
                                                      " (", peer_address_,
                                                      "), which stopped reading"));
    }
    pollfd pfd{fd_.get(), POLLOUT, 0};
    poll(&pfd, 1, PollMs(deadline));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const char>> SocketChannel::Peek(size_t min_bytes, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  while (end_ - begin_ < min_bytes) {
    if (interrupted_.load()) return absl::AbortedError("the process group was aborted");
    if (begin_ > 0 && (begin_ == end_ || kBufferBytes - end_ < (64 << 10))) {
      std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    ssize_t k = recv(fd_.get(), buffer_.get() + end_, kBufferBytes - end_, 0);
    if (k > 0) {
      end_ += k;
      continue;
    }
    if (k == 0) {
      return absl::UnavailableError(
          absl::StrCat("rank ", peer_rank_, " (", peer_address_, ") closed the connection"));
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("connection to rank ", peer_rank_, " (",
                                                 peer_address_, ") failed: ", strerror(errno)));
    }
    if (absl::Now() >= until) return absl::Span<const char>();
    pollfd pfd{fd_.get(), POLLIN, 0};
    poll(&pfd, 1, PollMs(until));
  }
  return absl::Span<const char>(buffer_.get() + begin_, end_ - begin_);
}

void SocketChannel::Consume(size_t n) { begin_ += n; }

void SocketChannel::Interrupt() {
  interrupted_.store(true);
  shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace ember::distributed::tcp
