#include "distributed/tcp/mesh.h"

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/peer_process.h"
#include "distributed/tcp/shm_segment.h"
#include "tensor/status_macros.h"

namespace ember::distributed::tcp {
namespace {

constexpr uint32_t kMagic = 0x454d4231;  // "EMB1"
constexpr size_t kHeaderBytes = 32;
constexpr size_t kAlign = 32;  // messages are padded to this (Note [Message matching])
constexpr size_t kSmallMessage = 8192;
constexpr absl::Duration kReadSlice = absl::Milliseconds(100);

constexpr uint16_t kDirectFlag = 1;  // the payload is a DirectDescriptor
constexpr size_t kBounceBytes = 256 << 10;

struct DirectDescriptor {
  uint64_t address;
  int64_t id;
};

struct WireHeader {
  uint32_t magic;
  uint8_t kind;
  uint8_t op;
  uint16_t flags;
  int32_t step;
  int32_t reserved2;
  int64_t tag;
  uint64_t nbytes;
};
static_assert(sizeof(WireHeader) == kHeaderBytes);

size_t Padding(size_t nbytes) { return (kAlign - nbytes % kAlign) % kAlign; }

std::string KeyText(const MessageKey& key) {
  switch (key.kind) {
    case MessageKind::kP2P:
      return absl::StrCat("tag ", key.tag);
    case MessageKind::kCollective:
      return absl::StrCat("collective #", key.tag, " step ", key.step);
    case MessageKind::kPoison:
      return "poison";
    case MessageKind::kGoodbye:
      return "goodbye";
    case MessageKind::kAck:
      return "ack";
  }
  return "?";
}

}  // namespace

// A message that arrived before its receive was posted.
struct Mesh::Unexpected {
  int src;
  MessageKey key;
  uint8_t op;
  std::string data;
  // A deferred direct message: only its descriptor has been read.
  bool direct = false;
  DirectDescriptor descriptor{};
  size_t nbytes = 0;
  bool complete = false;                 // guarded by Mesh::mu_
  std::shared_ptr<PendingRecv> claimer;  // guarded by Mesh::mu_
};

bool PendingRecv::finished() {
  absl::MutexLock lock(&mu_);
  return signalled_;
}

absl::Status PendingRecv::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

int PendingRecv::source() {
  absl::MutexLock lock(&mu_);
  return source_;
}

Mesh::Mesh(int rank, std::vector<std::unique_ptr<Channel>> channels, std::vector<PeerInfo> peers,
           std::function<std::string(uint8_t)> op_names)
    : rank_(rank),
      channels_(std::move(channels)),
      peers_(std::move(peers)),
      op_names_(std::move(op_names)) {
  for (size_t i = 0; i < channels_.size(); ++i) send_mu_.push_back(std::make_unique<absl::Mutex>());
  next_direct_id_ = std::vector<std::atomic<int64_t>>(channels_.size());
  {
    absl::MutexLock lock(&mu_);
    deferred_.resize(channels_.size());
  }
  for (int peer = 0; peer < size(); ++peer) {
    if (channels_[peer]) readers_.emplace_back([this, peer] { ReadLoop(peer); });
  }
}

Mesh::~Mesh() {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(100);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank_) (void)Send(peer, {MessageKind::kGoodbye, 0, 0}, kAnyOp, {}, deadline);
  }
  stopping_.store(true);
  for (auto& channel : channels_) {
    if (channel) channel->Interrupt();
  }
  for (std::thread& t : readers_) t.join();
  Abort(absl::AbortedError("the process group was destroyed"));
}

bool Mesh::PeerKnownDown(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) return false;
  const PeerInfo& p = peers_[rank];
  if (!p.same_host || p.pid <= 0 || p.pid == getpid()) return false;
  const std::string state = ProcessState(p.pid);
  return state == "stopped" || state == "stopped by a debugger" || state == "exited";
}

std::string Mesh::DescribePeer(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) return "any rank";
  const PeerInfo& p = peers_[rank];
  if (p.same_host && p.pid > 0 && p.pid != getpid()) {
    return absl::StrCat("rank ", rank, " (pid ", p.pid, " on this host, ", ProcessState(p.pid),
                        ")");
  }
  if (p.same_host) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " (", p.address, ")");
}

absl::Status Mesh::Send(int dst, MessageKey key, uint8_t op, absl::Span<const char> payload,
                        absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
    auto it = failed_peers_.find(dst);
    if (it != failed_peers_.end()) return it->second;
  }
  if (payload.size() >= kDirectBytes && peers_[dst].peer_reads_us) {
    return SendDirect(dst, key, op, payload, deadline);
  }
  WireHeader h{kMagic, static_cast<uint8_t>(key.kind), op, 0, key.step, 0, key.tag, payload.size()};
  const size_t pad = Padding(payload.size());
  Channel& channel = *channels_[dst];
  absl::MutexLock lock(send_mu_[dst].get());
  if (payload.size() <= kSmallMessage) {
    char buf[kHeaderBytes + kSmallMessage + kAlign];
    std::memcpy(buf, &h, kHeaderBytes);
    if (!payload.empty()) std::memcpy(buf + kHeaderBytes, payload.data(), payload.size());
    std::memset(buf + kHeaderBytes + payload.size(), 0, pad);
    return channel.Write(buf, kHeaderBytes + payload.size() + pad, deadline);
  }
  static const char kZeros[kAlign] = {};
  absl::Status s = channel.Write(&h, kHeaderBytes, deadline);
  if (s.ok()) s = channel.Write(payload.data(), payload.size(), deadline);
  if (s.ok()) s = channel.Write(kZeros, pad, deadline);
  return s;
}

absl::Status Mesh::SendDirect(int dst, MessageKey key, uint8_t op, absl::Span<const char> payload,
                              absl::Time deadline) {
  const int64_t id = next_direct_id_[dst].fetch_add(1);
  struct {
    WireHeader h;
    DirectDescriptor d;
  } wire{{kMagic, static_cast<uint8_t>(key.kind), op, kDirectFlag, key.step, 0, key.tag,
          payload.size()},
         {reinterpret_cast<uint64_t>(payload.data()), id}};
  static_assert(sizeof(wire) == kHeaderBytes + 16);
  char buf[kHeaderBytes + kAlign] = {};
  std::memcpy(buf, &wire, sizeof(wire));
  {
    absl::MutexLock lock(send_mu_[dst].get());
    EMBER_RETURN_IF_ERROR(channels_[dst]->Write(buf, kHeaderBytes + kAlign, deadline));
  }
  // The payload must stay put until the receiver has read it.
  absl::MutexLock lock(&mu_);
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return acks_.count({dst, id}) > 0 || failed_peers_.count(dst) > 0 || !aborted_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("timed out waiting for ", DescribePeer(dst), " to read the message"));
  }
  if (acks_.erase({dst, id})) return absl::OkStatus();
  if (!aborted_.ok()) return aborted_;
  return failed_peers_.find(dst)->second;
}

absl::Status Mesh::ReadDirect(int peer, uint64_t address, size_t nbytes, const Sink& sink) {
  const PeerInfo& p = peers_[peer];
  thread_local std::unique_ptr<char[]> bounce(new char[kBounceBytes]);
  for (size_t off = 0; off < nbytes; off += kBounceBytes) {
    const size_t n = std::min(kBounceBytes, nbytes - off);
    iovec local{bounce.get(), n};
    iovec remote{reinterpret_cast<void*>(address + off), n};
    ssize_t got = process_vm_readv(p.pid, &local, 1, &remote, 1, 0);
    if (got != static_cast<ssize_t>(n)) {
      return absl::UnavailableError(absl::StrCat("reading ", n, " bytes from rank ", peer,
                                                 "'s memory failed: ", strerror(errno)));
    }
    sink(off, bounce.get(), n);
  }
  return absl::OkStatus();
}

absl::Status Mesh::ReadDirectInto(int peer, uint64_t address, size_t offset, size_t n, char* dst) {
  const PeerInfo& p = peers_[peer];
  iovec local{dst + offset, n};
  iovec remote{reinterpret_cast<void*>(address + offset), n};
  if (process_vm_readv(p.pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(n)) {
    return absl::UnavailableError(absl::StrCat("reading ", n, " bytes from rank ", peer,
                                               "'s memory failed: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status Mesh::PostError(int src, const MessageKey& key) const {
  if (!aborted_.ok()) return aborted_;
  if (src != kFromAnyRank) {
    auto it = failed_peers_.find(src);
    if (it != failed_peers_.end()) return it->second;
  }
  if (key.kind == MessageKind::kCollective) {
    if (!first_failure_.ok()) return first_failure_;
    auto it = poisoned_.find(key.tag);
    if (it != poisoned_.end() && Poisonable(key)) return it->second;
  }
  return absl::OkStatus();
}

std::shared_ptr<PendingRecv> Mesh::Post(int src, MessageKey key, uint8_t op, size_t nbytes,
                                        Sink sink, RecvDone done, char* copy_to) {
  auto recv = std::make_shared<PendingRecv>(src, key, op, nbytes, std::move(sink), std::move(done),
                                            copy_to);
  std::shared_ptr<Unexpected> ready;
  absl::Status error;
  int wake = -1;
  {
    absl::MutexLock lock(&mu_);
    // A message that already arrived is delivered even if its sender has
    // left or failed since.
    auto it = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const auto& u) {
      return (src == kFromAnyRank || u->src == src) && u->key == key;
    });
    if (it != unexpected_.end() && aborted_.ok()) {
      std::shared_ptr<Unexpected> u = *it;
      unexpected_.erase(it);
      if (u->direct && failed_peers_.count(u->src)) {
        error = failed_peers_[u->src];  // its payload died with it
      } else if (u->direct) {
        wake = u->src;
        deferred_[u->src].push_back({recv, u});
      } else if (u->complete) {
        ready = std::move(u);
      } else {
        u->claimer = recv;  // the reader delivers it when complete
      }
    } else {
      error = PostError(src, key);
      if (error.ok()) posted_.push_back(recv);
    }
  }
  if (wake >= 0) channels_[wake]->Wake();
  if (!error.ok()) {
    Finish(recv, error, -1);
  } else if (ready) {
    absl::Status match = CheckMatch(*recv, ready->src, ready->op, ready->data.size());
    RecordMismatch(key, match);
    if (match.ok()) {
      absl::MutexLock lock(&recv->mu_);
      if (!recv->claimed_ && !ready->data.empty())
        recv->sink_(0, ready->data.data(), ready->data.size());
    }
    Finish(recv, match, ready->src);
  }
  return recv;
}

absl::Status Mesh::CheckMatch(const PendingRecv& recv, int peer, uint8_t op, size_t nbytes) const {
  if (recv.op_ != kAnyOp && op != recv.op_) {
    return absl::FailedPreconditionError(
        absl::StrCat("mismatched collectives: rank ", peer, " ran ", op_names_(op), " as ",
                     KeyText(recv.key_), " while this rank (", rank_, ") ran ", op_names_(recv.op_),
                     "; every rank must call the same collectives in the same order"));
  }
  if (nbytes != recv.nbytes_) {
    if (recv.key_.kind == MessageKind::kP2P) {
      return absl::FailedPreconditionError(absl::StrCat(
          "recv: rank ", peer, " sent ", nbytes, " bytes with ", KeyText(recv.key_),
          " but the receiving tensor holds ", recv.nbytes_, " bytes; sizes must match"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "mismatched collective: rank ", peer, " sent ", nbytes, " bytes for ", op_names_(op), " (",
        KeyText(recv.key_), ") but this rank (", rank_, ") expected ", recv.nbytes_,
        "; every rank must pass tensors of the same size and dtype"));
  }
  return absl::OkStatus();
}

void Mesh::RecordMismatch(const MessageKey& key, const absl::Status& match) {
  if (match.ok() || key.kind != MessageKind::kCollective) return;
  absl::MutexLock lock(&mu_);
  mismatched_.emplace(key.tag, match);
}

void Mesh::Finish(const std::shared_ptr<PendingRecv>& recv, const absl::Status& status, int src) {
  {
    absl::MutexLock lock(&recv->mu_);
    if (recv->claimed_) return;
    recv->claimed_ = true;
  }
  if (recv->done_) recv->done_(status, src);
  absl::MutexLock lock(&recv->mu_);
  recv->status_ = status;
  recv->source_ = src;
  recv->signalled_ = true;
  recv->signalled_flag_.store(true, std::memory_order_release);
}

void Mesh::Cancel(const std::shared_ptr<PendingRecv>& recv, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    posted_.remove(recv);
  }
  Finish(recv, status, -1);
}

absl::Status Mesh::Wait(const std::shared_ptr<PendingRecv>& recv, absl::Time deadline,
                        const std::string& what, bool settle) {
  // Small messages finish within microseconds: look a few times before
  // sleeping, which would add a wake-up to every hop.
  for (int i = 0; i < 64 && !recv->signalled_flag_.load(std::memory_order_acquire); ++i) {
    if (i < 48) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      sched_yield();
    }
  }
  {
    absl::MutexLock lock(&recv->mu_);
    auto signalled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv->mu_) { return recv->signalled_; };
    if (recv->mu_.AwaitWithDeadline(absl::Condition(&signalled), deadline)) {
      return WithContext(recv->status_, what);
    }
  }
  // Note [Which rank reports a stall]: when one rank stops, its neighbours
  // time out waiting for it, and the ranks behind them time out waiting for
  // the neighbours, all at about the same moment. Only a rank waiting on a
  // peer it can see is down reports at once; the others give the poison
  // from that rank a moment to arrive, so that every survivor names the
  // stopped rank rather than whichever neighbour it was waiting for.
  absl::Status cause;
  if (settle && recv->key_.kind == MessageKind::kCollective && !PeerKnownDown(recv->src_)) {
    cause = CollectiveFailure(recv->key_.tag, absl::Milliseconds(500));
  }
  Cancel(recv, !cause.ok() ? WithContext(cause, what)
                           : absl::DeadlineExceededError(absl::StrCat(
                                 what, ": timed out waiting for ", DescribePeer(recv->src_), " (",
                                 KeyText(recv->key_), ")")));
  absl::MutexLock lock(&recv->mu_);
  auto signalled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv->mu_) { return recv->signalled_; };
  recv->mu_.Await(absl::Condition(&signalled));
  return recv->status_;
}

absl::Status Mesh::WithContext(const absl::Status& status, const std::string& what) {
  if (status.ok() || absl::StartsWith(status.message(), what)) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

void Mesh::Poison(int64_t seq, const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok() || poisoned_.count(seq)) return;  // nothing to tell, or told already
    poisoned_.emplace(seq, reason);
  }
  const std::string text =
      absl::StrCat("rank ", rank_, " failed this collective: ", reason.message());
  const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    (void)Send(peer, {MessageKind::kPoison, seq, 0}, kAnyOp,
               absl::Span<const char>(text.data(), text.size()), deadline);
  }
}

absl::Status Mesh::CollectiveFailure(int64_t seq, absl::Duration settle) {
  absl::MutexLock lock(&mu_);
  auto known = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return mismatched_.count(seq) > 0 || poisoned_.count(seq) > 0 || !first_failure_.ok() ||
           !aborted_.ok();
  };
  mu_.AwaitWithTimeout(absl::Condition(&known), settle);
  if (!aborted_.ok()) return aborted_;
  if (auto m = mismatched_.find(seq); m != mismatched_.end()) return m->second;
  auto it = poisoned_.find(seq);
  if (it != poisoned_.end()) return it->second;
  return first_failure_;
}

void Mesh::Abort(const absl::Status& status) {
  std::list<std::shared_ptr<PendingRecv>> posted;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = status;
    posted.swap(posted_);
    for (auto& u : unexpected_) {
      if (u->claimer) posted.push_back(u->claimer);
    }
    for (auto& queue : deferred_) {
      for (Deferred& d : queue) posted.push_back(d.target);
      queue.clear();
    }
  }
  for (auto& channel : channels_) {
    if (channel) channel->Interrupt();
  }
  for (auto& recv : posted) Finish(recv, status, -1);
}

void Mesh::SayGoodbye(absl::Time deadline) {
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_ || !channels_[peer]) continue;
    {
      absl::MutexLock lock(&mu_);
      if (!aborted_.ok()) return;
      if (failed_peers_.count(peer) > 0) continue;
    }
    absl::Mutex& send_mu = *send_mu_[peer];
    if (!send_mu.TryLock()) continue;  // mid-message: the peer learns from the abort
    const WireHeader h{kMagic, static_cast<uint8_t>(MessageKind::kGoodbye), kAnyOp, 0, 0, 0, 0, 0};
    (void)channels_[peer]->Write(&h, kHeaderBytes, deadline);
    send_mu.Unlock();
  }
}

void Mesh::FailPeer(int peer, const absl::Status& status) {
  const absl::Status error(status.code(),
                           absl::StrCat("lost ", DescribePeer(peer), ": ", status.message()));
  std::vector<std::shared_ptr<PendingRecv>> failed;
  {
    absl::MutexLock lock(&mu_);
    failed_peers_.emplace(peer, error);
    if (first_failure_.ok()) first_failure_ = error;
    for (Deferred& d : deferred_[peer]) failed.push_back(d.target);
    deferred_[peer].clear();
    for (auto it = posted_.begin(); it != posted_.end();) {
      if ((*it)->src_ == peer || (*it)->key_.kind == MessageKind::kCollective) {
        failed.push_back(*it);
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& recv : failed) Finish(recv, error, peer);
}

void Mesh::ReadLoop(int peer) {
  Channel& channel = *channels_[peer];
  while (!stopping_.load()) {
    absl::Status s = ReadDeferred(peer);
    if (s.ok()) s = ReadMessage(peer, channel);
    if (!s.ok()) {
      if (!stopping_.load() && !absl::IsCancelled(s)) FailPeer(peer, s);
      return;
    }
  }
}

absl::Status Mesh::ReadDeferred(int peer) {
  while (true) {
    Deferred work;
    {
      absl::MutexLock lock(&mu_);
      if (deferred_[peer].empty()) return absl::OkStatus();
      work = std::move(deferred_[peer].front());
      deferred_[peer].pop_front();
    }
    PendingRecv* r = work.target.get();
    const Unexpected& m = *work.message;
    absl::Status match = CheckMatch(*r, peer, m.op, m.nbytes);
    RecordMismatch(m.key, match);
    if (!match.ok()) Finish(work.target, match, peer);
    absl::Status s;
    if (r->copy_to_ != nullptr) {
      constexpr size_t kPiece = 4 << 20;
      for (size_t off = 0; off < m.nbytes && s.ok(); off += kPiece) {
        absl::MutexLock lock(&r->mu_);
        if (r->claimed_) break;
        s = ReadDirectInto(peer, m.descriptor.address, off, std::min(kPiece, m.nbytes - off),
                           r->copy_to_);
      }
    } else {
      s = ReadDirect(peer, m.descriptor.address, m.nbytes,
                     [r](size_t off, const char* d, size_t n) {
                       absl::MutexLock lock(&r->mu_);
                       if (!r->claimed_) r->sink_(off, d, n);
                     });
    }
    if (s.ok()) {
      s = Send(peer, {MessageKind::kAck, m.descriptor.id, 0}, kAnyOp, {},
               absl::Now() + absl::Minutes(5));
    }
    if (!s.ok()) {
      Finish(work.target,
             absl::Status(s.code(), absl::StrCat("lost ", DescribePeer(peer), ": ", s.message())),
             peer);
      return s;
    }
    Finish(work.target, absl::OkStatus(), peer);
  }
}

absl::Status Mesh::StreamPayload(Channel& channel, size_t nbytes, const Sink& sink) {
  size_t offset = 0;
  while (offset < nbytes) {
    const size_t left = nbytes - offset;
    auto span = channel.Peek(std::min<size_t>(8, left), kReadSlice);
    if (!span.ok()) return span.status();
    if (span->empty()) {
      if (stopping_.load()) return absl::AbortedError("the process group was destroyed");
      continue;
    }
    size_t n = std::min(span->size(), left);
    if (n < left) n -= n % 8;
    sink(offset, span->data(), n);
    channel.Consume(n);
    offset += n;
  }
  size_t pad = Padding(nbytes);
  while (pad > 0) {
    auto span = channel.Peek(pad, kReadSlice);
    if (!span.ok()) return span.status();
    if (span->size() >= pad) {
      channel.Consume(pad);
      pad = 0;
    } else if (stopping_.load()) {
      return absl::AbortedError("the process group was destroyed");
    }
  }
  return absl::OkStatus();
}

absl::Status Mesh::ReadMessage(int peer, Channel& channel) {
  auto span = channel.Peek(kHeaderBytes, kReadSlice);
  if (!span.ok()) return span.status();
  if (span->size() < kHeaderBytes) return absl::OkStatus();  // idle
  WireHeader h;
  std::memcpy(&h, span->data(), kHeaderBytes);
  channel.Consume(kHeaderBytes);
  if (h.magic != kMagic || h.kind < 1 || h.kind > 5) {
    return absl::DataLossError(absl::StrCat("garbled message header (", channel.Describe(), ")"));
  }
  const MessageKey key{static_cast<MessageKind>(h.kind), h.tag, h.step};

  if (key.kind == MessageKind::kAck) {
    absl::MutexLock lock(&mu_);
    acks_.insert({peer, h.tag});
    return absl::OkStatus();
  }

  // A direct message's payload is read from the sender's memory; the wire
  // carries only its descriptor (Note [Direct reads]).
  const bool direct = (h.flags & kDirectFlag) != 0;
  DirectDescriptor descriptor{};
  if (direct) {
    absl::Status s =
        StreamPayload(channel, sizeof(descriptor), [&](size_t off, const char* d, size_t n) {
          std::memcpy(reinterpret_cast<char*>(&descriptor) + off, d, n);
        });
    if (!s.ok()) return s;
  }
  auto payload = [&](const Sink& sink) -> absl::Status {
    if (!direct) return StreamPayload(channel, h.nbytes, sink);
    absl::Status s = ReadDirect(peer, descriptor.address, h.nbytes, sink);
    if (!s.ok()) return s;
    return Send(peer, {MessageKind::kAck, descriptor.id, 0}, kAnyOp, {},
                absl::Now() + absl::Minutes(5));
  };

  if (key.kind == MessageKind::kGoodbye) {
    const absl::Status gone = absl::UnavailableError(
        absl::StrCat("rank ", peer, " has left (it destroyed its process group)"));
    std::vector<std::shared_ptr<PendingRecv>> failed;
    {
      absl::MutexLock lock(&mu_);
      failed_peers_.emplace(peer, gone);
      for (auto it = posted_.begin(); it != posted_.end();) {
        if ((*it)->src_ == peer) {
          failed.push_back(*it);
          it = posted_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& recv : failed) Finish(recv, gone, peer);
    return absl::CancelledError("goodbye");  // ends this peer's reader quietly
  }

  if (key.kind == MessageKind::kPoison) {
    std::string text(h.nbytes, '\0');
    absl::Status s = StreamPayload(channel, h.nbytes, [&](size_t off, const char* d, size_t n) {
      std::memcpy(text.data() + off, d, n);
    });
    if (!s.ok()) return s;
    const absl::Status reason = absl::FailedPreconditionError(text);
    std::vector<std::shared_ptr<PendingRecv>> failed;
    {
      absl::MutexLock lock(&mu_);
      poisoned_.emplace(h.tag, reason);
      for (auto it = posted_.begin(); it != posted_.end();) {
        if (Poisonable((*it)->key_) && (*it)->key_.tag == h.tag) {
          failed.push_back(*it);
          it = posted_.erase(it);
        } else {
          ++it;
        }
      }
      unexpected_.remove_if([&](const auto& u) { return Poisonable(u->key) && u->key.tag == h.tag; });
    }
    for (auto& recv : failed) Finish(recv, reason, peer);
    return absl::OkStatus();
  }

  std::shared_ptr<PendingRecv> target;
  std::shared_ptr<Unexpected> stash;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& r) {
      return (r->src_ == kFromAnyRank || r->src_ == peer) && r->key_ == key;
    });
    if (it != posted_.end()) {
      target = *it;
      posted_.erase(it);
    } else if (!(Poisonable(key) && poisoned_.count(key.tag))) {
      stash = std::make_shared<Unexpected>();
      stash->src = peer;
      stash->key = key;
      stash->op = h.op;
      if (direct && key.kind == MessageKind::kCollective) {
        stash->direct = true;  // read when its receive is posted (ReadDeferred)
        stash->descriptor = descriptor;
        stash->nbytes = h.nbytes;
        stash->complete = true;
      }
      unexpected_.push_back(stash);
    }
  }
  if (stash && stash->direct) return absl::OkStatus();

  absl::Status stream;
  if (target) {
    absl::Status match = CheckMatch(*target, peer, h.op, h.nbytes);
    if (!match.ok()) {
      RecordMismatch(key, match);
      Finish(target, match, peer);
    }
    PendingRecv* r = target.get();
    if (direct && r->copy_to_ != nullptr && match.ok()) {
      // Straight into the destination, in pieces so that a cancel stops it.
      constexpr size_t kPiece = 4 << 20;
      for (size_t off = 0; off < h.nbytes && stream.ok(); off += kPiece) {
        absl::MutexLock lock(&r->mu_);
        if (r->claimed_) break;
        stream = ReadDirectInto(peer, descriptor.address, off, std::min(kPiece, h.nbytes - off),
                                r->copy_to_);
      }
      if (stream.ok()) {
        stream = Send(peer, {MessageKind::kAck, descriptor.id, 0}, kAnyOp, {},
                      absl::Now() + absl::Minutes(5));
      }
    } else {
      stream = payload([r](size_t off, const char* d, size_t n) {
        absl::MutexLock lock(&r->mu_);
        if (!r->claimed_) r->sink_(off, d, n);
      });
    }
    if (!stream.ok()) {
      Finish(target,
             absl::Status(stream.code(), absl::StrCat(DescribePeer(peer), ": ", stream.message())),
             peer);
      return stream;
    }
    Finish(target, absl::OkStatus(), peer);
    return absl::OkStatus();
  }

  if (stash) stash->data.resize(h.nbytes);
  char* dst = stash ? stash->data.data() : nullptr;
  stream = payload([dst](size_t off, const char* d, size_t n) {
    if (dst) std::memcpy(dst + off, d, n);
  });
  if (!stash) return stream;  // a poisoned collective's message: dropped
  std::shared_ptr<PendingRecv> claimer;
  {
    absl::MutexLock lock(&mu_);
    stash->complete = true;
    claimer = std::move(stash->claimer);
  }
  if (!stream.ok()) {
    if (claimer) {
      Finish(claimer,
             absl::Status(stream.code(),
                          absl::StrCat("lost ", DescribePeer(peer), ": ", stream.message())),
             peer);
    }
    return stream;
  }
  if (claimer) {
    absl::Status match = CheckMatch(*claimer, peer, stash->op, stash->data.size());
    RecordMismatch(key, match);
    if (match.ok()) {
      absl::MutexLock lock(&claimer->mu_);
      if (!claimer->claimed_ && !stash->data.empty()) {
        claimer->sink_(0, stash->data.data(), stash->data.size());
      }
    }
    Finish(claimer, match, peer);
  }
  return absl::OkStatus();
}

}  // namespace ember::distributed::tcp
