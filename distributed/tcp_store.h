// TcpStore: a Store served over the network by one process (rank 0, or the
// launcher) to every rank of a job (torch.distributed's TCPStore). The wire
// is gRPC (distributed/tcp_store.proto); gRPC stays out of this header.
//
//   ```cpp
//   #include "distributed/tcp_store.h"
//   namespace dist = ember::distributed;
//   // Rank 0 serves and is a client of its own server (usually on MASTER_PORT;
//   // port 0 picks a free one, which store->port() tells):
//   int rank = 0;
//   dist::TcpStoreOptions options;
//   options.host = "127.0.0.1";  // MASTER_ADDR
//   options.port = 0;
//   options.is_server = (rank == 0);
//   EMBER_ASSIGN_OR_RETURN(std::unique_ptr<dist::TcpStore> store, dist::TcpStore::create(options));
//   EMBER_RETURN_IF_ERROR(store->set("rank0/ready", "1"));
//
//   // A process that only serves (a launcher):
//   EMBER_ASSIGN_OR_RETURN(std::unique_ptr<dist::TcpStoreServer> server,
//                          dist::TcpStoreServer::start({.port = 0}));  // server->port()
//   ```
//
// See Note [TcpStore protocol] in tcp_store.cc for the handshake, message
// bounds and how waits end.
//
// Blocking: Create waits up to options.timeout for the server to answer the
// handshake (it may start later than the clients). Every call carries a
// deadline: its own timeout for Get/Wait (plus a short grace for the reply),
// the store's timeout() otherwise.
// Errors: as store.h, and
//   kUnavailable         - the server cannot be reached or went away; the port
//                          to serve on is in use (the message names the port).
//   kFailedPrecondition  - the other end is not a TcpStore of this version.
//   kInvalidArgument     - a key or value larger than max_message_bytes.
//   kResourceExhausted   - Get/Wait: the server holds as many waits as its
//                          limits allow (TcpStoreServerOptions); the message
//                          names the limit. Nothing was waited for.
//
// Thread-safety: TcpStore and TcpStoreServer are thread-safe.
#ifndef EMBER_DISTRIBUTED_TCP_STORE_H_
#define EMBER_DISTRIBUTED_TCP_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/store.h"

namespace ember::distributed {

inline constexpr int64_t kDefaultMaxStoreMessageBytes = int64_t{64} << 20;

struct TcpStoreServerOptions {
  std::string bind_address = "[::]";  // every interface (IPv4 too)
  int port = 0;                       // 0: a free port, see port()
  int64_t max_message_bytes = kDefaultMaxStoreMessageBytes;
  // What clients can make the server hold (Note [TcpStore server limits] in
  // tcp_store.cc). A Get or Wait beyond a limit fails at once with
  // kResourceExhausted naming the limit; other calls are not affected.
  int64_t max_pending_waits = 16384;                    // Get/Wait calls waiting, server-wide
  int64_t max_pending_waits_per_connection = 256;       // ... from one client connection
  int64_t max_pending_wait_bytes = int64_t{256} << 20;  // keys those waits hold
  int64_t max_streams_per_connection = 512;       // concurrent calls of one connection (HTTP/2)
  int64_t max_buffer_bytes = int64_t{256} << 20;  // gRPC's transport buffers (resource quota)
};

// Serves one store until destroyed. Destruction ends waits in progress with
// kUnavailable and returns within about a second.
class TcpStoreServer {
 public:
  // Fails with kUnavailable naming the port if it cannot be listened on (in
  // use, or not permitted).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> start(
      const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;

  // The Get and Wait calls waiting for keys now (for monitoring and tests).
  int64_t num_pending_waits() const;

 private:
  struct Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";                 // the server's host name or address
  int port = 0;                                   // the server's port (server: 0 picks one)
  bool is_server = false;                         // also serve the store (torch's is_master)
  absl::Duration timeout = kDefaultStoreTimeout;  // connect, and the default timeout()
  int64_t max_message_bytes = kDefaultMaxStoreMessageBytes;
};

class TcpStore : public Store {
 public:
  // Connects to (and, with is_server, first starts) the server; see above.
  static absl::StatusOr<std::unique_ptr<TcpStore>> create(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  absl::Status set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                          std::string_view desired) override;
  absl::Status wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> delete_key(std::string_view key) override;
  absl::StatusOr<int64_t> num_keys() override;

  using Store::get;
  using Store::wait;

  // The server's port (the chosen one when is_server and port 0).
  int port() const;
  const std::string& host() const;

 private:
  struct Impl;
  explicit TcpStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_TCP_STORE_H_
