#include "distributed/tcp_store.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>
#include <vector>

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
// costs one reply, not a poll. The server waits in slices of 100 ms and
// gives up early when the call is cancelled or the server is shutting down,
// which keeps destruction prompt. The client's own deadline is the wait's
// timeout plus a grace for the reply; if that passes, the server is deemed
// gone (kUnavailable), which is different from keys that did not appear
// (kDeadlineExceeded, from the server).

namespace ember::distributed {
namespace {

constexpr char kMagic[] = "ember-tcp-store";
constexpr uint32_t kProtocolVersion = 1;
constexpr absl::Duration kReplyGrace = absl::Seconds(5);
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);
constexpr absl::Duration kLongestWait = absl::Hours(24 * 100);

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::string_view View(const std::string& bytes) { return std::string_view(bytes); }

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

class StoreService final : public wire::TcpStoreService::Service {
 public:
  void Stop() { stopping_ = true; }

  grpc::Status Hello(grpc::ServerContext*, const wire::HelloRequest* request, wire::HelloReply* reply) override {
    reply->set_magic(kMagic);
    reply->set_version(kProtocolVersion);
    if (request->magic() != kMagic || request->version() != kProtocolVersion) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("this TcpStore server speaks protocol ", kProtocolVersion,
                                       "; the client sent magic '", request->magic().substr(0, 32), "' version ",
                                       request->version(), ". Build every rank from the same Ember"));
    }
    return grpc::Status::OK;
  }

  grpc::Status Set(grpc::ServerContext*, const wire::SetRequest* request, wire::SetReply*) override {
    return ToGrpc(store_.Set(View(request->key()), View(request->value())));
  }

  grpc::Status Get(grpc::ServerContext* context, const wire::GetRequest* request, wire::GetReply* reply) override {
    std::vector<std::string> keys = {request->key()};
    if (absl::Status s = WaitFor(context, keys, absl::Microseconds(request->timeout_us())); !s.ok()) {
      return ToGrpc(s);
    }
    absl::StatusOr<std::string> value = store_.Get(View(request->key()), absl::ZeroDuration());
    if (!value.ok()) return ToGrpc(value.status());
    reply->set_value(std::move(*value));
    return grpc::Status::OK;
  }

  grpc::Status Add(grpc::ServerContext*, const wire::AddRequest* request, wire::AddReply* reply) override {
    absl::StatusOr<int64_t> value = store_.Add(View(request->key()), request->delta());
    if (!value.ok()) return ToGrpc(value.status());
    reply->set_value(*value);
    return grpc::Status::OK;
  }

  grpc::Status CompareSet(grpc::ServerContext*, const wire::CompareSetRequest* request,
                          wire::CompareSetReply* reply) override {
    absl::StatusOr<std::string> value =
        store_.CompareSet(View(request->key()), View(request->expected()), View(request->desired()));
    if (!value.ok()) return ToGrpc(value.status());
    reply->set_value(std::move(*value));
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* context, const wire::WaitRequest* request, wire::WaitReply*) override {
    std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    return ToGrpc(WaitFor(context, keys, absl::Microseconds(request->timeout_us())));
  }

  grpc::Status DeleteKey(grpc::ServerContext*, const wire::DeleteKeyRequest* request,
                         wire::DeleteKeyReply* reply) override {
    absl::StatusOr<bool> deleted = store_.DeleteKey(View(request->key()));
    if (!deleted.ok()) return ToGrpc(deleted.status());
    reply->set_deleted(*deleted);
    return grpc::Status::OK;
  }

  grpc::Status NumKeys(grpc::ServerContext*, const wire::NumKeysRequest*, wire::NumKeysReply* reply) override {
    reply->set_num_keys(store_.NumKeys().value());
    return grpc::Status::OK;
  }

 private:
  // Waits for `keys` in slices; see Note [TcpStore protocol].
  absl::Status WaitFor(grpc::ServerContext* context, const std::vector<std::string>& keys, absl::Duration timeout) {
    timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
    absl::Time deadline = std::min(absl::Now() + timeout, absl::FromChrono(context->deadline()));
    while (true) {
      absl::Duration slice = std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kWaitSlice);
      absl::Status status = store_.Wait(keys, slice);
      if (status.code() != absl::StatusCode::kDeadlineExceeded) return status;
      if (stopping_) return absl::UnavailableError("the store's server is shutting down");
      if (context->IsCancelled()) return absl::CancelledError("the client cancelled the wait");
      if (absl::Now() >= deadline) {
        std::vector<std::string> missing;
        for (const std::string& key : keys) {
          if (!store_.Get(key, absl::ZeroDuration()).ok()) missing.push_back(key);
        }
        return internal::MissingKeysError("", missing, timeout);
      }
    }
  }

  HashStore store_;
  std::atomic<bool> stopping_{false};
};

}  // namespace

struct TcpStoreServer::Impl {
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

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const TcpStoreServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStoreServer: port ", options.port, " is not in [0, 65535]"));
  }
  auto impl = std::make_unique<Impl>();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.bind_address, ":", options.port), grpc::InsecureServerCredentials(),
                           &impl->port);
  builder.RegisterService(&impl->service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    if (impl->server != nullptr) impl->server->Shutdown();
    return absl::UnavailableError(absl::StrCat("TcpStore: cannot serve on ", options.bind_address, ":",
                                               options.port, ": ", BindProblem(options.port),
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
      return absl::UnavailableError(absl::StrCat(name, ": the server did not answer ", std::string(op), " within ",
                                                 absl::FormatDuration(deadline), " (is rank 0 alive?)"));
    }
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(
          absl::StrCat(name, ": ", std::string(op), " failed, the server is unreachable: ", status.error_message()));
    }
    return absl::Status(FromGrpc(status).code(), absl::StrCat(name, ": ", status.error_message()));
  }

  absl::Status CheckSize(std::string_view key, size_t value_bytes) const {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    // Leave room for the message's own framing.
    if (static_cast<int64_t>(key.size() + value_bytes) + 1024 > max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": key '", std::string(key.substr(0, 64)), "' with ",
                                                     key.size() + value_bytes, " bytes of key and value exceeds ",
                                                     "max_message_bytes (", max_message_bytes, ")"));
    }
    return absl::OkStatus();
  }
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStore::~TcpStore() = default;

int TcpStore::port() const { return impl_->port; }
const std::string& TcpStore::host() const { return impl_->host; }

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  if (options.host.empty()) return absl::InvalidArgumentError("TcpStore: empty host; pass the server's address");
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
    EMBER_ASSIGN_OR_RETURN(impl->server, TcpStoreServer::Start(server_options));
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
    return absl::UnavailableError(absl::StrCat(impl->name, ": no store server answered within ",
                                               absl::FormatDuration(options.timeout), " (",
                                               status.error_message(), "); is rank 0 up, and is the address right?"));
  }
  if (!status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(impl->name, ": handshake failed: ", status.error_message()));
  }
  if (reply.magic() != kMagic || reply.version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(impl->name, ": the server is not a TcpStore of protocol ",
                                                      kProtocolVersion, " (it answered version ", reply.version(),
                                                      ")"));
  }
  auto store = std::unique_ptr<TcpStore>(new TcpStore(std::move(impl)));
  store->set_timeout(options.timeout);
  return store;
}

absl::Status TcpStore::Set(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, value.size()));
  wire::SetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  wire::SetReply reply;
  return impl_->Run("Set", timeout(), [&](grpc::ClientContext* c) { return impl_->stub->Set(c, request, &reply); });
}

absl::StatusOr<std::string> TcpStore::Get(std::string_view key, absl::Duration timeout) {
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

absl::StatusOr<int64_t> TcpStore::Add(std::string_view key, int64_t delta) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  wire::AddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  wire::AddReply reply;
  EMBER_RETURN_IF_ERROR(
      impl_->Run("Add", timeout(), [&](grpc::ClientContext* c) { return impl_->stub->Add(c, request, &reply); }));
  return reply.value();
}

absl::StatusOr<std::string> TcpStore::CompareSet(std::string_view key, std::string_view expected,
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

absl::Status TcpStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
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

absl::StatusOr<bool> TcpStore::DeleteKey(std::string_view key) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  wire::DeleteKeyRequest request;
  request.set_key(std::string(key));
  wire::DeleteKeyReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("DeleteKey", timeout(), [&](grpc::ClientContext* c) {
    return impl_->stub->DeleteKey(c, request, &reply);
  }));
  return reply.deleted();
}

absl::StatusOr<int64_t> TcpStore::NumKeys() {
  wire::NumKeysRequest request;
  wire::NumKeysReply reply;
  EMBER_RETURN_IF_ERROR(impl_->Run("NumKeys", timeout(), [&](grpc::ClientContext* c) {
    return impl_->stub->NumKeys(c, request, &reply);
  }));
  return reply.num_keys();
}

}  // namespace ember::distributed
