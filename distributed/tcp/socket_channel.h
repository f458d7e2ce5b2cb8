// SocketChannel: a Channel over one TCP connection (between ranks on
// different hosts), plus the listen/connect/accept helpers that set it up.
//
//   EMBER_ASSIGN_OR_RETURN(Listener listener, Listener::Create());
//   // publish LocalAddress() + ":" + listener.port() through the store ...
//   EMBER_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTo("10.0.0.2", 41234, deadline));
//   SocketChannel channel(std::move(fd), /*peer_rank=*/1);
//
// Sockets are non-blocking with TCP_NODELAY; every wait polls in slices so
// that deadlines and Interrupt() are honoured. The reader keeps a 4 MiB
// buffer, compacted so that Peek's `min_bytes` are always contiguous.
//
// Thread-safety: see Channel; Listener is thread-compatible.
#ifndef EMBER_DISTRIBUTED_TCP_SOCKET_CHANNEL_H_
#define EMBER_DISTRIBUTED_TCP_SOCKET_CHANNEL_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "distributed/tcp/channel.h"
#include "base/unique_fd.h"

namespace ember::distributed::tcp {

using base::UniqueFd;

// A listening TCP socket on every interface and a kernel-chosen port.
class Listener {
 public:
  static absl::StatusOr<Listener> Create();
  int port() const { return port_; }
  // The next connection, waiting until `deadline`.
  absl::StatusOr<UniqueFd> Accept(absl::Time deadline);

 private:
  Listener(UniqueFd fd, int port) : fd_(std::move(fd)), port_(port) {}
  UniqueFd fd_;
  int port_;
};

// Connects to host:port, retrying refused connections until `deadline`.
absl::StatusOr<UniqueFd> ConnectTo(const std::string& host, int port, absl::Time deadline);

// The IPv4 address other hosts reach this one at: the interface named by
// EMBER_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME, as torch reads it), else the
// first non-loopback interface that is up, else 127.0.0.1.
absl::StatusOr<std::string> LocalAddress();

// Reads or writes exactly n bytes on a blocking-style path (used for the
// connection handshake), until `deadline`.
absl::Status WriteFully(int fd, const void* data, size_t n, absl::Time deadline);
absl::Status ReadFully(int fd, void* data, size_t n, absl::Time deadline);

class SocketChannel : public Channel {
 public:
  SocketChannel(UniqueFd fd, int peer_rank, std::string peer_address);

  absl::Status Write(const void* data, size_t n, absl::Time deadline) override;
  absl::StatusOr<absl::Span<const char>> Peek(size_t min_bytes, absl::Duration wait) override;
  void Consume(size_t n) override;
  void Interrupt() override;
  std::string Describe() const override { return "tcp " + peer_address_; }

 private:
  UniqueFd fd_;
  int peer_rank_;
  std::string peer_address_;
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  std::atomic<bool> interrupted_{false};
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_SOCKET_CHANNEL_H_
