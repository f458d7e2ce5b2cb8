// TcpStore: the client. The server is tcp_store_server.cc.
#include "distributed/tcp_store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "distributed/store_util.h"
#include "distributed/tcp_store_wire.h"
#include "tensor/status_macros.h"

// Note [TcpStore client connections]
// A TcpStore keeps one primary connection, on which every call that the
// server answers at once runs, one call at a time: set, add, compare_set,
// check, and get and wait when their keys are there. So calls of one store
// reach the server in the order they were made, whichever thread made them,
// and a get sees the store's own earlier set (SET has no reply; the server
// handles one connection's requests in order). A get or wait whose keys are
// missing learns so on the primary connection (Ember's server: EMBER_GET /
// EMBER_WAIT with a zero timeout; PyTorch's: CHECK), then waits on a side
// connection of its own, taken from the idle ones or opened, so that other
// threads go on using the store meanwhile, the one that sets the key among
// them. A connection on which a call failed on the way (no reply in time, the
// server closed it) is dropped; the next call opens another, within the
// store's timeout. Before a call that expects no reply, and before any call
// once the connection has been idle for kIdleCheck, the primary connection
// is polled: data or an end of file where nothing is owed means the server
// went away, and the call reconnects (or fails kUnavailable) rather than
// writing into a dead socket.
//
// A reply is read with one blocking recv bounded by SO_RCVTIMEO (the socket
// is blocking once connected; sends pass MSG_DONTWAIT), rather than a poll
// and then a recv: one system call per reply. The receive timeout is set
// again only when the one in place could outlast the call's deadline by
// more than kReceiveSlack, or is far shorter than what is left, so calls
// with the store's usual timeout set it once.

namespace ember::distributed {
namespace {

using wire::Query;

constexpr absl::Duration kReplyGrace = absl::Seconds(5);
constexpr absl::Duration kLongestWait = absl::Hours(24 * 100);
constexpr absl::Duration kMaxConnectBackoff = absl::Seconds(1);
constexpr size_t kIdleSideConnections = 4;
// A primary connection idle this long is checked before a call with a reply
// too (the server may have gone away meanwhile); busy, only before writes.
constexpr absl::Duration kIdleCheck = absl::Milliseconds(100);
// How far a blocking receive may outlast its call's deadline (Note [TcpStore
// client connections]).
constexpr absl::Duration kReceiveSlack = absl::Milliseconds(10);
constexpr char kKeyPrefix[] = "/";  // as torch's TCPStore
constexpr char kInitKey[] = "init/";

std::string Wire(std::string_view key) { return kKeyPrefix + std::string(key); }

// Failures of the way to the server (as opposed to the store's own errors)
// carry this payload; the connection they happened on is dropped.
constexpr char kTransportPayload[] = "ember.distributed.TcpStore/transport";

absl::Status Marked(absl::Status status) {
  status.SetPayload(kTransportPayload, absl::Cord());
  return status;
}
absl::Status Transport(std::string why) { return Marked(absl::UnavailableError(std::move(why))); }
absl::Status NoReply() { return Marked(absl::DeadlineExceededError("no reply")); }
const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}
bool IsTransport(const absl::Status& status) {
  return status.GetPayload(kTransportPayload).has_value();
}

// One connection to the server: a socket and what was read from it but not
// yet taken. Errors are kUnavailable with the reason alone; the store adds
// its name and the call.
class Connection {
 public:
  explicit Connection(base::UniqueFd fd) : fd_(std::move(fd)) {}

  absl::Status Send(std::string_view bytes, absl::Time deadline) {
    while (!bytes.empty()) {
      ssize_t n = send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        bytes.remove_prefix(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        EMBER_RETURN_IF_ERROR(Poll(POLLOUT, deadline));
        continue;
      }
      return Transport(absl::StrCat("sending failed: ", strerror(errno)));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::Time deadline) {
    EMBER_RETURN_IF_ERROR(Fill(sizeof(T), deadline));
    T value;
    std::memcpy(&value, buffer_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  absl::StatusOr<std::string> ReadBytes(int64_t max, absl::Time deadline) {
    EMBER_ASSIGN_OR_RETURN(uint64_t length, Read<uint64_t>(deadline));
    if (length > static_cast<uint64_t>(max)) {
      return Transport(absl::StrCat("the server announced a value of ", length,
                                    " bytes, more than max_message_bytes (", max, ")"));
    }
    EMBER_RETURN_IF_ERROR(Fill(length, deadline));
    std::string bytes = buffer_.substr(pos_, length);
    pos_ += length;
    return bytes;
  }

  // An Ember extension's status: OK, or the code and its detail.
  absl::StatusOr<std::pair<absl::StatusCode, std::string>> ReadStatus(int64_t max,
                                                                      absl::Time deadline) {
    EMBER_ASSIGN_OR_RETURN(uint8_t code, Read<uint8_t>(deadline));
    if (code == 0) return std::make_pair(absl::StatusCode::kOk, std::string());
    EMBER_ASSIGN_OR_RETURN(std::string detail, ReadBytes(max, deadline));
    return std::make_pair(static_cast<absl::StatusCode>(code), std::move(detail));
  }

  // How long since the last call on it ended.
  absl::Duration IdleFor() const { return absl::Now() - last_used_; }
  void Used() { last_used_ = absl::Now(); }

  // Whether the server closed the connection (or sent what nobody asked for)
  // while it was idle.
  bool Broken() {
    if (pos_ < buffer_.size()) return true;
    pollfd p = {fd_.get(), POLLIN | POLLRDHUP, 0};
    return poll(&p, 1, 0) != 0;
  }

 private:
  absl::Status Poll(short events, absl::Time deadline) {
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return NoReply();
      pollfd p = {fd_.get(), events, 0};
      int ms = static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 60'000));
      int rc = poll(&p, 1, ms);
      if (rc > 0) return absl::OkStatus();
      if (rc < 0 && errno != EINTR) return Transport(absl::StrCat("poll: ", strerror(errno)));
    }
  }

  // Bounds the blocking recv by what is left until `deadline` (Note
  // [TcpStore client connections]): set again only when needed.
  absl::Status BoundReceive(absl::Time deadline) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return NoReply();
    if (receive_timeout_ <= left + kReceiveSlack && receive_timeout_ * 2 >= left) {
      return absl::OkStatus();
    }
    const absl::Duration bound = std::min(left, absl::Hours(24));
    const timeval tv = absl::ToTimeval(std::max(bound, absl::Milliseconds(1)));
    if (setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
      return Transport(absl::StrCat("setsockopt(SO_RCVTIMEO): ", strerror(errno)));
    }
    receive_timeout_ = bound;
    return absl::OkStatus();
  }

  absl::Status Fill(size_t n, absl::Time deadline) {
    if (pos_ > 0 && pos_ == buffer_.size()) {
      buffer_.clear();
      pos_ = 0;
    }
    while (buffer_.size() - pos_ < n) {
      // A reply is awaited: one blocking recv, bounded by the deadline.
      EMBER_RETURN_IF_ERROR(BoundReceive(deadline));
      char chunk[64 << 10];
      ssize_t got = recv(fd_.get(), chunk, sizeof(chunk), 0);
      if (got > 0) {
        buffer_.append(chunk, got);
        continue;
      }
      if (got == 0) return Transport("the server closed the connection");
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Transport(absl::StrCat("receiving failed: ", strerror(errno)));
    }
    return absl::OkStatus();
  }

  base::UniqueFd fd_;
  std::string buffer_;
  size_t pos_ = 0;
  absl::Time last_used_ = absl::Now();
  absl::Duration receive_timeout_ = absl::ZeroDuration();  // SO_RCVTIMEO; zero: unset
};

// One connect attempt to any address of host:port, until `deadline`.
absl::StatusOr<base::UniqueFd> ConnectOnce(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string bare = host;
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']')
    bare = bare.substr(1, bare.size() - 2);
  int rc = getaddrinfo(bare.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) return Transport(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  std::string last = "no address";
  base::UniqueFd connected;
  for (addrinfo* ai = found; ai != nullptr && !connected.valid(); ai = ai->ai_next) {
    base::UniqueFd fd(
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = strerror(errno);
      continue;
    }
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = strerror(errno);
        continue;
      }
      pollfd p = {fd.get(), POLLOUT, 0};
      const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
      int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 10'000));
      if (poll(&p, 1, ms) <= 0) {
        last = "connecting timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = strerror(err);
        continue;
      }
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Blocking from here: replies are read by a recv bounded with
    // SO_RCVTIMEO (Note [TcpStore client connections]).
    const int flags = fcntl(fd.get(), F_GETFL);
    if (flags < 0 || fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
      last = absl::StrCat("fcntl: ", strerror(errno));
      continue;
    }
    connected = std::move(fd);
  }
  freeaddrinfo(found);
  if (!connected.valid()) return Transport(last);
  return connected;
}

struct Opened {
  std::unique_ptr<Connection> connection;
  bool ember = false;
};

// Connects (again and again, as the server may not be up yet) and shakes
// hands (Note [TcpStore protocol] in tcp_store_server.cc).
absl::StatusOr<Opened> Open(const std::string& host, int port, absl::Time deadline,
                            const std::string& name) {
  absl::Duration backoff = absl::Milliseconds(10);
  std::string last;
  while (true) {
    absl::StatusOr<base::UniqueFd> fd = ConnectOnce(host, port, deadline);
    if (fd.ok()) {
      auto connection = std::make_unique<Connection>(std::move(*fd));
      static thread_local std::mt19937 random(std::random_device{}());
      const uint32_t nonce = static_cast<uint32_t>(random());
      std::string hello;
      wire::PutQuery(hello, Query::kValidate);
      wire::PutValue<uint32_t>(hello, wire::kValidationMagic);
      wire::PutQuery(hello, Query::kPing);
      wire::PutValue<uint32_t>(hello, nonce);
      wire::PutQuery(hello, Query::kCheck);
      wire::PutValue<uint64_t>(hello, 1);
      wire::PutBytes(hello, wire::kExtensionProbeKey);
      absl::Status sent = connection->Send(hello, deadline);
      absl::StatusOr<uint32_t> echo =
          sent.ok() ? connection->Read<uint32_t>(deadline) : absl::StatusOr<uint32_t>(sent);
      if (echo.ok() && *echo != nonce) {
        return absl::FailedPreconditionError(absl::StrCat(
            name, ": the other end is not a TCPStore server (the handshake's PING came back as ",
            *echo, ", not ", nonce, "); check MASTER_ADDR and MASTER_PORT"));
      }
      absl::StatusOr<uint8_t> probe =
          echo.ok() ? connection->Read<uint8_t>(deadline) : absl::StatusOr<uint8_t>(echo.status());
      if (probe.ok()) {
        return Opened{std::move(connection),
                      *probe == static_cast<uint8_t>(wire::CheckReply::kReady)};
      }
      last = absl::StrCat("the handshake failed: ", probe.status().message());
      if (absl::IsDeadlineExceeded(probe.status()) || absl::Now() >= deadline) break;
    } else {
      last = std::string(fd.status().message());
    }
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, kMaxConnectBackoff);
  }
  return absl::UnavailableError(absl::StrCat(name, ": no store server answered by the deadline (",
                                             last,
                                             "); is rank 0 up, and is the address right?"));
}

}  // namespace

struct TcpStore::Impl {
  const Store* owner = nullptr;            // whose timeout() bounds reconnects
  std::unique_ptr<TcpStoreServer> server;  // with is_server
  std::string host;
  int port = 0;
  std::string name;  // "TcpStore host:port", the prefix of every error
  int64_t max_message_bytes = 0;
  bool ember = false;

  // What calls that do not wait may take: the store's timeout().
  absl::Duration CallTimeout() const { return std::clamp(owner->timeout(), absl::Milliseconds(1), kLongestWait); }

  absl::Mutex primary_mu;
  std::unique_ptr<Connection> primary ABSL_GUARDED_BY(primary_mu);
  absl::Mutex side_mu;
  std::vector<std::unique_ptr<Connection>> idle_sides ABSL_GUARDED_BY(side_mu);

  absl::StatusOr<std::unique_ptr<Connection>> Connect(absl::Duration timeout) {
    EMBER_ASSIGN_OR_RETURN(Opened opened, Open(host, port, absl::Now() + timeout, name));
    return std::move(opened.connection);
  }

  // A failure on the way becomes kUnavailable naming the store and the call.
  absl::Status Failed(std::string_view op, const absl::Status& status, absl::Duration waited) {
    if (!IsTransport(status)) return status;
    if (absl::IsDeadlineExceeded(status)) {
      return absl::UnavailableError(absl::StrCat(name, ": the server did not answer ", std::string(op),
                                                 " within ", absl::FormatDuration(waited),
                                                 " (is rank 0 alive?)"));
    }
    if (status.code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat(name, ": ", std::string(op), " failed, the server is unreachable: ",
                                                 status.message()));
    }
    return status;
  }

  // Runs `exchange(connection, deadline)` on the primary connection, with
  // `reply_within` for its reply. A transport failure drops the connection
  // (the next call opens another). With `check_first` (calls that have no
  // reply), a connection the server closed is found and replaced first.
  template <typename Exchange>
  auto OnPrimary(std::string_view op, absl::Duration reply_within, Exchange exchange,
                 bool check_first = false)
      -> decltype(exchange(std::declval<Connection&>(), absl::Time())) {
    absl::MutexLock lock(&primary_mu);
    if (primary != nullptr && (check_first || primary->IdleFor() > kIdleCheck) &&
        primary->Broken())
      primary.reset();
    if (primary == nullptr) {
      absl::StatusOr<std::unique_ptr<Connection>> connected = Connect(CallTimeout());
      if (!connected.ok()) return connected.status();
      primary = std::move(*connected);
    }
    auto result = exchange(*primary, absl::Now() + reply_within);
    if (!result.ok() && IsTransport(StatusOf(result))) {
      primary.reset();
      return Failed(op, StatusOf(result), reply_within);
    }
    primary->Used();
    return result;
  }

  // Runs `exchange` on a side connection (Note [TcpStore client
  // connections]); `keep` says whether the connection may be used again.
  template <typename Exchange>
  auto OnSide(std::string_view op, absl::Duration reply_within, Exchange exchange)
      -> decltype(exchange(std::declval<Connection&>(), absl::Time(), std::declval<bool&>())) {
    std::unique_ptr<Connection> side;
    {
      absl::MutexLock lock(&side_mu);
      while (!idle_sides.empty() && side == nullptr) {
        side = std::move(idle_sides.back());
        idle_sides.pop_back();
        if (side->Broken()) side.reset();
      }
    }
    if (side == nullptr) {
      absl::StatusOr<std::unique_ptr<Connection>> connected = Connect(CallTimeout());
      if (!connected.ok()) return connected.status();
      side = std::move(*connected);
    }
    bool keep = true;
    auto result = exchange(*side, absl::Now() + reply_within, keep);
    if (!result.ok() && IsTransport(StatusOf(result))) return Failed(op, StatusOf(result), reply_within);
    if (keep) {
      absl::MutexLock lock(&side_mu);
      if (idle_sides.size() < kIdleSideConnections) idle_sides.push_back(std::move(side));
    }
    return result;
  }

  absl::Status CheckSize(std::string_view key, size_t value_bytes) const {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    // Leave room for the request's own framing.
    if (static_cast<int64_t>(key.size() + value_bytes) + 1024 > max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": key '", internal::KeyForMessage(key), "' with ", key.size() + value_bytes,
          " bytes of key and value exceeds max_message_bytes (", max_message_bytes, ")"));
    }
    return absl::OkStatus();
  }

  // The reply of an Ember wait (EMBER_GET / EMBER_WAIT) past its status: the
  // value for a get. kDeadlineExceeded names the missing ones of `keys`.
  absl::StatusOr<std::string> EmberWaitReply(Connection& c, absl::Time deadline, bool get,
                                             absl::Span<const std::string> keys,
                                             absl::Duration timeout) {
    EMBER_ASSIGN_OR_RETURN(auto status, c.ReadStatus(max_message_bytes, deadline));
    auto [code, detail] = std::move(status);
    if (code == absl::StatusCode::kOk) {
      if (!get) return std::string();
      return c.ReadBytes(max_message_bytes, deadline);
    }
    if (code == absl::StatusCode::kDeadlineExceeded) {
      std::vector<std::string> missing;
      for (size_t at = 0; at + sizeof(uint64_t) <= detail.size(); at += sizeof(uint64_t)) {
        uint64_t index = 0;
        std::memcpy(&index, detail.data() + at, sizeof(index));
        if (index < keys.size()) missing.push_back(keys[index]);
      }
      return internal::MissingKeysError(name, missing, timeout);
    }
    if (code == absl::StatusCode::kUnavailable) return Transport(detail);
    return absl::Status(code, absl::StrCat(name, ": ", detail));
  }

  // Waits on the server until every key of `keys` (their wire forms in
  // `wire_keys`) is there, up to `timeout`; a get also returns the first
  // key's value.
  absl::StatusOr<std::string> WaitFor(std::string_view op, absl::Span<const std::string> keys,
                                      const std::vector<std::string>& wire_keys,
                                      absl::Duration timeout, bool get) {
    timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
    if (ember) {
      auto request = [&](absl::Duration t) {
        std::string r;
        if (get) {
          wire::PutQuery(r, Query::kEmberGet);
          wire::PutBytes(r, wire_keys[0]);
        } else {
          wire::PutQuery(r, Query::kEmberWait);
          wire::PutValue<uint64_t>(r, wire_keys.size());
          for (const std::string& k : wire_keys) wire::PutBytes(r, k);
        }
        wire::PutValue<int64_t>(r, absl::ToInt64Microseconds(t));
        return r;
      };
      absl::StatusOr<std::string> now =
          OnPrimary(op, CallTimeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<std::string> {
            EMBER_RETURN_IF_ERROR(c.Send(request(absl::ZeroDuration()), deadline));
            return EmberWaitReply(c, deadline, get, keys, timeout);
          });
      if (!absl::IsDeadlineExceeded(now.status()) || timeout == absl::ZeroDuration()) return now;
      return OnSide(op, timeout + kReplyGrace, [&](Connection& c, absl::Time deadline, bool&) -> absl::StatusOr<std::string> {
        EMBER_RETURN_IF_ERROR(c.Send(request(timeout), deadline));
        return EmberWaitReply(c, deadline, get, keys, timeout);
      });
    }
    // PyTorch's server: CHECK, then WAIT by the client's clock.
    auto check = [&](const std::vector<std::string>& which) -> absl::StatusOr<bool> {
      return OnPrimary(op, CallTimeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<bool> {
        std::string r;
        wire::PutQuery(r, Query::kCheck);
        wire::PutValue<uint64_t>(r, which.size());
        for (const std::string& k : which) wire::PutBytes(r, k);
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        EMBER_ASSIGN_OR_RETURN(uint8_t ready, c.Read<uint8_t>(deadline));
        return ready == static_cast<uint8_t>(wire::CheckReply::kReady);
      });
    };
    auto fetch = [&](Connection& c, absl::Time deadline) -> absl::StatusOr<std::string> {
      if (!get) return std::string();
      std::string r;
      wire::PutQuery(r, Query::kGet);
      wire::PutBytes(r, wire_keys[0]);
      EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
      return c.ReadBytes(max_message_bytes, deadline);
    };
    EMBER_ASSIGN_OR_RETURN(bool ready, check(wire_keys));
    if (ready) return OnPrimary(op, CallTimeout(), fetch);
    bool timed_out = false;
    if (timeout > absl::ZeroDuration()) {
      absl::StatusOr<std::string> waited =
          OnSide(op, timeout, [&](Connection& c, absl::Time deadline, bool& keep) -> absl::StatusOr<std::string> {
            std::string r;
            wire::PutQuery(r, Query::kWait);
            wire::PutValue<uint64_t>(r, wire_keys.size());
            for (const std::string& k : wire_keys) wire::PutBytes(r, k);
            EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
            absl::StatusOr<uint8_t> reply = c.Read<uint8_t>(deadline);
            if (absl::IsDeadlineExceeded(reply.status())) {
              keep = false;  // closing it ends the wait on the server
              timed_out = true;
              return std::string();
            }
            EMBER_RETURN_IF_ERROR(reply.status());
            return fetch(c, absl::Now() + CallTimeout());
          });
      if (!timed_out) return waited;
    }
    // Which keys are missing: one CHECK each, sent together.
    absl::StatusOr<std::vector<std::string>> missing = OnPrimary(
        op, CallTimeout(),
        [&](Connection& c, absl::Time deadline) -> absl::StatusOr<std::vector<std::string>> {
          std::string r;
          for (const std::string& k : wire_keys) {
            wire::PutQuery(r, Query::kCheck);
            wire::PutValue<uint64_t>(r, 1);
            wire::PutBytes(r, k);
          }
          EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
          std::vector<std::string> absent;
          for (size_t i = 0; i < keys.size(); ++i) {
            EMBER_ASSIGN_OR_RETURN(uint8_t ready, c.Read<uint8_t>(deadline));
            if (ready != static_cast<uint8_t>(wire::CheckReply::kReady)) absent.push_back(keys[i]);
          }
          return absent;
        });
    if (!missing.ok()) return missing.status();
    if (missing->empty()) return WaitFor(op, keys, wire_keys, absl::ZeroDuration(), get);
    return internal::MissingKeysError(name, *missing, timeout);
  }

  // Sends `request`, which has no reply, on the primary connection.
  absl::Status Post(std::string_view op, const std::string& request) {
    return OnPrimary(
        op, CallTimeout(),
        [&](Connection& c, absl::Time deadline) { return c.Send(request, deadline); },
        /*check_first=*/true);
  }
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStore::~TcpStore() = default;

int TcpStore::port() const { return impl_->port; }
const std::string& TcpStore::host() const { return impl_->host; }
bool TcpStore::server_is_ember() const { return impl_->ember; }

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::create(const TcpStoreOptions& options) {
  if (options.host.empty())
    return absl::InvalidArgumentError("TcpStore: empty host; pass the server's address");
  if (options.port < 0 || options.port > 65535 || (options.port == 0 && !options.is_server)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: port ", options.port, " is not a server port in [1, 65535]"));
  }
  if (options.max_message_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStore: max_message_bytes=", options.max_message_bytes, " must be at least 4096"));
  }
  if (options.num_workers.has_value() && *options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: num_workers=", *options.num_workers, " must be at least 1"));
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
  impl->name = ipv6_literal ? absl::StrCat("TcpStore [", impl->host, "]:", impl->port)
                            : absl::StrCat("TcpStore ", impl->host, ":", impl->port);
  {
    EMBER_ASSIGN_OR_RETURN(
        Opened opened,
        Open(impl->host, impl->port,
             absl::Now() + std::clamp(options.timeout, absl::Milliseconds(1), kLongestWait),
             impl->name));
    impl->ember = opened.ember;
    absl::MutexLock lock(&impl->primary_mu);
    impl->primary = std::move(opened.connection);
  }
  auto store = std::unique_ptr<TcpStore>(new TcpStore(std::move(impl)));
  store->set_timeout(options.timeout);
  store->impl_->owner = store.get();
  if (options.num_workers.has_value() && options.wait_for_workers) {
    // As torch's TCPStore: every client counts itself in; the server's own
    // waits for the rest.
    const absl::Time deadline = absl::Now() + options.timeout;
    EMBER_ASSIGN_OR_RETURN(int64_t joined, store->RawAdd(kInitKey, 1));
    while (options.is_server && joined < *options.num_workers) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            store->impl_->name, ": timed out after ", absl::FormatDuration(options.timeout),
            " waiting for clients: ", joined, " of ", *options.num_workers, " joined"));
      }
      absl::SleepFor(absl::Milliseconds(10));
      EMBER_ASSIGN_OR_RETURN(joined, store->RawAdd(kInitKey, 0));
    }
  }
  return store;
}

absl::StatusOr<int64_t> TcpStore::add_to_worker_count(int64_t delta) {
  return RawAdd(kInitKey, delta);
}

absl::StatusOr<int64_t> TcpStore::RawAdd(const std::string& wire_key, int64_t delta) {
  const bool ember = impl_->ember;
  return impl_->OnPrimary(
      "add", timeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<int64_t> {
        std::string r;
        wire::PutQuery(r, ember ? Query::kEmberAdd : Query::kAdd);
        wire::PutBytes(r, wire_key);
        wire::PutValue<int64_t>(r, delta);
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        if (ember) {
          EMBER_ASSIGN_OR_RETURN(auto status, c.ReadStatus(impl_->max_message_bytes, deadline));
          auto [code, detail] = std::move(status);
          const std::string_view key = std::string_view(wire_key).substr(
              wire_key.rfind(kKeyPrefix, 0) == 0 ? 1 : 0);
          if (code == absl::StatusCode::kDataLoss) return internal::ParseCounter(key, detail).status();
          if (code == absl::StatusCode::kOutOfRange) {
            int64_t value = 0;
            if (!absl::SimpleAtoi(detail, &value)) return absl::DataLossError(detail);
            return internal::AddToCounter(key, value, delta).status();
          }
          if (code != absl::StatusCode::kOk) return absl::Status(code, detail);
        }
        absl::StatusOr<int64_t> value = c.Read<int64_t>(deadline);
        if (!ember && value.status().code() == absl::StatusCode::kUnavailable) {
          return Transport(absl::StrCat(value.status().message(),
                                        " (PyTorch's server closes the connection on an add to a "
                                        "value that is not a decimal integer)"));
        }
        return value;
      });
}

absl::Status TcpStore::set(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, value.size()));
  std::string r;
  wire::PutQuery(r, Query::kSet);
  wire::PutBytes(r, Wire(key));
  wire::PutBytes(r, value);
  return impl_->Post("set", r);
}

absl::StatusOr<std::string> TcpStore::get(std::string_view key, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  const std::string user_key(key);
  return impl_->WaitFor("get", absl::MakeConstSpan(&user_key, 1), {Wire(key)}, timeout, true);
}

absl::StatusOr<int64_t> TcpStore::add(std::string_view key, int64_t delta) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  return RawAdd(Wire(key), delta);
}

absl::StatusOr<std::string> TcpStore::compare_set(std::string_view key, std::string_view expected,
                                                 std::string_view desired) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, expected.size() + desired.size()));
  return impl_->OnPrimary("compare_set", timeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<std::string> {
    std::string r;
    wire::PutQuery(r, Query::kCompareSet);
    wire::PutBytes(r, Wire(key));
    wire::PutBytes(r, expected);
    wire::PutBytes(r, desired);
    EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
    return c.ReadBytes(impl_->max_message_bytes, deadline);
  });
}

absl::Status TcpStore::wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  std::vector<std::string> wire_keys;
  wire_keys.reserve(keys.size());
  size_t bytes = 0;
  for (const std::string& key : keys) {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    bytes += key.size() + 9;
    wire_keys.push_back(Wire(key));
  }
  if (keys.empty()) return absl::OkStatus();
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(keys.front(), bytes));
  return impl_->WaitFor("wait", keys, wire_keys, timeout, false).status();
}

absl::StatusOr<bool> TcpStore::delete_key(std::string_view key) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  return impl_->OnPrimary(
      "delete_key", timeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<bool> {
        std::string r;
        wire::PutQuery(r, Query::kDeleteKey);
        wire::PutBytes(r, Wire(key));
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        EMBER_ASSIGN_OR_RETURN(int64_t deleted, c.Read<int64_t>(deadline));
        return deleted == 1;
      });
}

absl::StatusOr<int64_t> TcpStore::num_keys() {
  return impl_->OnPrimary("num_keys", timeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<int64_t> {
    std::string r;
    wire::PutQuery(r, Query::kNumKeys);
    EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
    return c.Read<int64_t>(deadline);
  });
}

absl::StatusOr<bool> TcpStore::check(absl::Span<const std::string> keys) {
  size_t bytes = 0;
  for (const std::string& key : keys) {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    bytes += key.size() + 9;
  }
  if (!keys.empty()) EMBER_RETURN_IF_ERROR(impl_->CheckSize(keys.front(), bytes));
  return impl_->OnPrimary(
      "check", timeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<bool> {
        std::string r;
        wire::PutQuery(r, Query::kCheck);
        wire::PutValue<uint64_t>(r, keys.size());
        for (const std::string& key : keys) wire::PutBytes(r, Wire(key));
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        EMBER_ASSIGN_OR_RETURN(uint8_t ready, c.Read<uint8_t>(deadline));
        return ready == static_cast<uint8_t>(wire::CheckReply::kReady);
      });
}

absl::Status TcpStore::append(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, value.size()));
  std::string r;
  wire::PutQuery(r, Query::kAppend);
  wire::PutBytes(r, Wire(key));
  wire::PutBytes(r, value);
  return impl_->Post("append", r);
}

absl::StatusOr<std::vector<std::string>> TcpStore::multi_get(absl::Span<const std::string> keys,
                                                             absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(wait(keys, timeout));
  return impl_->OnPrimary(
      "multi_get", this->timeout(),
      [&](Connection& c, absl::Time deadline) -> absl::StatusOr<std::vector<std::string>> {
        std::string r;
        wire::PutQuery(r, Query::kMultiGet);
        wire::PutValue<uint64_t>(r, keys.size());
        for (const std::string& key : keys) wire::PutBytes(r, Wire(key));
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        std::vector<std::string> values;
        values.reserve(keys.size());
        for (size_t i = 0; i < keys.size(); ++i) {
          EMBER_ASSIGN_OR_RETURN(std::string value, c.ReadBytes(impl_->max_message_bytes, deadline));
          values.push_back(std::move(value));
        }
        return values;
      });
}

absl::Status TcpStore::multi_set(absl::Span<const std::string> keys,
                                 absl::Span<const std::string> values) {
  EMBER_RETURN_IF_ERROR(internal::CheckOneValuePerKey(keys.size(), values.size()));
  size_t bytes = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(keys[i]));
    bytes += keys[i].size() + values[i].size() + 17;
  }
  if (keys.empty()) return absl::OkStatus();
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(keys.front(), bytes));
  std::string r;
  wire::PutQuery(r, Query::kMultiSet);
  wire::PutValue<uint64_t>(r, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    wire::PutBytes(r, Wire(keys[i]));
    wire::PutBytes(r, values[i]);
  }
  return impl_->Post("multi_set", r);
}

absl::Status TcpStore::queue_push(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, value.size()));
  std::string r;
  wire::PutQuery(r, Query::kQueuePush);
  wire::PutBytes(r, Wire(key));
  wire::PutBytes(r, value);
  return impl_->Post("queue_push", r);
}

absl::StatusOr<std::string> TcpStore::queue_pop(std::string_view key, bool block,
                                               absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  const std::string wire_key = Wire(key);
  const std::string user_key(key);
  timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<std::optional<std::string>> popped = impl_->OnPrimary(
        "queue_pop", this->timeout(),
        [&](Connection& c, absl::Time reply_by) -> absl::StatusOr<std::optional<std::string>> {
          std::string r;
          wire::PutQuery(r, Query::kQueuePop);
          wire::PutBytes(r, wire_key);
          EMBER_RETURN_IF_ERROR(c.Send(r, reply_by));
          EMBER_ASSIGN_OR_RETURN(int64_t length, c.Read<int64_t>(reply_by));
          if (length <= 0) return std::optional<std::string>();
          EMBER_ASSIGN_OR_RETURN(std::string value, c.ReadBytes(impl_->max_message_bytes, reply_by));
          return std::optional<std::string>(std::move(value));
        });
    if (!popped.ok()) return popped.status();
    if (popped->has_value()) return std::move(**popped);
    if (!block) {
      return absl::NotFoundError(absl::StrCat(impl_->name, ": queue '",
                                              internal::KeyForMessage(key), "' is empty"));
    }
    // Wait for a push (which wakes one waiter), then try again: another
    // client may have taken the value first.
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> pushed = impl_->WaitFor(
        "queue_pop", absl::MakeConstSpan(&user_key, 1), {wire_key}, left, false);
    if (absl::IsDeadlineExceeded(pushed.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          impl_->name, ": queue '", internal::KeyForMessage(key), "' stayed empty for ",
          absl::FormatDuration(timeout)));
    }
    if (!pushed.ok()) return pushed.status();
  }
}

absl::StatusOr<int64_t> TcpStore::queue_len(std::string_view key) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  return impl_->OnPrimary("queue_len", timeout(), [&](Connection& c, absl::Time deadline) -> absl::StatusOr<int64_t> {
    std::string r;
    wire::PutQuery(r, Query::kQueueLen);
    wire::PutBytes(r, Wire(key));
    EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
    return c.Read<int64_t>(deadline);
  });
}

absl::StatusOr<std::vector<std::string>> TcpStore::list_keys() {
  return impl_->OnPrimary(
      "list_keys", timeout(),
      [&](Connection& c, absl::Time deadline) -> absl::StatusOr<std::vector<std::string>> {
        std::string r;
        wire::PutQuery(r, Query::kListKeys);
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        EMBER_ASSIGN_OR_RETURN(int64_t count, c.Read<int64_t>(deadline));
        if (count < 0 || static_cast<uint64_t>(count) > uint64_t{1} << 32)
          return Transport(absl::StrCat("the server announced ", count, " keys"));
        std::vector<std::string> keys;
        for (int64_t i = 0; i < count; ++i) {
          absl::StatusOr<std::string> key = c.ReadBytes(impl_->max_message_bytes, deadline);
          if (!key.ok()) return key.status();
          keys.push_back(absl::StartsWith(*key, kKeyPrefix) ? key->substr(1) : *key);
        }
        return keys;
      });
}

absl::Status TcpStore::barrier(std::string_view key, int64_t world_size, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(impl_->CheckSize(key, 0));
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl_->name, ": barrier world_size=", world_size, " must be at least 1"));
  }
  timeout = std::clamp(timeout, absl::ZeroDuration(), kLongestWait);
  const std::string wire_key = Wire(key);
  bool timed_out = false;
  absl::StatusOr<bool> done = impl_->OnSide(
      "barrier", timeout, [&](Connection& c, absl::Time deadline, bool& keep) -> absl::StatusOr<bool> {
        std::string r;
        wire::PutQuery(r, Query::kBarrier);
        wire::PutBytes(r, wire_key);
        wire::PutValue<int64_t>(r, world_size);
        EMBER_RETURN_IF_ERROR(c.Send(r, deadline));
        absl::StatusOr<uint8_t> reply = c.Read<uint8_t>(deadline);
        if (absl::IsDeadlineExceeded(reply.status())) {
          keep = false;  // closing it ends the wait on the server
          timed_out = true;
          return false;
        }
        EMBER_RETURN_IF_ERROR(reply.status());
        return true;
      });
  if (!done.ok()) return done.status();
  if (!timed_out) return absl::OkStatus();
  absl::StatusOr<std::string> arrived = get(key, absl::ZeroDuration());
  return absl::DeadlineExceededError(absl::StrCat(
      impl_->name, ": barrier '", internal::KeyForMessage(key), "' timed out after ",
      absl::FormatDuration(timeout), " with ", arrived.value_or("?"), " of ", world_size,
      " arrived"));
}

}  // namespace ember::distributed
