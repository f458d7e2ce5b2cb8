#include "multiprocessing/connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "multiprocessing/message.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

// Waits for `events`; false on timeout.
absl::StatusOr<bool> WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    int ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      absl::Duration left = deadline - absl::Now();
      if (left < absl::ZeroDuration()) left = absl::ZeroDuration();
      ms = static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
    }
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

absl::Time DeadlineOf(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

std::string DescribeTimeout(absl::Duration timeout) { return absl::FormatDuration(timeout); }

// A Connection crosses a message as its socket.
const bool kCodecRegistered = [] {
  RegisterChannelCodec(
      ChannelKind::kConnection,
      {.encode = [](const Value& v, std::vector<int>& fds) -> absl::StatusOr<std::string> {
         const Connection& c = *v.get_if<Connection>();
         if (!c.valid()) return absl::FailedPreconditionError("cannot send a closed Connection");
         fds.push_back(c.fd());
         return std::string();
       },
       .decode = [](std::vector<base::UniqueFd> fds, std::string_view) -> absl::StatusOr<Value> {
         return Value(Connection(std::move(fds[0])));
       },
       .fds = 1});
  return true;
}();

}  // namespace

absl::Status Connection::send_bytes(std::string_view bytes, absl::Span<const int> fds,
                                    absl::Duration timeout) {
  if (!valid()) return absl::FailedPreconditionError("Send on a closed connection");
  if (bytes.size() > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a message of ", bytes.size(), " bytes exceeds the limit of ", kMaxMessageBytes,
        " bytes; put large data in a tensor, which travels "
        "through shared memory"));
  }
  if (fds.size() > kMaxMessageFds) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message with ", fds.size(),
                     " file_descriptor-shared storages exceeds the kernel's "
                     "limit of ",
                     kMaxMessageFds,
                     " descriptors per message; send fewer tensors at once or "
                     "use set_sharing_strategy(\"file_system\")"));
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  const absl::Time deadline = DeadlineOf(timeout);
  while (true) {
    ssize_t n = ::sendmsg(fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return absl::OkStatus();
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      EMBER_ASSIGN_OR_RETURN(bool ready, WaitFor(fd(), POLLOUT, deadline));
      if (!ready) {
        return absl::DeadlineExceededError(absl::StrCat(
            "Send: the receiving side did not make room within ", DescribeTimeout(timeout)));
      }
      continue;
    }
    if (errno == EMSGSIZE) {
      return absl::InvalidArgumentError(
          absl::StrCat("a message of ", bytes.size(),
                       " bytes is larger than this socket accepts; put large "
                       "data in a tensor"));
    }
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) {
      return absl::UnavailableError("Send: the other end of the connection is closed");
    }
    if (errno == ETOOMANYREFS) {
      return absl::ResourceExhaustedError(
          "Send: the kernel refused to pass more descriptors in flight "
          "(ETOOMANYREFS); "
          "receive pending messages first or use "
          "set_sharing_strategy(\"file_system\")");
    }
    return absl::InternalError(absl::StrCat("sendmsg: ", std::strerror(errno)));
  }
}

absl::Status Connection::send(const Value& value, absl::Duration timeout) {
  EMBER_ASSIGN_OR_RETURN(EncodedMessage m, EncodeMessage(value));
  absl::Status s = send_bytes(m.bytes, m.fds, timeout);
  if (!s.ok()) AbandonMessage(m);
  return s;
}

absl::StatusOr<Value> Connection::recv(absl::Duration timeout) {
  if (!valid()) return absl::FailedPreconditionError("Receive on a closed connection");
  thread_local std::unique_ptr<char[]> buffer(new char[kMaxMessageBytes + 1]);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  const absl::Time deadline = DeadlineOf(timeout);
  // Without a timeout the wait is the receive itself: one system call and
  // one wake-up per message instead of poll() then recvmsg().
  const bool block = timeout == absl::InfiniteDuration();
  while (true) {
    if (!block) {
      EMBER_ASSIGN_OR_RETURN(bool ready, WaitFor(fd(), POLLIN, deadline));
      if (!ready) {
        return absl::DeadlineExceededError(
            absl::StrCat("Receive: no message within ", DescribeTimeout(timeout)));
      }
    }
    iovec iov{buffer.get(), kMaxMessageBytes + 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd(), &msg, (block ? 0 : MSG_DONTWAIT) | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        continue;  // another reader won
      if (errno == ECONNRESET) return absl::UnavailableError("Receive: the connection was reset");
      return absl::InternalError(absl::StrCat("recvmsg: ", std::strerror(errno)));
    }
    // Take ownership of every descriptor first, so that no path leaks one.
    std::vector<base::UniqueFd> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
    if (n == 0 && fds.empty()) {
      // A closed peer and an empty message both read as 0 bytes; only the
      // former leaves the socket hung up.
      pollfd p{fd(), POLLRDHUP, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP))) {
        return absl::UnavailableError("Receive: the other end of the connection is closed");
      }
      return absl::InvalidArgumentError("malformed message: empty");
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Receive: a message's file descriptors could not all be "
                       "accepted, most likely "
                       "because this process reached its descriptor limit "
                       "(RLIMIT_NOFILE; the message is "
                       "lost). Raise the limit (ulimit -n) or call "
                       "set_sharing_strategy(\"file_system\") "
                       "in every process"));
    }
    if (msg.msg_flags & MSG_TRUNC || static_cast<size_t>(n) > kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("Receive: a message exceeded the limit of ", kMaxMessageBytes, " bytes"));
    }
    return DecodeMessage(std::string_view(buffer.get(), n), std::move(fds));
  }
}

bool Connection::poll(absl::Duration timeout) const {
  if (!valid()) return false;
  absl::StatusOr<bool> r = WaitFor(fd(), POLLIN, DeadlineOf(timeout));
  return r.ok() && *r;
}

absl::StatusOr<std::pair<Connection, Connection>> Pipe(bool duplex) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    if (errno == EMFILE || errno == ENFILE) {
      return absl::ResourceExhaustedError(
          "Pipe: no descriptors left for a socket pair (RLIMIT_NOFILE); raise "
          "the limit "
          "(ulimit -n)");
    }
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  if (!duplex) {
    ::shutdown(sv[0], SHUT_WR);
    ::shutdown(sv[1], SHUT_RD);
  }
  return std::make_pair(Connection(base::UniqueFd(sv[0])), Connection(base::UniqueFd(sv[1])));
}

}  // namespace ember::multiprocessing
