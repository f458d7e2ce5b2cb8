#include "distributed/gloo/mesh.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/pair.h"
#include "tensor/status_macros.h"

// Note [Two gloo dialects]
// Debian's libgloo (Ember's, and PyTorch 1.13's) and the gloo that PyTorch
// 2.x bundles send the same messages once a pair is connected (the same
// 48-byte preamble of six size_t: nbytes, opcode, slot, offset, length,
// roffset; the same four opcodes), but they meet differently:
// - libgloo gives every pair a listening socket of its own. Under
//   "<group>/0/" rank r writes "rank_<r>" (its host name) and "<r>": the
//   136-byte addresses (sockaddr_storage, then an 8-byte sequence number,
//   unused) of its pairs in rank order, itself left out. Of two ranks, the
//   one whose address compares greater connects to the other's pair
//   socket; nothing is written before the first message.
// - the newer gloo has one listening socket per device. Under
//   "<group>//cpu//0/" rank r writes "<r>": u64 host-name length, host
//   name, u64 address length, the device's 136-byte address, then one
//   8-byte sequence number per rank (the number rank p's connection to r
//   must announce). The side whose address compares greater (IP bytes, then
//   the port field as stored) connects and first writes the 8-byte sequence
//   number it read from the other's record; the listener routes the
//   connection to its pair by that number.
// ConnectFullMesh publishes both: libgloo's keys from libgloo's own pairs,
// and a newer-gloo record for a listening socket of its own whose sequence
// numbers are the peers' ranks. Each peer is then met in its dialect: an
// Ember rank (it wrote its Ember record before any key) and a rank that
// wrote libgloo's keys through libgloo's Pair::connect; a newer-gloo rank
// by connecting (or accepting) here and handing the connected socket to
// the libgloo pair (MeshPair::Adopt), which then runs as if it had made the
// connection itself. Connections that wait on no peer come first (every
// connection this rank initiates to a newer-gloo rank completes in the
// peer's kernel backlog), then libgloo's pairs in rank order as libgloo
// does, then the accepts: no order of peers can deadlock.

namespace ember::distributed::gloo {
namespace {

namespace tcp = ::gloo::transport::tcp;

constexpr size_t kAddressBytes = sizeof(sockaddr_storage) + sizeof(int64_t);
static_assert(kAddressBytes == 136, "gloo's tcp address is a sockaddr_storage and a sequence");

// A libgloo pair that can take over a socket connected elsewhere.
class MeshPair : public tcp::Pair {
 public:
  MeshPair(tcp::Context* context, tcp::Device* device, int rank, std::chrono::milliseconds timeout)
      : tcp::Pair(context, device, rank, timeout) {}

  // Closes the pair's own listening socket and runs on `fd` from now on.
  void Adopt(int fd) {
    std::unique_lock<std::mutex> lock(m_);
    if (fd_ != -1) {
      device_->unregisterDescriptor(fd_, this);
      ::close(fd_);
    }
    fd_ = fd;
    handleConnected();
  }
};

// gloo::rendezvous::Context whose transport context is built here.
class MeshContext : public ::gloo::rendezvous::Context {
 public:
  MeshContext(int rank, int size) : ::gloo::rendezvous::Context(rank, size) {}
  void Adopt(std::shared_ptr<::gloo::transport::Device> device,
             std::shared_ptr<::gloo::transport::Context> transport) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

// gloo's order of two addresses (both dialects): > 0 when `a` connects.
int Compare(const sockaddr_storage& a, const sockaddr_storage& b) {
  int rv = 0;
  if (a.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
    rv = memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
    if (rv == 0) rv = sa->sin_port - sb->sin_port;
  } else {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
    rv = memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
    if (rv == 0) rv = sa->sin6_port - sb->sin6_port;
  }
  return rv;
}

socklen_t Length(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

std::string Describe(const sockaddr_storage& ss) { return tcp::Address(ss).str(); }

std::string Errno(const char* what) { return absl::StrCat(what, ": ", strerror(errno)); }

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

int Remaining(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// Waits for `events` on `fd` until the deadline.
bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int rv = poll(&p, 1, Remaining(deadline));
    if (rv > 0) return true;
    if (rv == 0) return false;
    if (errno != EINTR) return false;
  }
}

absl::Status WriteAll(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!WaitFor(fd, POLLOUT, deadline)) return absl::DeadlineExceededError("write timed out");
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return absl::UnavailableError(Errno("write"));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!WaitFor(fd, POLLIN, deadline)) return absl::DeadlineExceededError("read timed out");
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0) return absl::UnavailableError("the peer closed the connection");
    if (r < 0) return absl::UnavailableError(Errno("read"));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// A connected, non-blocking socket to `to`, retrying refusals until the
// deadline (the peer's listener exists before its record is published, so
// a refusal is a transient backlog overflow).
absl::StatusOr<int> ConnectTo(const sockaddr_storage& to, absl::Time deadline) {
  absl::Duration pause = absl::Milliseconds(5);
  for (;;) {
    Fd fd(socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return absl::UnavailableError(Errno("socket"));
    int err = 0;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), Length(to)) < 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (!WaitFor(fd.get(), POLLOUT, deadline)) {
          return absl::DeadlineExceededError(absl::StrCat("connect to ", Describe(to), " timed out"));
        }
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) return fd.release();
    if ((err != ECONNREFUSED && err != EAGAIN) || absl::Now() + pause >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("connect to ", Describe(to), ": ", strerror(err)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
}

void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

// A newer-gloo rank record (Note [Two gloo dialects]).
struct RankRecord {
  std::string hostname;
  sockaddr_storage address{};
  std::vector<int64_t> sequence;
};

std::string EncodeRecord(const RankRecord& r) {
  std::string out;
  PutU64(out, r.hostname.size());
  out += r.hostname;
  const std::vector<char> address = tcp::Address(r.address).bytes();
  PutU64(out, address.size());
  out.append(address.data(), address.size());
  for (int64_t s : r.sequence) out.append(reinterpret_cast<const char*>(&s), 8);
  return out;
}

absl::StatusOr<RankRecord> DecodeRecord(const std::string& bytes, int peer, int size) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("gloo backend: rank ", peer, "'s gloo record (",
                                            bytes.size(), " bytes) is malformed: ", why));
  };
  RankRecord r;
  size_t at = 0;
  uint64_t n = 0;
  if (bytes.size() < 8) return bad("no host name length");
  memcpy(&n, bytes.data(), 8);
  at = 8;
  if (n > bytes.size() - at) return bad("host name past the end");
  r.hostname = bytes.substr(at, n);
  at += n;
  if (bytes.size() - at < 8) return bad("no address length");
  memcpy(&n, bytes.data() + at, 8);
  at += 8;
  if (n != kAddressBytes || bytes.size() - at < n) {
    return bad(absl::StrCat("address of ", n, " bytes, want ", kAddressBytes));
  }
  memcpy(&r.address, bytes.data() + at, sizeof(sockaddr_storage));
  at += n;
  if (r.address.ss_family != AF_INET && r.address.ss_family != AF_INET6) {
    return bad(absl::StrCat("address family ", r.address.ss_family));
  }
  const size_t rest = bytes.size() - at;
  if (rest == 0 && size > 1) {
    // The newer gloo leaves them out when it connects lazily or numbers
    // connections by rank; it then opens pairs only when an op needs them.
    return absl::FailedPreconditionError(absl::StrCat(
        "gloo backend: rank ", peer, " published no pair sequence numbers: it runs with "
        "TORCH_GLOO_LAZY_INIT=1 or GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER=1, which a group with "
        "Ember ranks does not support; unset both on every rank"));
  }
  if (rest != static_cast<size_t>(size) * 8) {
    return bad(absl::StrCat(rest, " bytes of sequence numbers for ", size, " ranks"));
  }
  r.sequence.resize(size);
  memcpy(r.sequence.data(), bytes.data() + at, rest);
  return r;
}

enum class Dialect { kSelf, kEmber, kLibgloo, kNewer };

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

std::string LibglooAddressKey(const std::string& group_prefix, int rank) {
  return absl::StrCat(group_prefix, "0/", rank);
}

// Note [Newer gloo's keys]
// PyTorch 2.x hands its gloo backend the group's store wrapped in c10d
// PrefixStores, which join with "/": the default group "0" under
// "<base>0/" + "/", a new group "<n>" nested inside the default group's as
// "<base>0/" + "/" + "<n>/" + "/", and its backend then keys device 0's
// rendezvous by "cpu//0/<rank>" within that. Ember names groups as PyTorch
// does (Note [Store layout] in distributed.cc: "<base><n>/", base "" or
// "default_pg/"), so the nesting is recovered from the group's own prefix;
// a prefix of another shape (a mixed backend's "<n>/<device type>/") is
// taken as it is.
std::string NewerGlooRankKey(const std::string& group_prefix, int rank) {
  absl::string_view p = group_prefix;
  if (p.size() >= 2 && p.back() == '/') {
    absl::string_view body = p.substr(0, p.size() - 1);
    const size_t slash = body.find_last_of('/');
    const absl::string_view name = slash == absl::string_view::npos ? body : body.substr(slash + 1);
    const absl::string_view base = body.substr(0, body.size() - name.size());
    int group = 0;
    if (!name.empty() && absl::SimpleAtoi(name, &group) && group > 0) {
      return absl::StrCat(base, "0//", name, "//cpu//0/", rank);
    }
  }
  return absl::StrCat(group_prefix, "/cpu//0/", rank);
}

absl::StatusOr<MeshResult> ConnectFullMesh(const MeshOptions& options) {
  const int rank = options.rank, size = options.size;
  const absl::Time deadline = absl::Now() + options.timeout;
  Store& store = *options.store;
  const std::string libgloo = absl::StrCat(options.group_prefix, "0/");
  const std::string host = HostName();
  const auto timeout = std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options.timeout)));

  auto* device = dynamic_cast<tcp::Device*>(options.device.get());
  if (device == nullptr) {
    return absl::InvalidArgumentError("gloo backend: the mesh needs gloo's tcp transport");
  }
  auto context = std::make_shared<MeshContext>(rank, size);
  context->setTimeout(timeout);
  std::shared_ptr<::gloo::transport::Context> transport;
  std::vector<MeshPair*> pairs(size, nullptr);
  std::string addresses;
  try {
    transport = options.device->createContext(rank, size);
    transport->setTimeout(timeout);
    auto* tcp_context = dynamic_cast<tcp::Context*>(transport.get());
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      auto pair = std::make_unique<MeshPair>(tcp_context, device, p, timeout);
      pairs[p] = pair.get();
      transport->getPair(p) = std::move(pair);
      const std::vector<char> bytes = pairs[p]->address().bytes();
      addresses.append(bytes.data(), bytes.size());
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo backend: rank ", rank,
                                               " could not create its pairs: ", e.what()));
  }

  if (size == 1) {  // no peers to meet
    context->Adopt(options.device, std::move(transport));
    return MeshResult{.context = std::move(context), .newer_gloo = {false}};
  }
  // This rank's listening socket for newer-gloo peers, on the device's address.
  sockaddr_storage listen_at = pairs[rank == 0 ? 1 : 0]->address().getSockaddr();
  if (listen_at.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&listen_at)->sin_port = 0;
  } else {
    reinterpret_cast<sockaddr_in6*>(&listen_at)->sin6_port = 0;
  }
  Fd listener(socket(listen_at.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  socklen_t len = sizeof(listen_at);
  if (listener.get() < 0 ||
      bind(listener.get(), reinterpret_cast<const sockaddr*>(&listen_at), Length(listen_at)) < 0 ||
      ::listen(listener.get(), std::max(size, 16)) < 0 ||
      getsockname(listener.get(), reinterpret_cast<sockaddr*>(&listen_at), &len) < 0) {
    return absl::UnavailableError(absl::StrCat("gloo backend: rank ", rank,
                                               " could not listen on ", Describe(listen_at), ": ",
                                               strerror(errno)));
  }

  // Both dialects' keys (Note [Two gloo dialects]).
  EMBER_RETURN_IF_ERROR(store.set(absl::StrCat(libgloo, "rank_", rank), host));
  EMBER_RETURN_IF_ERROR(store.set(LibglooAddressKey(options.group_prefix, rank), addresses));
  RankRecord mine{.hostname = host, .address = listen_at, .sequence = {}};
  for (int p = 0; p < size; ++p) mine.sequence.push_back(p);
  EMBER_RETURN_IF_ERROR(store.set(NewerGlooRankKey(options.group_prefix, rank), EncodeRecord(mine)));

  // Which dialect each peer speaks: an Ember record, else whichever keys it wrote.
  std::vector<Dialect> dialect(size, Dialect::kSelf);
  std::vector<RankRecord> records(size);
  absl::Duration pause = absl::Microseconds(500);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string record = absl::StrCat(options.ember_record_prefix, p);
    const std::string newer = NewerGlooRankKey(options.group_prefix, p);
    const std::string old = LibglooAddressKey(options.group_prefix, p);
    for (;;) {
      EMBER_ASSIGN_OR_RETURN(bool has_newer, store.check({newer}));
      EMBER_ASSIGN_OR_RETURN(bool has_old, store.check({old}));
      if (has_newer || has_old) {
        // An Ember rank writes its record before either key.
        EMBER_ASSIGN_OR_RETURN(bool ember, store.check({record}));
        dialect[p] = ember ? Dialect::kEmber : has_newer ? Dialect::kNewer : Dialect::kLibgloo;
        break;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "gloo backend: rank ", rank, " timed out after ", absl::FormatDuration(options.timeout),
            " waiting for rank ", p, " to publish its gloo address (store key '", old, "' or '",
            newer, "')"));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(20));
    }
    if (dialect[p] == Dialect::kNewer) {
      EMBER_ASSIGN_OR_RETURN(std::string bytes, store.get(newer, absl::ZeroDuration()));
      EMBER_ASSIGN_OR_RETURN(records[p], DecodeRecord(bytes, p, size));
      if (records[p].address.ss_family != listen_at.ss_family) {
        return absl::UnavailableError(absl::StrCat(
            "gloo backend: rank ", p, " listens on ", Describe(records[p].address),
            ", another address family than this rank's ", Describe(listen_at),
            "; set GLOO_SOCKET_IFNAME to the same kind of interface on every rank"));
      }
    }
  }

  auto failed = [&](int p, const std::string& why) {
    return absl::UnavailableError(absl::StrCat("gloo backend: rank ", rank,
                                               " could not connect to rank ", p, ": ", why));
  };
  // 1. Connections to newer-gloo ranks that this rank initiates.
  std::vector<int> accepts;
  for (int p = 0; p < size; ++p) {
    if (dialect[p] != Dialect::kNewer) continue;
    if (Compare(listen_at, records[p].address) < 0) {
      accepts.push_back(p);
      continue;
    }
    absl::StatusOr<int> fd = ConnectTo(records[p].address, deadline);
    if (!fd.ok()) return failed(p, std::string(fd.status().message()));
    Fd owned(*fd);
    const int64_t seq = records[p].sequence[rank];
    if (absl::Status w = WriteAll(owned.get(), &seq, sizeof(seq), deadline); !w.ok()) {
      return failed(p, std::string(w.message()));
    }
    try {
      pairs[p]->Adopt(owned.release());
    } catch (const std::exception& e) {
      return failed(p, e.what());
    }
  }
  // 2. libgloo's pairs, in rank order as libgloo connects them.
  for (int p = 0; p < size; ++p) {
    if (dialect[p] != Dialect::kEmber && dialect[p] != Dialect::kLibgloo) continue;
    EMBER_ASSIGN_OR_RETURN(std::string all,
                           store.get(LibglooAddressKey(options.group_prefix, p),
                                     std::max(absl::ZeroDuration(), deadline - absl::Now())));
    const int index = rank > p ? rank - 1 : rank;
    if (all.size() != static_cast<size_t>(size - 1) * kAddressBytes) {
      return absl::DataLossError(absl::StrCat("gloo backend: rank ", p, "'s pair addresses (",
                                              all.size(), " bytes) are malformed; want ",
                                              (size - 1) * kAddressBytes));
    }
    std::vector<char> address(all.begin() + index * kAddressBytes,
                              all.begin() + (index + 1) * kAddressBytes);
    try {
      pairs[p]->connect(address);
    } catch (const std::exception& e) {
      return failed(p, e.what());
    }
  }
  // 3. Connections from newer-gloo ranks: each announces the sequence number
  // this rank published for it, its rank.
  std::vector<bool> pending(size, false);
  for (int p : accepts) pending[p] = true;
  for (size_t left = accepts.size(); left > 0;) {
    if (!WaitFor(listener.get(), POLLIN, deadline)) {
      std::vector<int> missing;
      for (int p = 0; p < size; ++p) {
        if (pending[p]) missing.push_back(p);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "gloo backend: rank ", rank, " timed out after ", absl::FormatDuration(options.timeout),
          " waiting for ranks ", absl::StrJoin(missing, ", "), " to connect to ",
          Describe(listen_at)));
    }
    Fd conn(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (conn.get() < 0) continue;
    int64_t seq = -1;
    if (!ReadAll(conn.get(), &seq, sizeof(seq), deadline).ok()) continue;
    if (seq < 0 || seq >= size || !pending[seq]) continue;  // not one of this group's peers
    try {
      pairs[seq]->Adopt(conn.release());
    } catch (const std::exception& e) {
      return failed(static_cast<int>(seq), e.what());
    }
    pending[seq] = false;
    --left;
  }

  context->Adopt(options.device, std::move(transport));
  MeshResult result{.context = std::move(context), .newer_gloo = std::vector<bool>(size, false)};
  for (int p = 0; p < size; ++p) result.newer_gloo[p] = dialect[p] == Dialect::kNewer;
  return result;
}

}  // namespace ember::distributed::gloo
