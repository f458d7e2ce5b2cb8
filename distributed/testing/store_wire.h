// A raw client connection to a TcpStore server that speaks the wire protocol
// byte by byte (distributed/tcp_store_wire.h), for tests that send what no
// well-behaved client would: requests before the handshake, huge lengths,
// noise, replies left unread. Testonly.
//
//   ember::distributed::testing::StoreWire raw(port);  // validated
//   raw.Send(request);
//   std::optional<uint8_t> reply = raw.ReadValue<uint8_t>();
#ifndef EMBER_DISTRIBUTED_TESTING_STORE_WIRE_H_
#define EMBER_DISTRIBUTED_TESTING_STORE_WIRE_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/tcp_store_wire.h"

namespace ember::distributed::testing {

class StoreWire {
 public:
  // Connects to 127.0.0.1:port and, unless told not to, sends VALIDATE.
  explicit StoreWire(int port, bool validate = true) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd_);
      fd_ = -1;
      return;
    }
    if (validate) {
      std::string r;
      wire::PutQuery(r, wire::Query::kValidate);
      wire::PutValue<uint32_t>(r, wire::kValidationMagic);
      Send(r);
    }
  }
  ~StoreWire() {
    if (fd_ >= 0) close(fd_);
  }
  StoreWire(const StoreWire&) = delete;
  StoreWire& operator=(const StoreWire&) = delete;

  bool ok() const { return fd_ >= 0; }

  // Sends as much of `bytes` as the server takes within a few seconds.
  size_t Send(std::string_view bytes) {
    size_t sent = 0;
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (sent < bytes.size() && absl::Now() < end) {
      ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += n;
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
      pollfd p = {fd_, POLLOUT, 0};
      poll(&p, 1, 50);
    }
    return sent;
  }

  // Exactly `n` bytes, or nullopt if they did not come within `wait`.
  std::optional<std::string> Read(size_t n, absl::Duration wait = absl::Seconds(10)) {
    const absl::Time end = absl::Now() + wait;
    while (buffer_.size() < n) {
      pollfd p = {fd_, POLLIN, 0};
      int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(end - absl::Now())));
      if (poll(&p, 1, ms) <= 0) return std::nullopt;
      char chunk[64 << 10];
      ssize_t got = recv(fd_, chunk, sizeof(chunk), 0);
      if (got <= 0) return std::nullopt;
      buffer_.append(chunk, got);
    }
    std::string out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return out;
  }

  template <typename T>
  std::optional<T> ReadValue(absl::Duration wait = absl::Seconds(10)) {
    std::optional<std::string> bytes = Read(sizeof(T), wait);
    if (!bytes) return std::nullopt;
    T value;
    std::memcpy(&value, bytes->data(), sizeof(T));
    return value;
  }

  // Whether the server closes the connection within `wait`.
  bool Closed(absl::Duration wait = absl::Seconds(10)) {
    const absl::Time end = absl::Now() + wait;
    while (absl::Now() < end) {
      pollfd p = {fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char chunk[4096];
      ssize_t got = recv(fd_, chunk, sizeof(chunk), 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace ember::distributed::testing

#endif  // EMBER_DISTRIBUTED_TESTING_STORE_WIRE_H_
