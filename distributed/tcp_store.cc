#include "distributed/tcp_store.h"

#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/hash_store.h"
#include "distributed/store_util.h"
#include "distributed/tcp_store.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tensor/status_macros.h"

// Note [TcpStore protocol]
// Each Store operation is one unary gRPC call (tcp_store.proto). A client's
// first call is Hello, which carries a magic string and the protocol
// version; a server of another version, or something that is not a TcpStore
// at all, fails the handshake and Create reports it, rather than the first
// real operation failing strangely. Hello waits for the server to come up
// (wait-for-ready, with reconnection backoff capped at one second), so
// clients may start before rank 0.
//
// Bounds: both ends cap messages at max_message_bytes, so a client or a
// stranger announcing a huge message is refused by gRPC's framing before
// the server allocates it; garbage on the port is an HTTP/2 protocol error
// that closes that connection only. SO_REUSEPORT is turned off so that a
// second server on a port in use fails instead of sharing it.
//
// Waits happen on the server (Get and Wait send their timeout), so a wake-up
// costs one reply, not a poll. The server indexes each pending wait by the
// keys it still misses; a Set, Add or CompareSet completes the waits whose
// last missing key it sets, and one timer thread ends the waits whose timeout
// passed. A timeout's error names the first few missing keys and their count
// (internal::MissingKeysError), so it fits in gRPC's status metadata however
// many and however long the keys are. A wait whose call is cancelled (the
// client gave up or its connection closed) is dropped at once; destroying the
// server ends the pending ones with kUnavailable. The client's own deadline
// is the wait's timeout plus a grace for the reply; if that passes, the
// server is deemed gone (kUnavailable), which is different from keys that did
// not appear (kDeadlineExceeded, from the server).

// Note [TcpStore server limits]
// Whatever clients send, what the server keeps is bounded:
// - Pending Get/Wait calls run on gRPC's callback API, so a wait holds a small
//   reactor and an index entry, not a thread. Their number is capped
//   server-wide (max_pending_waits), per connection
//   (max_pending_waits_per_connection, the connection being gRPC's peer
//   address) and by the bytes of the keys they hold (max_pending_wait_bytes).
//   A wait over a limit fails at once with kResourceExhausted naming the
//   limit; it never queues.
// - HTTP/2 caps the calls in flight on one connection
//   (max_streams_per_connection). It is kept above the per-connection wait
//   limit, so a client whose waits hit their limit still has streams for the
//   Set that would wake them.
// - Messages are capped at max_message_bytes both ways, request headers at
//   16 KiB, and gRPC's transport buffers draw from a resource quota of
//   max_buffer_bytes.
// - A connection that does not finish its handshake within 20 s is closed;
//   keepalive pings (every 30 s, 10 s to answer) find peers that vanished
//   without closing, whose waits are then cancelled.
// - glibc's malloc keeps freed memory for reuse, so a burst of waits would
//   leave the process that much larger for good. Once waits that held at
//   least 4 MiB (by the estimate above) have fallen to a quarter of that
//   peak, the timer thread calls malloc_trim a second later, which hands the
//   free pages back; the flood test checks that resident memory returns.

namespace ember::distributed {
namespace {

constexpr char kMagic[] = "ember-tcp-store";
constexpr uint32_t kProtocolVersion = 1;
constexpr absl::Duration kReplyGrace = absl::Seconds(5);
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);
constexpr absl::Duration kLongestWait = absl::Hours(24 * 100);
// Server channel arguments; see Note [TcpStore server limits].
constexpr int kMaxMetadataBytes = 16 << 10;
constexpr int kHandshakeTimeoutMs = 20'000;
constexpr int kKeepaliveMs = 30'000;
constexpr int kKeepaliveTimeoutMs = 10'000;
// What a waited-for key costs beyond twice its bytes (its string in the
// request, its view, the allocator's overhead).
constexpr int64_t kBytesPerKey = 64;
// After waits holding this much have mostly ended, the server returns freed
// memory to the system, kTrimDelay later (connections close after their calls).
constexpr int64_t kTrimAfterBytes = int64_t{4} << 20;
constexpr absl::Duration kTrimDelay = absl::Seconds(1);

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::string_view View(const std::string& bytes) { return std::string_view(bytes); }

// Abseil's containers hash absl::string_view, which is not std::string_view here.
absl::string_view AbslView(std::string_view bytes) {
  return absl::string_view(bytes.data(), bytes.size());
}

// The result of binding `port` on every interface, to name the cause when
// gRPC cannot listen (gRPC itself reports only that it failed).
std::string BindProblem(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int err = 0;
  if (fd >= 0) {
    int zero = 0, one = 1;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in6 addr = {};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(port);
    addr.sin6_addr = in6addr_any;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) err = errno;
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return strerror(errno);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) err = errno;
  }
  close(fd);
  if (err == EADDRINUSE) return absl::StrCat("port ", port, " is already in use");
  if (err != 0) return absl::StrCat("binding port ", port, " failed: ", strerror(err));
  return absl::StrCat("gRPC could not listen on port ", port);
}

class StoreService;

// One Get or Wait that is waiting on the server: the reactor of its call,
// owned by gRPC until OnDone. The keys point into the request, which lives as
// long as the call.
class PendingWait final : public grpc::ServerUnaryReactor {
 public:
  PendingWait(StoreService* service, std::vector<std::string_view> keys, absl::Duration timeout,
              std::string peer, wire::GetReply* get_reply)
      : service_(service),
        keys_(std::move(keys)),
        timeout_(timeout),
        peer_(std::move(peer)),
        get_reply_(get_reply) {}

  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  friend class StoreService;
  StoreService* const service_;
  const std::vector<std::string_view> keys_;
  const absl::Duration timeout_;
  const std::string peer_;
  wire::GetReply* const get_reply_;  // Get: the value goes here; Wait: null
  // Guarded by the service's mutex:
  size_t missing_ = 0;  // distinct keys not set yet
  absl::Time deadline_;
  int64_t bytes_ = 0;      // what this wait counts against max_pending_wait_bytes
  bool finished_ = false;  // Finish was called, or is about to be
};

// The service, on gRPC's callback API: a Get or Wait whose keys are missing
// holds no thread while it waits (Note [TcpStore server limits]).
class StoreService final : public wire::TcpStoreService::CallbackService {
 public:
  explicit StoreService(const TcpStoreServerOptions& options)
      : options_(options), timer_([this] { ExpireWaits(); }) {}
  ~StoreService() override { Stop(); }

  // Ends every pending wait with kUnavailable and refuses new ones.
  void Stop() {
    std::vector<std::pair<PendingWait*, grpc::Status>> done;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      timer_changed_.Signal();
      std::vector<PendingWait*> all;
      for (const auto& [deadline, wait] : deadlines_) all.push_back(wait);
      for (PendingWait* wait : all) {
        done.emplace_back(wait, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                             "the store's server is shutting down"));
        Forget(wait);
      }
    }
    FinishAll(done);
    if (timer_.joinable()) timer_.join();
  }

  int64_t num_pending_waits() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(deadlines_.size());
  }

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* context,
                                  const wire::HelloRequest* request,
                                  wire::HelloReply* reply) override {
    reply->set_magic(kMagic);
    reply->set_version(kProtocolVersion);
    if (request->magic() != kMagic || request->version() != kProtocolVersion) {
      return Done(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                        absl::StrCat("this TcpStore server speaks protocol ",
                                                     kProtocolVersion, "; the client sent magic '",
                                                     request->magic().substr(0, 32), "' version ",
                                                     request->version(),
                                                     ". Build every rank from the same Ember")));
    }
    return Done(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const wire::SetRequest* request, wire::SetReply*) override {
    return Mutate(context, request->key(),
                  [&] { return store_.set(View(request->key()), View(request->value())); });
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const wire::AddRequest* request, wire::AddReply* reply) override {
    return Mutate(context, request->key(), [&]() -> absl::Status {
      EMBER_ASSIGN_OR_RETURN(int64_t value, store_.add(View(request->key()), request->delta()));
      reply->set_value(value);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const wire::CompareSetRequest* request,
                                       wire::CompareSetReply* reply) override {
    return Mutate(context, request->key(), [&]() -> absl::Status {
      EMBER_ASSIGN_OR_RETURN(*reply->mutable_value(),
                             store_.compare_set(View(request->key()), View(request->expected()),
                                               View(request->desired())));
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* context,
                                      const wire::DeleteKeyRequest* request,
                                      wire::DeleteKeyReply* reply) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<bool> deleted = store_.delete_key(View(request->key()));
    if (deleted.ok()) reply->set_deleted(*deleted);
    return Done(context, ToGrpc(deleted.status()));
  }

  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* context,
                                    const wire::NumKeysRequest*,
                                    wire::NumKeysReply* reply) override {
    absl::MutexLock lock(&mu_);
    reply->set_num_keys(store_.num_keys().value());
    return Done(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const wire::GetRequest* request, wire::GetReply* reply) override {
    return StartWait(context, {View(request->key())}, request->timeout_us(), reply);
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const wire::WaitRequest* request, wire::WaitReply*) override {
    std::vector<std::string_view> keys(request->keys().begin(), request->keys().end());
    return StartWait(context, std::move(keys), request->timeout_us(), nullptr);
  }

  // PendingWait::OnCancel: the client gave up or went away.
  void Cancel(PendingWait* wait) {
    {
      absl::MutexLock lock(&mu_);
      if (wait->finished_) return;
      Forget(wait);
    }
    wait->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the wait"));
  }

 private:
  using Finished = std::vector<std::pair<PendingWait*, grpc::Status>>;

  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                                        const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  // Runs `op` (which may set `key`) and wakes the waits it completes.
  template <typename Op>
  grpc::ServerUnaryReactor* Mutate(grpc::CallbackServerContext* context, const std::string& key,
                                   Op op) {
    Finished done;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = op();
      if (status.ok()) KeySet(key, done);
    }
    FinishAll(done);
    return Done(context, ToGrpc(status));
  }

  static void FinishAll(const Finished& done) {
    for (const auto& [wait, status] : done) wait->Finish(status);
  }

  bool IsSet(std::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return store_.check(absl::MakeConstSpan(&key, 1));
  }

  grpc::ServerUnaryReactor* StartWait(grpc::CallbackServerContext* context,
                                      std::vector<std::string_view> keys, int64_t timeout_us,
                                      wire::GetReply* get_reply) {
    for (std::string_view key : keys) {
      if (absl::Status s = internal::CheckKey(key); !s.ok()) return Done(context, ToGrpc(s));
    }
    const absl::Duration timeout =
        std::clamp(absl::Microseconds(timeout_us), absl::ZeroDuration(), kLongestWait);
    auto* wait = new PendingWait(this, std::move(keys), timeout, context->peer(), get_reply);
    absl::ReleasableMutexLock lock(&mu_);
    std::vector<std::string_view> missing;
    {
      absl::flat_hash_set<absl::string_view> seen;
      for (std::string_view key : wait->keys_) {
        if (!IsSet(key) && seen.insert(AbslView(key)).second) missing.push_back(key);
      }
    }
    grpc::Status refused;
    if (missing.empty()) {
      wait->finished_ = true;
      if (get_reply != nullptr)
        get_reply->set_value(*store_.get(wait->keys_[0], absl::ZeroDuration()));
    } else if (stopping_) {
      refused = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the store's server is shutting down");
    } else if (timeout == absl::ZeroDuration()) {
      refused = ToGrpc(MissingError(*wait));
    } else {
      refused = Admit(*wait);
    }
    if (!wait->finished_ && refused.ok()) {
      wait->missing_ = missing.size();
      wait->deadline_ = absl::Now() + timeout;
      for (std::string_view key : missing) waiting_[AbslView(key)].insert(wait);
      deadlines_.emplace(wait->deadline_, wait);
      pending_per_peer_[wait->peer_]++;
      pending_bytes_ += wait->bytes_;
      held_bytes_high_ = std::max(held_bytes_high_, pending_bytes_);
      if (deadlines_.begin()->second == wait) timer_changed_.Signal();
      // OnCancel may run once the reactor is returned; it takes the lock.
      lock.Release();
      return wait;
    }
    wait->finished_ = true;
    lock.Release();
    wait->Finish(refused);
    return wait;
  }

  // Whether one more wait fits the limits; see Note [TcpStore server limits].
  grpc::Status Admit(PendingWait& wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    wait.bytes_ = static_cast<int64_t>(sizeof(PendingWait));
    for (std::string_view key : wait.keys_)
      wait.bytes_ += static_cast<int64_t>(key.size() + sizeof(key));
    auto refuse = [&](std::string_view what) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("the store's server refuses this wait: ", std::string(what),
                                       "; finish or cancel earlier waits, or raise the limit in "
                                       "TcpStoreServerOptions (see distributed/README.md)"));
    };
    if (static_cast<int64_t>(deadlines_.size()) >= options_.max_pending_waits) {
      return refuse(absl::StrCat(
          deadlines_.size(), " waits are pending, max_pending_waits=", options_.max_pending_waits));
    }
    auto it = pending_per_peer_.find(wait.peer_);
    int64_t mine = it == pending_per_peer_.end() ? 0 : it->second;
    if (mine >= options_.max_pending_waits_per_connection) {
      return refuse(absl::StrCat("this connection (", wait.peer_, ") has ", mine,
                                 " waits pending, max_pending_waits_per_connection=",
                                 options_.max_pending_waits_per_connection));
    }
    if (pending_bytes_ + wait.bytes_ > options_.max_pending_wait_bytes) {
      return refuse(absl::StrCat("pending waits hold ", pending_bytes_, " bytes and this one ",
                                 wait.bytes_,
                                 ", max_pending_wait_bytes=", options_.max_pending_wait_bytes));
    }
    return grpc::Status::OK;
  }

  // kDeadlineExceeded naming the keys of `wait` that are still missing.
  absl::Status MissingError(const PendingWait& wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> missing;
    absl::flat_hash_set<absl::string_view> seen;
    for (std::string_view key : wait.keys_) {
      if (!IsSet(key) && seen.insert(AbslView(key)).second) missing.emplace_back(key);
    }
    return internal::MissingKeysError("", missing, wait.timeout_);
  }

  // `key` may have been set: completes the waits that were missing only it.
  void KeySet(const std::string& key, Finished& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!IsSet(key)) return;  // a CompareSet that did not match sets nothing
    auto it = waiting_.find(AbslView(key));
    if (it == waiting_.end()) return;
    absl::flat_hash_set<PendingWait*> waits = std::move(it->second);
    waiting_.erase(it);
    for (PendingWait* wait : waits) {
      if (--wait->missing_ > 0) continue;
      if (wait->get_reply_ != nullptr) {
        wait->get_reply_->set_value(*store_.get(wait->keys_[0], absl::ZeroDuration()));
      }
      Forget(wait);
      done.emplace_back(wait, grpc::Status::OK);
    }
  }

  // Drops `wait` from every index; the caller finishes it.
  void Forget(PendingWait* wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    wait->finished_ = true;
    if (wait->missing_ > 0) {
      for (std::string_view key : wait->keys_) {
        auto it = waiting_.find(AbslView(key));
        if (it == waiting_.end()) continue;
        it->second.erase(wait);
        if (it->second.empty()) waiting_.erase(it);
      }
    }
    deadlines_.erase({wait->deadline_, wait});
    auto peer = pending_per_peer_.find(wait->peer_);
    if (peer != pending_per_peer_.end() && --peer->second == 0) pending_per_peer_.erase(peer);
    pending_bytes_ -= wait->bytes_;
    if (held_bytes_high_ >= kTrimAfterBytes && pending_bytes_ <= held_bytes_high_ / 4 &&
        trim_at_ == absl::InfiniteFuture()) {
      trim_at_ = absl::Now() + kTrimDelay;
      timer_changed_.Signal();
    }
  }

  // The timer thread: ends waits whose timeout passed, and hands the memory
  // of a burst of waits back to the system (Note [TcpStore server limits]).
  void ExpireWaits() {
    while (true) {
      Finished done;
      bool trim = false;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        absl::Time wake = trim_at_;
        if (!deadlines_.empty()) wake = std::min(wake, deadlines_.begin()->first);
        timer_changed_.WaitWithDeadline(&mu_, wake);
        const absl::Time now = absl::Now();
        while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
          PendingWait* wait = deadlines_.begin()->second;
          done.emplace_back(wait, ToGrpc(MissingError(*wait)));
          Forget(wait);
        }
        if (now >= trim_at_) {
          trim = true;
          trim_at_ = absl::InfiniteFuture();
          held_bytes_high_ = pending_bytes_;
        }
      }
      FinishAll(done);
      if (trim) malloc_trim(0);
    }
  }

  const TcpStoreServerOptions options_;
  mutable absl::Mutex mu_;
  HashStore store_ ABSL_GUARDED_BY(mu_);  // its own lock is taken inside mu_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The pending waits: by missing key, by deadline, per connection, and the
  // bytes they hold.
  absl::flat_hash_map<std::string, absl::flat_hash_set<PendingWait*>> waiting_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, PendingWait*>> deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> pending_per_peer_ ABSL_GUARDED_BY(mu_);
  int64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_bytes_high_ ABSL_GUARDED_BY(mu_) = 0;  // pending_bytes_' peak since the last trim
  absl::Time trim_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::CondVar timer_changed_;
  std::thread timer_;  // last: starts after the members it uses
};

void PendingWait::OnCancel() { service_->Cancel(this); }

}  // namespace

struct TcpStoreServer::Impl {
  explicit Impl(const TcpStoreServerOptions& options) : service(options) {}
  StoreService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() {
  impl_->service.Stop();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->server->Wait();
}

int TcpStoreServer::port() const { return impl_->port; }

int64_t TcpStoreServer::num_pending_waits() const { return impl_->service.num_pending_waits(); }

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(
    const TcpStoreServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreServer: port ", options.port, " is not in [0, 65535]"));
  }
  for (auto [name, value] :
       {std::pair<const char*, int64_t>{"max_message_bytes", options.max_message_bytes},
        {"max_pending_waits", options.max_pending_waits},
        {"max_pending_waits_per_connection", options.max_pending_waits_per_connection},
        {"max_pending_wait_bytes", options.max_pending_wait_bytes},
        {"max_streams_per_connection", options.max_streams_per_connection},
        {"max_buffer_bytes", options.max_buffer_bytes}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("TcpStoreServer: ", name, "=", value, " must be at least 1"));
    }
  }
  auto impl = std::make_unique<Impl>(options);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.bind_address, ":", options.port),
                           grpc::InsecureServerCredentials(), &impl->port);
  builder.RegisterService(&impl->service);
  // Note [TcpStore server limits].
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONCURRENT_STREAMS,
      static_cast<int>(std::min<int64_t>(options.max_streams_per_connection, INT32_MAX)));
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  grpc::ResourceQuota quota("ember-tcp-store");
  quota.Resize(static_cast<size_t>(options.max_buffer_bytes));
  builder.SetResourceQuota(quota);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    if (impl->server != nullptr) impl->server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("TcpStore: cannot serve on ", options.bind_address, ":", options.port, ": ",
                     BindProblem(options.port),
                     "; pick another port (MASTER_PORT) or stop the process using it"));
  }
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

struct TcpStore::Impl {
  std::unique_ptr<TcpStoreServer> server;  // with is_server
  std::string host;
  int port = 0;
  std::string name;  // "TcpStore host:port", the prefix of every error
  int64_t max_message_bytes = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<wire::TcpStoreService::Stub> stub;

  // Runs one call with `deadline`; errors get the store's name, and a reply
  // that never came becomes kUnavailable.
  template <typename Call>
  absl::Status Run(std::string_view op, absl::Duration deadline, Call call) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + std::min(deadline, kLongestWait)));
    absl::Time end = absl::Now() + deadline;
    grpc::Status status = call(&context);
    if (status.ok()) return absl::OkStatus();
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && absl::Now() >= end) {
      return absl::UnavailableError(
          absl::StrCat(name, ": the server did not answer ", std::string(op), " within ",
                       absl::FormatDuration(deadline), " (is rank 0 alive?)"));
    }
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(
          absl::StrCat(name, ": ", std::string(op),
                       " failed, the server is unreachable: ", status.error_message()));
    }
    return absl::Status(FromGrpc(status).code(), absl::StrCat(name, ": ", status.error_message()));
  }

  absl::Status CheckSize(std::string_view key, size_t value_bytes) const {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    // Leave room for the message's own framing.
    if (static_cast<int64_t>(key.size() + value_bytes) + 1024 > max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": key '", std::string(key.substr(0, 64)), "' with ", key.size() + value_bytes,
          " bytes of key and value exceeds ", "max_message_bytes (", max_message_bytes, ")"));
    }
    return absl::OkStatus();
  }
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStore::~TcpStore() = default;

int TcpStore::port() const { return impl_->port; }
const std::string& TcpStore::host() const { return impl_->host; }

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::create(const TcpStoreOptions& options) {
  if (options.host.empty())
    return absl::InvalidArgumentError("TcpStore: empty host; pass the server's address");
  if (options.port < 0 || options.port > 65535 || (options.port == 0 && !options.is_server)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: port ", options.port, " is not a server port in [1, 65535]"));
  }
  auto impl = std::make_unique<Impl>();
  impl->host = options.host;
  impl->port = options.port;
  impl->max_message_bytes = options.max_message_bytes;
  if (options.is_server) {
    TcpStoreServerOptions server_options;
    server_options.port = options.port;
    server_options.max_message_bytes = options.max_message_bytes;
    EMBER_ASSIGN_OR_RETURN(impl->server, TcpStoreServer::start(server_options));
    impl->port = impl->server->port();
  }
  bool ipv6_literal = impl->host.find(':') != std::string::npos && impl->host.front() != '[';
  std::string target = ipv6_literal ? absl::StrCat("[", impl->host, "]:", impl->port)
                                    : absl::StrCat(impl->host, ":", impl->port);
  impl->name = "TcpStore " + target;

  grpc::ChannelArguments args;
  int max_bytes = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per TcpStore
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  impl->stub = wire::TcpStoreService::NewStub(impl->channel);

  wire::HelloRequest hello;
  hello.set_magic(kMagic);
  hello.set_version(kProtocolVersion);
  wire::HelloReply reply;
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(absl::ToChronoTime(absl::Now() + std::min(options.timeout, kLongestWait)));
  grpc::Status status = impl->stub->Hello(&context, hello, &reply);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat(
        impl->name, ": no store server answered within ", absl::FormatDuration(options.timeout),
        " (", status.error_message(), "); is rank 0 up, and is the address right?"));
  }
  if (!status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(impl->name, ": handshake failed: ", status.error_message()));
  }
  if (reply.magic() != kMagic || reply.version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(impl->name, ": the server is not a TcpStore of protocol ", kProtocolVersion,
                     " (it answered version ", reply.version(), ")"));
  }
  auto store = std::unique_ptr<TcpStore>(new TcpStore(std::move(impl)));
  store->set_timeout(options.timeout);
  return store;
}

absl::Status TcpStore::set(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, value.size()));
  wire::SetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  wire::SetReply reply;
  return impl_->Run("Set", timeout(),
                    [&](grpc::ClientContext* c) { return impl_->stub->Set(c, request, &reply); });
}

absl::StatusOr<std::string> TcpStore::get(std::string_view key, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
  wire::GetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_us(absl::ToInt64Microseconds(timeout));
  wire::GetReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("Get", timeout + kReplyGrace, [&](grpc::ClientContext* c) {
    return impl_->stub->Get(c, request, &reply);
  }));
  return std::move(*reply.mutable_value());
}

absl::StatusOr<int64_t> TcpStore::add(std::string_view key, int64_t delta) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  wire::AddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  wire::AddReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("Add", timeout(), [&](grpc::ClientContext* c) {
    return impl_->stub->Add(c, request, &reply);
  }));
  return reply.value();
}

absl::StatusOr<std::string> TcpStore::compare_set(std::string_view key, std::string_view expected,
                                                 std::string_view desired) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, expected.size() + desired.size()));
  wire::CompareSetRequest request;
  request.set_key(std::string(key));
  request.set_expected(std::string(expected));
  request.set_desired(std::string(desired));
  wire::CompareSetReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("CompareSet", timeout(), [&](grpc::ClientContext* c) {
    return impl_->stub->CompareSet(c, request, &reply);
  }));
  return std::move(*reply.mutable_value());
}

absl::Status TcpStore::wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  wire::WaitRequest request;
  size_t bytes = 0;
  for (const std::string& key : keys) {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    bytes += key.size() + 8;
    request.add_keys(key);
  }
  if (!keys.empty()) EMBER_RETURN_IF_ERROR(impl_->CheckSize(keys.front(), bytes));
  timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
  request.set_timeout_us(absl::ToInt64Microseconds(timeout));
  wire::WaitReply reply;
  return impl_->Run("Wait", timeout + kReplyGrace,
                    [&](grpc::ClientContext* c) { return impl_->stub->Wait(c, request, &reply); });
}

absl::StatusOr<bool> TcpStore::delete_key(std::string_view key) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  wire::DeleteKeyRequest request;
  request.set_key(std::string(key));
  wire::DeleteKeyReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("DeleteKey", timeout(), [&](grpc::ClientContext* c) {
    return impl_->stub->DeleteKey(c, request, &reply);
  }));
  return reply.deleted();
}

absl::StatusOr<int64_t> TcpStore::num_keys() {
  wire::NumKeysRequest request;
  wire::NumKeysReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("NumKeys", timeout(), [&](grpc::ClientContext* c) {
    return impl_->stub->NumKeys(c, request, &reply);
  }));
  return reply.num_keys();
}

}  // namespace ember::distributed
