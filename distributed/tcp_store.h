// TcpStore: a Store served over the network by one process (rank 0, or the
// launcher) to every rank of a job (torch.distributed's TCPStore). It speaks
// c10d's TCPStore protocol, so PyTorch ranks, torchrun and Ember's ranks can
// share one store whichever of them serves it; between Ember's own ends a few
// extensions make waits and Add one round trip with Ember's errors
// (tcp_store_wire.h, Note [TcpStore protocol] in tcp_store_server.cc).
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
// Keys: a client sends each key with a '/' in front, as PyTorch's TCPStore
// does, so `set("a", ...)` here and `store.get("a")` in Python meet.
//
// Writes: set, append, multi_set and queue_push have no reply on the wire (as
// in c10d): they return once sent. They reach the server before any later
// call of the same store, so the store reads its own writes; another client
// sees them once a call of this store that has a reply (get, add, check, ...)
// has returned, or by waiting for them, as ranks do.
//
// Blocking: create() waits up to options.timeout for the server to accept
// and answer the handshake (it may start later than the clients). Every call
// carries a deadline: its own timeout for get/wait (plus a short grace for the
// reply), the store's timeout() otherwise. Calls from several threads run at
// once, each on a connection of its own (the store keeps the idle ones), so a
// thread waiting for a key never holds up the thread that sets it.
// Errors: as store.h, and
//   kUnavailable         - the server cannot be reached or went away; the port
//                          to serve on is in use (the message names the port).
//   kFailedPrecondition  - the other end does not speak the TCPStore protocol.
//   kInvalidArgument     - a key or value larger than max_message_bytes.
//   kResourceExhausted   - get/wait: the server holds as many waits as its
//                          limits allow (TcpStoreServerOptions); the message
//                          names the limit. Nothing was waited for.
// Served by PyTorch's server, the calls behave as PyTorch's own client does:
// waits end by the client's clock, and an add on a value that is not a
// decimal integer loses the connection (kUnavailable), as PyTorch's server
// drops it.
//
// Thread-safety: TcpStore and TcpStoreServer are thread-safe.
#ifndef EMBER_DISTRIBUTED_TCP_STORE_H_
#define EMBER_DISTRIBUTED_TCP_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/store.h"

namespace ember::distributed {

inline constexpr int64_t kDefaultMaxStoreMessageBytes = int64_t{64} << 20;

struct TcpStoreServerOptions {
  std::string bind_address = "[::]";  // every interface (IPv4 too); or an address
  int port = 0;                       // 0: a free port, see port()
  int64_t max_message_bytes = kDefaultMaxStoreMessageBytes;  // one request's keys and values
  // What clients can make the server hold (Note [TcpStore server limits] in
  // tcp_store_server.cc). A wait beyond a limit is refused at once (Ember's
  // clients: kResourceExhausted naming the limit; PyTorch's: the connection
  // is closed); other calls are not affected.
  int64_t max_pending_waits = 16384;                    // waits pending, server-wide
  int64_t max_pending_waits_per_connection = 256;       // ... from one client connection
  int64_t max_pending_wait_bytes = int64_t{256} << 20;  // keys those waits hold
  // Replies a connection has not read yet; beyond this the server reads no
  // more of that connection's requests until the client catches up.
  int64_t max_buffer_bytes = int64_t{64} << 20;
};

// Serves one store until destroyed, from one thread whatever the number of
// clients. Destruction ends waits in progress (Ember's clients see
// kUnavailable) and closes every connection.
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

  // The waits (get, wait, barrier, queue_pop) pending now, and the client
  // connections open now (for monitoring and tests).
  int64_t num_pending_waits() const;
  int64_t num_connections() const;

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
  // As torch's TCPStore: with num_workers, each client counts itself in the
  // key "init/" once connected, and with wait_for_workers the server's own
  // client (is_server) waits, up to timeout, until num_workers have.
  std::optional<int64_t> num_workers;
  bool wait_for_workers = true;
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

  // The extended API in one message each (c10d's CHECK, APPEND, MULTI_GET,
  // MULTI_SET).
  absl::StatusOr<bool> check(absl::Span<const std::string> keys) override;
  absl::Status append(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::vector<std::string>> multi_get(absl::Span<const std::string> keys,
                                                     absl::Duration timeout) override;
  absl::Status multi_set(absl::Span<const std::string> keys,
                         absl::Span<const std::string> values) override;

  using Store::get;
  using Store::multi_get;
  using Store::wait;

  // torch's queue API: queues live beside the keys, under the same names.
  // queue_pop with `block` waits up to `timeout` for a value (a wait on the
  // queue's name, which a push wakes once); without, an empty queue is
  // kNotFound.
  absl::Status queue_push(std::string_view key, std::string_view value);
  absl::StatusOr<std::string> queue_pop(std::string_view key, bool block, absl::Duration timeout);
  absl::StatusOr<std::string> queue_pop(std::string_view key, bool block = true) {
    return queue_pop(key, block, timeout());
  }
  absl::StatusOr<int64_t> queue_len(std::string_view key);

  // Every key stored, as set (torch's list_keys).
  absl::StatusOr<std::vector<std::string>> list_keys();

  // Counts this caller in at `key` and waits, up to `timeout`, until
  // `world_size` callers have (torch's Store.barrier).
  absl::Status barrier(std::string_view key, int64_t world_size, absl::Duration timeout);

  // Whether the server answers Ember's extensions (an Ember server) or only
  // c10d's protocol (PyTorch's).
  bool server_is_ember() const;

  // The server's port (the chosen one when is_server and port 0).
  int port() const;
  const std::string& host() const;

  // Adds `delta` to the count of workers at torch's "init/" (the key that
  // num_workers counts in, outside the '/' every other key starts with) and
  // returns the count; 0 reads it. The rendezvous uses it to count PyTorch
  // ranks, which join no other way (Note [Rendezvous protocol]).
  absl::StatusOr<int64_t> add_to_worker_count(int64_t delta);

 private:
  struct Impl;
  explicit TcpStore(std::unique_ptr<Impl> impl);
  // add on a key as the wire names it (torch's "init/" has no '/' in front).
  absl::StatusOr<int64_t> RawAdd(const std::string& wire_key, int64_t delta);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_TCP_STORE_H_
