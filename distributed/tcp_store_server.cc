// TcpStoreServer: the store's server, one event loop on one thread.
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "distributed/store_util.h"
#include "distributed/tcp_store.h"
#include "distributed/tcp_store_wire.h"

// Note [TcpStore protocol]
// The wire is c10d's TCPStore protocol (tcp_store_wire.h has the table), so
// that a PyTorch process is a client of Ember's server, and Ember's client of
// PyTorch's, with nothing in between. A connection begins with VALIDATE and
// its magic number; the server closes a connection whose first request is
// anything else, or that sends none within kHandshakeTimeout. Ember's client
// then sends PING (the nonce must come back: the other end is a TCPStore)
// and CHECKs wire::kExtensionProbeKey, which only Ember's server calls READY,
// in the same write, so the handshake is one round trip.
//
// Where c10d's protocol has no room for Ember's behaviour, Ember's ends use
// three extensions: EMBER_GET and EMBER_WAIT wait on the server with a
// timeout the request carries (one round trip, where c10d's client sends WAIT,
// times out by itself, then sends GET), and EMBER_ADD, which, like them,
// replies with a status: an Add on text (kDataLoss) or past int64
// (kOutOfRange) fails and leaves the connection and the value as they were,
// where c10d's ADD has no error reply. A timed-out wait replies with the
// indices of the keys still missing, so the client words the error as every
// Store does (internal::MissingKeysError) with the keys as its caller wrote
// them. A c10d ADD that cannot be done, a request beyond the limits, an
// unknown query and malformed lengths close that connection only (c10d's
// server closes it too); other connections never notice.
//
// Bounds: a request's strings may add up to max_message_bytes and name
// kMaxKeysPerRequest keys; the parser refuses a larger one from its length
// fields, before its bytes arrive, so no announced size is ever allocated.
// SO_REUSEPORT stays off, so a second server on a port in use fails.
//
// Waits: a wait is indexed by each key it still misses; a write to a key
// completes the waits whose last missing key it was, and a push to a queue
// completes the oldest wait on it (as a pop takes one value). Ember's waits
// carry a deadline, kept in one ordered set that sets the loop's epoll
// timeout; c10d's WAIT and BARRIER have none (the client cancels with
// CANCEL_WAIT or by closing). A connection that closes takes its waits with it.

// Note [TcpStore server limits]
// Whatever clients send, what the server keeps is bounded:
// - a wait holds an index entry and its keys, no thread. Their number is
//   capped server-wide (max_pending_waits), per connection
//   (max_pending_waits_per_connection) and by the bytes of the keys they hold
//   (max_pending_wait_bytes). A wait over a limit is refused at once: Ember's
//   clients get kResourceExhausted naming the limit, PyTorch's a closed
//   connection (c10d has no error reply).
// - a request is bounded as Note [TcpStore protocol] says; what a connection
//   has sent beyond complete requests is at most one request.
// - replies a client does not read pile up to max_buffer_bytes; then the
//   server stops reading that connection until they drain to half.
// - a connection that does not validate within kHandshakeTimeout is closed;
//   TCP keepalive (idle 30 s, then 3 probes 10 s apart) finds peers that
//   vanished without closing, whose waits then end with the connection.
// - out of descriptors (EMFILE), the server stops accepting for
//   kAcceptPause and says so once on stderr, naming the limit; the kernel's
//   backlog holds the callers meanwhile.
// - glibc's malloc keeps freed memory for reuse, so a burst of waits would
//   leave the process that much larger for good. Once waits that held at
//   least kTrimAfterBytes have fallen to a quarter of that peak, the loop
//   calls malloc_trim a second later, which hands the free pages back.

namespace ember::distributed {
namespace {

using wire::Query;

constexpr absl::Duration kHandshakeTimeout = absl::Seconds(20);
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
constexpr absl::Duration kLongestWait = absl::Hours(24 * 100);
constexpr size_t kReadChunk = 64 << 10;
constexpr int kMaxEvents = 1024;
// What a waited-for key costs beyond its bytes (its string, the index entry).
constexpr int64_t kBytesPerKey = 64;
constexpr int64_t kTrimAfterBytes = int64_t{4} << 20;
constexpr absl::Duration kTrimDelay = absl::Seconds(1);

absl::string_view AbslView(std::string_view bytes) {
  return absl::string_view(bytes.data(), bytes.size());
}

// The address of a connected socket's peer, "host:port".
std::string PeerName(int fd) {
  sockaddr_storage addr = {};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return absl::StrCat("[", host, "]:", port);
  }
  auto* in = reinterpret_cast<sockaddr_in*>(&addr);
  inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
  port = ntohs(in->sin_port);
  return absl::StrCat(host, ":", port);
}

struct Connection;

// A wait the server holds for a client: until every key is set (or, for a
// queue, pushed), or its deadline passes.
struct Wait {
  enum class Kind {
    kC10d,       // WAIT: replies STOP_WAITING; no deadline
    kBarrier,    // BARRIER: as kC10d, on its key although the key is set
    kEmberGet,   // replies a status and the first key's value
    kEmberWait,  // replies a status
  };
  Kind kind = Kind::kC10d;
  Connection* connection = nullptr;
  uint64_t sequence = 0;  // the order waits began in (queues wake the oldest)
  std::vector<std::string> keys;
  size_t missing = 0;  // distinct keys not yet there
  absl::Time deadline = absl::InfiniteFuture();
  int64_t bytes = 0;  // what it counts against max_pending_wait_bytes
};

struct Connection {
  uint64_t id = 0;
  base::UniqueFd fd;
  std::string peer;
  std::string in;   // the start of a request, not yet complete
  std::string out;  // replies not yet sent, from out_sent on
  size_t out_sent = 0;
  bool validated = false;
  absl::Time handshake_deadline;
  bool close_now = false;      // set while handling a request: close once it returns
  bool parse_pending = false;  // requests left in `in` while replies were backed up
  uint32_t events = 0;     // the epoll events asked for now
  absl::flat_hash_set<Wait*> waits;

  size_t unsent() const { return out.size() - out_sent; }
};

class Loop {
 public:
  explicit Loop(const TcpStoreServerOptions& options) : options_(options) {}
  ~Loop() {
    Stop();
    for (auto& [id, connection] : connections_) {
      for (Wait* wait : connection->waits) delete wait;
    }
  }

  absl::Status Listen();
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    thread_.join();
  }

  int port() const { return port_; }
  int64_t num_pending_waits() const { return pending_waits_.load(); }
  int64_t num_connections() const { return open_connections_.load(); }

 private:
  void Run();
  void Accept();
  void Read(Connection& connection);
  void Process(Connection& connection, std::string_view bytes);
  void Flush(Connection& connection);
  void Drain();
  void Close(Connection& connection);
  void UpdateEvents(Connection& connection);
  void Handle(Connection& connection, const wire::Request& request);
  void Reply(Connection& connection, std::string_view bytes);

  bool Ready(std::string_view key) const;
  void PutValueAt(std::string& reply, std::string_view key) const;
  std::string DoneReply(const Wait& wait) const;
  void Written(std::string_view key);
  void Pushed(std::string_view key);
  void StartWait(Connection& connection, Wait::Kind kind, std::vector<std::string> keys,
                 absl::Duration timeout);
  std::string Admit(const Connection& connection, const Wait& wait) const;
  void Complete(Wait* wait);
  void Expire(Wait* wait);
  void Unlink(Wait* wait);
  void CancelC10dWaits(Connection& connection);
  void Shutdown();
  absl::Time NextTimer() const;

  const TcpStoreServerOptions options_;
  base::UniqueFd epoll_;
  base::UniqueFd listener_;
  base::UniqueFd wake_;  // an eventfd: Stop() writes it
  int port_ = 0;
  std::thread thread_;

  // The loop thread's alone:
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t next_id_ = 2;  // 0: the listener, 1: wake_
  std::set<std::pair<absl::Time, uint64_t>> handshakes_;  // unvalidated, by deadline
  absl::flat_hash_map<std::string, std::string> data_;
  absl::flat_hash_map<std::string, std::deque<std::string>> queues_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<Wait*>> waiting_;  // by missing key
  std::set<std::pair<absl::Time, Wait*>> deadlines_;                     // Ember's waits
  uint64_t next_sequence_ = 0;
  int64_t waits_ = 0;
  int64_t wait_bytes_ = 0;
  int64_t wait_bytes_peak_ = 0;
  absl::Time trim_at_ = absl::InfiniteFuture();
  absl::Time accept_paused_until_ = absl::InfinitePast();
  bool said_out_of_descriptors_ = false;
  std::vector<uint64_t> dirty_;   // connections with replies to send
  std::vector<uint64_t> resume_;  // connections to parse again (reading resumed)
  std::vector<char> read_buffer_ = std::vector<char>(kReadChunk);

  std::atomic<int64_t> pending_waits_{0};
  std::atomic<int64_t> open_connections_{0};
};

// The listening socket for `options`: an IPv6 socket that takes IPv4 too for
// "[::]" (or IPv4 alone where IPv6 is missing), else the address given.
absl::StatusOr<base::UniqueFd> ListenOn(const std::string& bind_address, int port) {
  std::string host = bind_address;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  const bool any = host.empty() || host == "::";
  int rc = getaddrinfo(any ? "::" : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 && any) rc = getaddrinfo("0.0.0.0", service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStoreServer: bind_address '", bind_address,
                                                   "' does not resolve: ", gai_strerror(rc)));
  }
  int err = 0;
  base::UniqueFd fd;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    base::UniqueFd candidate(
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!candidate.valid()) {
      err = errno;
      continue;
    }
    int one = 1, zero = 0;
    setsockopt(candidate.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6)
      setsockopt(candidate.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(candidate.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        listen(candidate.get(), SOMAXCONN) != 0) {
      err = errno;
      continue;
    }
    fd = std::move(candidate);
    break;
  }
  freeaddrinfo(found);
  if (fd.valid()) return fd;
  std::string why = err == EADDRINUSE ? absl::StrCat("port ", port, " is already in use")
                                      : absl::StrCat("binding port ", port, " failed: ",
                                                     strerror(err));
  return absl::UnavailableError(absl::StrCat(
      "TcpStore: cannot serve on ", bind_address, ":", port, ": ", why,
      "; pick another port (MASTER_PORT) or stop the process using it"));
}

absl::Status Loop::Listen() {
  absl::StatusOr<base::UniqueFd> listener = ListenOn(options_.bind_address, options_.port);
  if (!listener.ok()) return listener.status();
  listener_ = std::move(*listener);
  sockaddr_storage addr = {};
  socklen_t len = sizeof(addr);
  getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_.valid() || !wake_.valid())
    return absl::ErrnoToStatus(errno, "TcpStoreServer: epoll or eventfd");
  epoll_event event = {};
  event.events = EPOLLIN;
  event.data.u64 = 0;
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &event);
  event.data.u64 = 1;
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &event);
  return absl::OkStatus();
}

absl::Time Loop::NextTimer() const {
  absl::Time next = trim_at_;
  if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
  if (!handshakes_.empty()) next = std::min(next, handshakes_.begin()->first);
  if (accept_paused_until_ != absl::InfinitePast()) next = std::min(next, accept_paused_until_);
  return next;
}

void Loop::Run() {
  epoll_event events[kMaxEvents];
  while (true) {
    const absl::Time next = NextTimer();
    int timeout_ms = -1;
    if (next != absl::InfiniteFuture()) {
      absl::Duration left = next - absl::Now();
      timeout_ms = left <= absl::ZeroDuration()
                       ? 0
                       : static_cast<int>(std::min<int64_t>(
                             absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
                             60'000));
    }
    int n = epoll_wait(epoll_.get(), events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == 0) {
        Accept();
        continue;
      }
      if (id == 1) {
        Shutdown();
        return;
      }
      auto it = connections_.find(id);
      if (it == connections_.end()) continue;
      Connection& connection = *it->second;
      if (events[i].events & EPOLLOUT) Flush(connection);
      if (connection.close_now || (events[i].events & EPOLLERR)) {
        Close(connection);
        continue;
      }
      if (events[i].events & (EPOLLIN | EPOLLHUP)) Read(connection);
    }
    Drain();
    const absl::Time now = absl::Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now)
      Expire(deadlines_.begin()->second);
    while (!handshakes_.empty() && handshakes_.begin()->first <= now) {
      auto it = connections_.find(handshakes_.begin()->second);
      handshakes_.erase(handshakes_.begin());
      if (it != connections_.end()) Close(*it->second);
    }
    if (accept_paused_until_ != absl::InfinitePast() && now >= accept_paused_until_) {
      accept_paused_until_ = absl::InfinitePast();
      epoll_event event = {};
      event.events = EPOLLIN;
      event.data.u64 = 0;
      epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
    }
    if (now >= trim_at_) {
      trim_at_ = absl::InfiniteFuture();
      wait_bytes_peak_ = wait_bytes_;
      malloc_trim(0);
    }
    Drain();
  }
}

// Sends the replies that requests of other connections made (a write that
// woke waits), and parses what connections that may read again still hold.
void Loop::Drain() {
  while (!dirty_.empty() || !resume_.empty()) {
    std::vector<uint64_t> dirty;
    dirty.swap(dirty_);
    for (uint64_t id : dirty) {
      auto it = connections_.find(id);
      if (it == connections_.end()) continue;
      Flush(*it->second);
      if (it->second->close_now) Close(*it->second);
    }
    std::vector<uint64_t> resume;
    resume.swap(resume_);
    for (uint64_t id : resume) {
      auto it = connections_.find(id);
      if (it != connections_.end()) Process(*it->second, it->second->in);
    }
  }
}

void Loop::Accept() {
  while (true) {
    int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (!said_out_of_descriptors_) {
          said_out_of_descriptors_ = true;
          std::fprintf(stderr,
                       "TcpStoreServer on port %d: cannot accept more clients (%s, %lld "
                       "connections open); raise the descriptor limit (ulimit -n) for more. "
                       "Callers wait in the backlog meanwhile.\n",
                       port_, strerror(errno), static_cast<long long>(connections_.size()));
        }
        accept_paused_until_ = absl::Now() + kAcceptPause;
        epoll_event event = {};
        event.data.u64 = 0;
        epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
      }
      return;  // EAGAIN: all taken
    }
    int one = 1, idle = 30, interval = 10, probes = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
    auto connection = std::make_unique<Connection>();
    connection->id = next_id_++;
    connection->fd.reset(fd);
    connection->peer = PeerName(fd);
    connection->handshake_deadline = absl::Now() + kHandshakeTimeout;
    connection->events = EPOLLIN;
    epoll_event event = {};
    event.events = EPOLLIN;
    event.data.u64 = connection->id;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) continue;  // fd closes
    handshakes_.emplace(connection->handshake_deadline, connection->id);
    connections_.emplace(connection->id, std::move(connection));
    open_connections_.store(static_cast<int64_t>(connections_.size()));
  }
}

void Loop::UpdateEvents(Connection& connection) {
  uint32_t events = 0;
  const bool backed_up = connection.unsent() > static_cast<size_t>(options_.max_buffer_bytes);
  const bool drained = connection.unsent() <= static_cast<size_t>(options_.max_buffer_bytes / 2);
  const bool was_reading = connection.events & EPOLLIN;
  if (was_reading ? !backed_up : drained) events |= EPOLLIN;
  if (connection.unsent() > 0) events |= EPOLLOUT;
  if (events == connection.events) return;
  connection.events = events;
  epoll_event event = {};
  event.events = events;
  event.data.u64 = connection.id;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, connection.fd.get(), &event);
}

void Loop::Read(Connection& connection) {
  if (!(connection.events & EPOLLIN)) return;  // paused until its replies drain
  ssize_t n = recv(connection.fd.get(), read_buffer_.data(), read_buffer_.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    Close(connection);
    return;
  }
  // Parsed where it landed when nothing is left over from earlier reads.
  std::string_view received(read_buffer_.data(), n);
  if (!connection.in.empty()) {
    connection.in.append(received);
    received = connection.in;
  }
  Process(connection, received);
}

// Handles the complete requests at the front of `bytes` (which is
// connection.in or the read buffer) and keeps the rest in connection.in.
void Loop::Process(Connection& connection, std::string_view bytes) {
  size_t pos = 0;
  wire::Request request;
  std::string error;
  while (!connection.close_now) {
    // Stop parsing while the client does not read its replies; Flush
    // resumes once they drain.
    if (connection.unsent() > static_cast<size_t>(options_.max_buffer_bytes)) {
      connection.parse_pending = true;
      break;
    }
    size_t consumed = 0;
    wire::Parse parse = wire::ParseRequest(bytes.substr(pos), options_.max_message_bytes, request,
                                           consumed, error);
    if (parse == wire::Parse::kIncomplete) break;
    if (parse == wire::Parse::kInvalid) {
      connection.close_now = true;
      break;
    }
    Handle(connection, request);
    pos += consumed;
  }
  if (connection.close_now) {
    Flush(connection);
    Close(connection);
    return;
  }
  if (bytes.data() == connection.in.data()) {
    connection.in.erase(0, pos);
  } else {
    connection.in.assign(bytes.substr(pos));
  }
  if (connection.in.empty() && connection.in.capacity() > 4096) std::string().swap(connection.in);
  Flush(connection);
}

void Loop::Flush(Connection& connection) {
  while (connection.unsent() > 0) {
    ssize_t n = send(connection.fd.get(), connection.out.data() + connection.out_sent,
                     connection.unsent(), MSG_NOSIGNAL);
    if (n > 0) {
      connection.out_sent += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    connection.close_now = true;  // the peer is gone; the caller closes
    return;
  }
  if (connection.unsent() == 0) {
    connection.out.clear();
    connection.out_sent = 0;
    if (connection.out.capacity() > 4096) std::string().swap(connection.out);
  } else if (connection.out_sent > kReadChunk && connection.out_sent * 2 > connection.out.size()) {
    connection.out.erase(0, connection.out_sent);
    connection.out_sent = 0;
  }
  UpdateEvents(connection);
  // Reading again: the requests left while replies were backed up come first.
  if (connection.parse_pending && (connection.events & EPOLLIN)) {
    connection.parse_pending = false;
    resume_.push_back(connection.id);
  }
}

void Loop::Close(Connection& connection) {
  std::vector<Wait*> waits(connection.waits.begin(), connection.waits.end());
  for (Wait* wait : waits) {
    Unlink(wait);
    delete wait;
  }
  if (!connection.validated) handshakes_.erase({connection.handshake_deadline, connection.id});
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, connection.fd.get(), nullptr);
  connections_.erase(connection.id);  // closes the socket
  open_connections_.store(static_cast<int64_t>(connections_.size()));
}

void Loop::Reply(Connection& connection, std::string_view bytes) {
  connection.out.append(bytes);
}

bool Loop::Ready(std::string_view key) const {
  if (data_.contains(AbslView(key))) return true;
  auto queue = queues_.find(AbslView(key));
  return queue != queues_.end() && !queue->second.empty();
}

// The value at `key`, "" when absent (as c10d's GET replies).
void Loop::PutValueAt(std::string& reply, std::string_view key) const {
  auto it = data_.find(AbslView(key));
  wire::PutBytes(reply, it == data_.end() ? std::string_view() : std::string_view(it->second));
}

// The reply of a wait whose keys are all there.
std::string Loop::DoneReply(const Wait& wait) const {
  std::string reply;
  if (wait.kind == Wait::Kind::kC10d || wait.kind == Wait::Kind::kBarrier) {
    wire::PutU8(reply, static_cast<uint8_t>(wire::WaitReply::kStopWaiting));
    return reply;
  }
  wire::PutU8(reply, 0);
  if (wait.kind == Wait::Kind::kEmberGet) PutValueAt(reply, wait.keys[0]);
  return reply;
}

void Loop::Handle(Connection& connection, const wire::Request& request) {
  if (!connection.validated) {
    if (request.query != Query::kValidate || request.word != wire::kValidationMagic) {
      connection.close_now = true;
      return;
    }
    connection.validated = true;
    handshakes_.erase({connection.handshake_deadline, connection.id});
    return;
  }
  std::string reply;
  switch (request.query) {
    case Query::kValidate:
      if (request.word != wire::kValidationMagic) connection.close_now = true;
      return;
    case Query::kPing:
      wire::PutValue<uint32_t>(reply, request.word);
      break;
    case Query::kSet:
      data_[AbslView(request.key)] = std::string(request.value);
      Written(request.key);
      return;
    case Query::kMultiSet:
      for (size_t i = 0; i < request.keys.size(); ++i) {
        data_[AbslView(request.keys[i])] = std::string(request.values[i]);
        Written(request.keys[i]);
      }
      return;
    case Query::kAppend:
      data_[AbslView(request.key)].append(request.value);
      Written(request.key);
      return;
    case Query::kCompareSet: {
      auto it = data_.find(AbslView(request.key));
      if (it == data_.end()) {
        if (request.value.empty()) {
          data_.emplace(std::string(request.key), std::string(request.value2));
          Written(request.key);
          wire::PutBytes(reply, request.value2);
        } else {
          wire::PutBytes(reply, request.value);  // nothing set: the expected value back
        }
      } else {
        if (it->second == request.value) {
          it->second = std::string(request.value2);
          wire::PutBytes(reply, it->second);
          Written(request.key);
        } else {
          wire::PutBytes(reply, it->second);
        }
      }
      break;
    }
    case Query::kGet:
      PutValueAt(reply, request.key);
      break;
    case Query::kMultiGet:
      for (std::string_view key : request.keys) PutValueAt(reply, key);
      break;
    case Query::kAdd:
    case Query::kEmberAdd: {
      const bool ember = request.query == Query::kEmberAdd;
      auto it = data_.find(AbslView(request.key));
      int64_t value = 0;
      absl::Status failed;
      if (it != data_.end()) {
        absl::StatusOr<int64_t> counter = internal::ParseCounter(request.key, it->second);
        if (counter.ok()) {
          absl::StatusOr<int64_t> sum = internal::AddToCounter(request.key, *counter, request.number);
          if (sum.ok())
            value = *sum;
          else
            failed = sum.status();
        } else {
          failed = counter.status();
        }
      } else {
        value = request.number;
      }
      if (!failed.ok()) {
        if (!ember) {
          connection.close_now = true;  // c10d's ADD has no error reply
          return;
        }
        wire::PutStatus(reply, static_cast<uint8_t>(failed.code()), it->second);
        break;
      }
      data_[AbslView(request.key)] = std::to_string(value);
      Written(request.key);
      if (ember) wire::PutU8(reply, 0);
      wire::PutValue<int64_t>(reply, value);
      break;
    }
    case Query::kCheck: {
      bool all = true;
      for (std::string_view key : request.keys) {
        all = all && (key == wire::kExtensionProbeKey || Ready(key));
      }
      wire::PutU8(reply, static_cast<uint8_t>(all ? wire::CheckReply::kReady
                                                  : wire::CheckReply::kNotReady));
      break;
    }
    case Query::kNumKeys:
      wire::PutValue<int64_t>(reply, static_cast<int64_t>(data_.size()));
      break;
    case Query::kDeleteKey:
      wire::PutValue<int64_t>(reply, static_cast<int64_t>(data_.erase(AbslView(request.key))));
      break;
    case Query::kListKeys:
      wire::PutValue<int64_t>(reply, static_cast<int64_t>(data_.size()));
      for (const auto& [key, value] : data_) wire::PutBytes(reply, key);
      break;
    case Query::kQueuePush: {
      queues_[AbslView(request.key)].emplace_back(request.value);
      Pushed(request.key);
      return;
    }
    case Query::kQueuePop: {
      auto it = queues_.find(AbslView(request.key));
      const int64_t length = it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
      wire::PutValue<int64_t>(reply, length);
      if (length > 0) {
        wire::PutBytes(reply, it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      break;
    }
    case Query::kQueueLen: {
      auto it = queues_.find(AbslView(request.key));
      wire::PutValue<int64_t>(reply, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case Query::kWait:
      StartWait(connection, Wait::Kind::kC10d,
                std::vector<std::string>(request.keys.begin(), request.keys.end()),
                absl::InfiniteDuration());
      return;
    case Query::kEmberWait:
      StartWait(connection, Wait::Kind::kEmberWait,
                std::vector<std::string>(request.keys.begin(), request.keys.end()),
                absl::Microseconds(request.number));
      return;
    case Query::kEmberGet:
      StartWait(connection, Wait::Kind::kEmberGet, {std::string(request.key)},
                absl::Microseconds(request.number));
      return;
    case Query::kBarrier: {
      // Counts the caller in; the last one wakes everyone at the key.
      std::string& count = data_[AbslView(request.key)];
      int64_t arrived = 1;
      if (!count.empty() && !absl::SimpleAtoi(count, &arrived)) arrived = 0;
      if (!count.empty()) ++arrived;
      count = std::to_string(arrived);
      if (arrived >= request.number) {
        Written(request.key);
        wire::PutU8(reply, static_cast<uint8_t>(wire::WaitReply::kStopWaiting));
        break;
      }
      // Until the last arrival's write wakes the key.
      StartWait(connection, Wait::Kind::kBarrier, {std::string(request.key)},
                absl::InfiniteDuration());
      return;
    }
    case Query::kCancelWait:
      CancelC10dWaits(connection);
      wire::PutU8(reply, static_cast<uint8_t>(wire::WaitReply::kWaitCanceled));
      break;
  }
  Reply(connection, reply);
}

void Loop::StartWait(Connection& connection, Wait::Kind kind, std::vector<std::string> keys,
                     absl::Duration timeout) {
  auto wait = std::make_unique<Wait>();
  wait->kind = kind;
  wait->connection = &connection;
  wait->sequence = next_sequence_++;
  wait->keys = std::move(keys);
  const bool c10d = kind == Wait::Kind::kC10d || kind == Wait::Kind::kBarrier;
  const bool barrier = kind == Wait::Kind::kBarrier;
  std::vector<std::string_view> missing;
  {
    absl::flat_hash_set<absl::string_view> seen;
    for (const std::string& key : wait->keys) {
      if ((barrier || !Ready(key)) && seen.insert(AbslView(key)).second) missing.push_back(key);
    }
  }
  std::string reply;
  if (missing.empty()) {
    Reply(connection, DoneReply(*wait));
    return;
  }
  if (!c10d && timeout <= absl::ZeroDuration()) {
    Expire(wait.release());
    return;
  }
  wait->bytes = static_cast<int64_t>(sizeof(Wait));
  for (const std::string& key : wait->keys) wait->bytes += static_cast<int64_t>(key.size()) + kBytesPerKey;
  if (std::string refused = Admit(connection, *wait); !refused.empty()) {
    if (c10d) {
      connection.close_now = true;  // c10d has no error reply
      return;
    }
    wire::PutStatus(reply, static_cast<uint8_t>(absl::StatusCode::kResourceExhausted), refused);
    Reply(connection, reply);
    return;
  }
  wait->missing = missing.size();
  Wait* raw = wait.release();
  for (std::string_view key : missing) waiting_[AbslView(key)].insert(raw);
  if (!c10d) {
    raw->deadline = absl::Now() + std::min(timeout, kLongestWait);
    deadlines_.emplace(raw->deadline, raw);
  }
  connection.waits.insert(raw);
  ++waits_;
  wait_bytes_ += raw->bytes;
  wait_bytes_peak_ = std::max(wait_bytes_peak_, wait_bytes_);
  pending_waits_.store(waits_);
}

// Why one more wait does not fit the limits (Note [TcpStore server limits]);
// empty when it fits.
std::string Loop::Admit(const Connection& connection, const Wait& wait) const {
  auto refuse = [](std::string what) {
    return absl::StrCat("the store's server refuses this wait: ", what,
                        "; finish or cancel earlier waits, or raise the limit in "
                        "TcpStoreServerOptions (see distributed/README.md)");
  };
  if (waits_ >= options_.max_pending_waits) {
    return refuse(absl::StrCat(waits_, " waits are pending, max_pending_waits=",
                               options_.max_pending_waits));
  }
  const int64_t mine = static_cast<int64_t>(connection.waits.size());
  if (mine >= options_.max_pending_waits_per_connection) {
    return refuse(absl::StrCat("this connection (", connection.peer, ") has ", mine,
                               " waits pending, max_pending_waits_per_connection=",
                               options_.max_pending_waits_per_connection));
  }
  if (wait_bytes_ + wait.bytes > options_.max_pending_wait_bytes) {
    return refuse(absl::StrCat("pending waits hold ", wait_bytes_, " bytes and this one ",
                               wait.bytes, ", max_pending_wait_bytes=",
                               options_.max_pending_wait_bytes));
  }
  return "";
}

void Loop::Written(std::string_view key) {
  auto it = waiting_.find(AbslView(key));
  if (it == waiting_.end()) return;
  absl::flat_hash_set<Wait*> waits = std::move(it->second);
  waiting_.erase(it);
  std::vector<Wait*> done;
  for (Wait* wait : waits) {
    if (--wait->missing == 0) done.push_back(wait);
  }
  std::sort(done.begin(), done.end(),
            [](const Wait* a, const Wait* b) { return a->sequence < b->sequence; });
  for (Wait* wait : done) Complete(wait);
}

void Loop::Pushed(std::string_view key) {
  auto it = waiting_.find(AbslView(key));
  if (it == waiting_.end()) return;
  Wait* oldest = *std::min_element(
      it->second.begin(), it->second.end(),
      [](const Wait* a, const Wait* b) { return a->sequence < b->sequence; });
  it->second.erase(oldest);
  if (it->second.empty()) waiting_.erase(it);
  if (--oldest->missing == 0) Complete(oldest);
}

void Loop::Complete(Wait* wait) {
  Connection& connection = *wait->connection;
  const std::string reply = DoneReply(*wait);
  Unlink(wait);
  delete wait;
  Reply(connection, reply);
  dirty_.push_back(connection.id);
}

void Loop::Expire(Wait* wait) {
  Connection& connection = *wait->connection;
  std::string indices;
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < wait->keys.size(); ++i) {
    if (!Ready(wait->keys[i]) && seen.insert(AbslView(wait->keys[i])).second)
      wire::PutValue<uint64_t>(indices, i);
  }
  std::string reply;
  wire::PutStatus(reply, static_cast<uint8_t>(absl::StatusCode::kDeadlineExceeded), indices);
  if (connection.waits.contains(wait)) Unlink(wait);
  delete wait;
  Reply(connection, reply);
  dirty_.push_back(connection.id);
}

// Drops `wait` from every index; the caller deletes it.
void Loop::Unlink(Wait* wait) {
  for (const std::string& key : wait->keys) {
    auto it = waiting_.find(AbslView(key));
    if (it == waiting_.end()) continue;
    it->second.erase(wait);
    if (it->second.empty()) waiting_.erase(it);
  }
  if (wait->deadline != absl::InfiniteFuture()) deadlines_.erase({wait->deadline, wait});
  wait->connection->waits.erase(wait);
  --waits_;
  wait_bytes_ -= wait->bytes;
  pending_waits_.store(waits_);
  if (wait_bytes_peak_ >= kTrimAfterBytes && wait_bytes_ <= wait_bytes_peak_ / 4 &&
      trim_at_ == absl::InfiniteFuture()) {
    trim_at_ = absl::Now() + kTrimDelay;
  }
}

void Loop::CancelC10dWaits(Connection& connection) {
  std::vector<Wait*> c10d;
  for (Wait* wait : connection.waits) {
    if (wait->kind == Wait::Kind::kC10d || wait->kind == Wait::Kind::kBarrier) c10d.push_back(wait);
  }
  for (Wait* wait : c10d) {
    Unlink(wait);
    delete wait;
  }
}

// Stopping: Ember's waits end with kUnavailable (sent as far as the sockets
// take it without blocking), then every connection closes.
void Loop::Shutdown() {
  for (auto& [id, connection] : connections_) {
    std::vector<Wait*> waits(connection->waits.begin(), connection->waits.end());
    for (Wait* wait : waits) {
      if (wait->kind == Wait::Kind::kEmberGet || wait->kind == Wait::Kind::kEmberWait) {
        std::string reply;
        wire::PutStatus(reply, static_cast<uint8_t>(absl::StatusCode::kUnavailable),
                        "the store's server is shutting down");
        Reply(*connection, reply);
      }
      Unlink(wait);
      delete wait;
    }
    Flush(*connection);
    shutdown(connection->fd.get(), SHUT_RDWR);
  }
  connections_.clear();
  open_connections_.store(0);
}

}  // namespace

struct TcpStoreServer::Impl {
  explicit Impl(const TcpStoreServerOptions& options) : loop(options) {}
  Loop loop;
};

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() { impl_->loop.Stop(); }

int TcpStoreServer::port() const { return impl_->loop.port(); }

int64_t TcpStoreServer::num_pending_waits() const { return impl_->loop.num_pending_waits(); }

int64_t TcpStoreServer::num_connections() const { return impl_->loop.num_connections(); }

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
        {"max_buffer_bytes", options.max_buffer_bytes}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("TcpStoreServer: ", name, "=", value, " must be at least 1"));
    }
  }
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status listening = impl->loop.Listen(); !listening.ok()) return listening;
  impl->loop.Start();
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

}  // namespace ember::distributed
