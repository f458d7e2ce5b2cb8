#include "distributed/tcp/process_group_tcp.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "distributed/backend_util.h"
#include "distributed/peer_process.h"
#include "distributed/reduce.h"
#include "distributed/tcp/algorithms.h"
#include "distributed/tcp/shm_channel.h"
#include "distributed/tcp/socket_channel.h"
#include "tensor/status_macros.h"

namespace ember::distributed::tcp {

namespace {

constexpr uint32_t kHelloMagic = 0x454d4248;  // "EMBH"
// How long after an op's deadline its Work gives up on the worker: past
// the settle time of Note [Which rank reports a stall] and the monitored
// barrier's grace.
constexpr absl::Duration kBackstop = absl::Seconds(3);
// all_reduce moves a whole buffer to every peer in one hop (DirectAllReduce)
// while the bytes each rank receives stay under this; the ring beyond.
constexpr size_t kDirectAllReduceBytes = 64 << 10;

absl::Span<const char> Bytes(const Tensor& t) {
  return {static_cast<const char*>(t.raw_data()), t.nbytes()};
}
char* Data(const Tensor& t) { return static_cast<char*>(t.raw_data()); }
std::vector<Target> Targets(const std::vector<Tensor>& tensors) {
  std::vector<Target> targets;
  for (const Tensor& t : tensors) targets.push_back({Data(t), t.nbytes()});
  return targets;
}

std::string OpCodeName(uint8_t code) {
  if (code == kAnyOp) return "send";
  if (code < kNumOpTypes) return std::string(op_type_name(static_cast<OpType>(code)));
  return absl::StrCat("op #", code);
}

// A word at a known address that peers on this host try to read, to learn
// whether Cross Memory Attach works between us (Note [Direct reads]).
const uint64_t kProbeWord = 0x454d4245522d4d41;

bool CanReadMemoryOf(pid_t pid, uint64_t address) {
  if (pid == getpid()) return false;  // threads use the rings (Note [Direct reads])
  uint64_t word = 0;
  iovec local{&word, sizeof(word)};
  iovec remote{reinterpret_cast<void*>(address), sizeof(word)};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(word) && word == kProbeWord;
}

struct PeerRecord {
  std::string host_key;
  std::string address;
  int port = 0;
  pid_t pid = 0;
  uint64_t probe = 0;
};

absl::StatusOr<PeerRecord> ParseRecord(const std::string& text, int rank) {
  std::vector<std::string> f = absl::StrSplit(text, '|');
  PeerRecord r;
  int pid = 0;
  if (f.size() != 5 || !absl::SimpleAtoi(f[2], &r.port) || !absl::SimpleAtoi(f[3], &pid) ||
      !absl::SimpleAtoi(f[4], &r.probe)) {
    return absl::DataLossError(
        absl::StrCat("rank ", rank, "'s address record '", text, "' in the store is malformed"));
  }
  r.host_key = f[0];
  r.address = f[1];
  r.pid = pid;
  return r;
}

// Publishes `value` as <key>/<rank> in the store and reads every other
// rank's; returns all N values in rank order. `what` names the value in
// errors ("its address").
absl::StatusOr<std::vector<std::string>> PublishAndGather(Store& store, const std::string& key,
                                                          int rank, int n, const std::string& value,
                                                          const char* what, absl::Time deadline) {
  EMBER_RETURN_IF_ERROR(store.set(absl::StrCat(key, "/", rank), value));
  std::vector<std::string> values(n);
  values[rank] = value;
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    auto got = store.get(absl::StrCat(key, "/", p),
                         std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("tcp backend: rank ", p, " never published ", what, ": ",
                                       got.status().message()));
    }
    values[p] = std::move(*got);
  }
  return values;
}

}  // namespace

TcpOptions TcpOptions::FromEnv() {
  TcpOptions o;
  if (const char* v = std::getenv("EMBER_TCP_SHM"); v != nullptr && std::string(v) == "0") {
    o.shared_memory = false;
  }
  if (const char* v = std::getenv("EMBER_TCP_DIRECT"); v != nullptr && std::string(v) == "0") {
    o.direct_reads = false;
  }
  if (const char* v = std::getenv("EMBER_TCP_ARENA"); v != nullptr && std::string(v) == "0") {
    o.arena = false;
  }
  if (const char* v = std::getenv("EMBER_TCP_RING_BYTES"); v != nullptr) {
    size_t bytes = 0;
    if (absl::SimpleAtoi(v, &bytes) && bytes >= 4096) o.ring_bytes = bytes / 4096 * 4096;
  }
  return o;
}

SupportTable TcpSupportTable() { return SupportTable().allow_all(DeviceType::kCPU); }

absl::StatusOr<std::shared_ptr<TcpProcessGroup>> TcpProcessGroup::create(
    const BackendOptions& options, const TcpOptions& tcp) {
  EMBER_RETURN_IF_ERROR(CheckBackendOptions("tcp", options));
  const int rank = options.rank, n = options.size;
  Store& store = *options.store;
  const std::string prefix = options.store_prefix + "tcp/";
  const absl::Time deadline = absl::Now() + options.timeout;
  auto left = [&] { return std::max(deadline - absl::Now(), absl::ZeroDuration()); };

  EMBER_ASSIGN_OR_RETURN(Listener listener, Listener::Create());
  EMBER_ASSIGN_OR_RETURN(std::string address, LocalAddress());
  // Ranks with equal keys can share memory and see each other's pids.
  const std::string host_key = HostKey({"pid", "net"});
  EMBER_ASSIGN_OR_RETURN(
      std::vector<std::string> texts,
      PublishAndGather(store, prefix + "peer", rank, n,
                       absl::StrCat(host_key, "|", address, "|", listener.port(), "|", getpid(),
                                    "|", reinterpret_cast<uint64_t>(&kProbeWord)),
                       "its address", deadline));
  std::vector<PeerRecord> records(n);
  for (int p = 0; p < n; ++p) {
    EMBER_ASSIGN_OR_RETURN(records[p], ParseRecord(texts[p], p));
  }
  auto shm_key = [&](const char* what, int lo, int hi) {
    return absl::StrCat(prefix, what, "/", lo, "/", hi);
  };
  auto same_host = [&](int p) { return tcp.shared_memory && records[p].host_key == host_key; };

  std::vector<std::unique_ptr<Channel>> channels(n);
  std::vector<std::unique_ptr<ShmChannel>> created(n);
  // 1. Segments for the higher ranks on this host.
  for (int p = rank + 1; p < n; ++p) {
    if (!same_host(p)) continue;
    auto ch = ShmChannel::Create({tcp.ring_bytes, p, records[p].pid});
    EMBER_RETURN_IF_ERROR(
        store.set(shm_key("shm", rank, p), ch.ok() ? (*ch)->Locator() : std::string("none")));
    if (ch.ok()) created[p] = std::move(*ch);
  }
  // 2. Open the lower ranks' segments, or connect to them.
  for (int p = 0; p < rank; ++p) {
    if (same_host(p)) {
      EMBER_ASSIGN_OR_RETURN(std::string locator, store.get(shm_key("shm", p, rank), left()));
      if (locator != "none") {
        auto ch = ShmChannel::Open(locator, {tcp.ring_bytes, p, records[p].pid});
        EMBER_RETURN_IF_ERROR(store.set(shm_key("shm-ok", p, rank), ch.ok() ? "1" : "0"));
        if (ch.ok()) {
          channels[p] = std::move(*ch);
          continue;
        }
      }
    }
    auto fd = ConnectTo(records[p].address, records[p].port, deadline);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("tcp backend: rank ", rank, " cannot reach rank ", p, ": ",
                                       fd.status().message()));
    }
    const int32_t hello[2] = {static_cast<int32_t>(kHelloMagic), rank};
    EMBER_RETURN_IF_ERROR(WriteFully(fd->get(), hello, sizeof(hello), deadline));
    channels[p] = std::make_unique<SocketChannel>(
        std::move(*fd), p, absl::StrCat(records[p].address, ":", records[p].port));
  }
  // 3. The higher ranks: confirm their use of our segments, or accept them.
  int expected = 0;
  for (int p = rank + 1; p < n; ++p) {
    if (created[p]) {
      EMBER_ASSIGN_OR_RETURN(std::string ok, store.get(shm_key("shm-ok", rank, p), left()));
      if (ok == "1") {
        channels[p] = std::move(created[p]);
        continue;
      }
    }
    ++expected;
  }
  for (int i = 0; i < expected; ++i) {
    auto fd = listener.Accept(deadline);
    if (!fd.ok()) {
      return absl::Status(
          fd.status().code(),
          absl::StrCat("tcp backend: rank ", rank, ": ", expected - i, " of ", expected,
                       " higher ranks never connected: ", fd.status().message()));
    }
    int32_t hello[2] = {0, -1};
    EMBER_RETURN_IF_ERROR(ReadFully(fd->get(), hello, sizeof(hello), deadline));
    const int p = hello[1];
    if (hello[0] != static_cast<int32_t>(kHelloMagic) || p <= rank || p >= n || channels[p]) {
      --i;  // not one of ours (a stray connection): drop it
      continue;
    }
    channels[p] = std::make_unique<SocketChannel>(
        std::move(*fd), p, absl::StrCat(records[p].address, ":", records[p].port));
  }

  std::vector<PeerInfo> peers(n);
  std::vector<std::string> transports(n, "self");
  for (int p = 0; p < n; ++p) {
    peers[p].address = absl::StrCat(records[p].address, ":", records[p].port);
    peers[p].pid = records[p].pid;
    peers[p].same_host = records[p].host_key == host_key;
    if (channels[p]) transports[p] = channels[p]->Describe();
  }
  // 4. Direct reads (Note [Direct reads]): tell each peer on this host
  // whether we can read its memory, and learn whether it can read ours.
  if (tcp.direct_reads) {
    for (int p = 0; p < n; ++p) {
      if (p == rank || !same_host(p)) continue;
      peers[p].we_read_peer = CanReadMemoryOf(records[p].pid, records[p].probe);
      EMBER_RETURN_IF_ERROR(
          store.set(shm_key("direct", p, rank), peers[p].we_read_peer ? "1" : "0"));
    }
    for (int p = 0; p < n; ++p) {
      if (p == rank || !same_host(p)) continue;
      EMBER_ASSIGN_OR_RETURN(std::string ok, store.get(shm_key("direct", rank, p), left()));
      peers[p].peer_reads_us = ok == "1";
      if (peers[p].peer_reads_us) transports[p] += " + direct reads";
    }
  }
  // 5. The all_reduce arena (Note [Shared-memory all_reduce]), when every
  // rank is on this host: everyone publishes a segment (or "none"), maps
  // the others', and it is used only if every rank managed.
  std::unique_ptr<ShmArena> arena;
  const bool one_host = std::all_of(records.begin(), records.end(),
                                    [&](const PeerRecord& r) { return r.host_key == host_key; });
  if (n > 1 && one_host) {
    absl::StatusOr<std::unique_ptr<ShmArena>> created_arena =
        tcp.shared_memory && tcp.arena ? ShmArena::Create(rank, n)
                                       : absl::UnavailableError("turned off");
    EMBER_ASSIGN_OR_RETURN(
        std::vector<std::string> locators,
        PublishAndGather(store, prefix + "arena", rank, n,
                         created_arena.ok() ? (*created_arena)->Locator() : "none",
                         "its all_reduce arena", deadline));
    bool ok = created_arena.ok();
    for (int p = 0; p < n && ok; ++p) {
      ok = p == rank || (locators[p] != "none" && (*created_arena)->Attach(p, locators[p]).ok());
    }
    EMBER_ASSIGN_OR_RETURN(std::vector<std::string> oks,
                           PublishAndGather(store, prefix + "arena-ok", rank, n, ok ? "1" : "0",
                                            "whether it mapped the all_reduce arenas", deadline));
    if (std::all_of(oks.begin(), oks.end(), [](const std::string& v) { return v == "1"; })) {
      arena = std::move(*created_arena);
    }
  }
  auto mesh = std::make_shared<Mesh>(rank, std::move(channels), std::move(peers), &OpCodeName);
  return std::shared_ptr<TcpProcessGroup>(
      new TcpProcessGroup(options, std::move(mesh), std::move(arena), std::move(transports)));
}

TcpProcessGroup::TcpProcessGroup(const BackendOptions& options, std::shared_ptr<Mesh> mesh,
                                 std::unique_ptr<ShmArena> arena,
                                 std::vector<std::string> transports)
    : ProcessGroup(options.rank, options.size, "tcp", TcpSupportTable(), options.timeout),
      mesh_(std::move(mesh)),
      arena_(std::move(arena)),
      transports_(std::move(transports)),
      queue_({.admit = [this](const OpQueue::Op&) { return Admit(); }}) {
  PublishProgress(options.store, options.store_prefix);
}

// What is still queued runs first (Note [Op queues]).
TcpProcessGroup::~TcpProcessGroup() { queue_.Join(); }

std::string TcpProcessGroup::TransportTo(int peer) const {
  return peer >= 0 && peer < static_cast<int>(transports_.size()) ? transports_[peer] : "none";
}

// Note [Failing cleanly] (distributed.cc): the mesh fails every posted
// receive and interrupts every channel, which wakes the worker wherever it
// waits (a socket, a shared-memory ring, the arena); queued ops then fail in
// their turn through Admit, without touching a peer.
void TcpProcessGroup::abort() {
  OnAbort();
  absl::Status status;
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    first = aborted_.ok();
    if (first) aborted_ = absl::AbortedError(AbortReason());
    status = aborted_;
  }
  // destroy_process_group (shutdown) leaves as the destructor would: the
  // peers fail only what they wait for from this rank.
  if (first && shutting_down()) {
    mesh_->SayGoodbye(absl::Now() + absl::Milliseconds(100));
  }
  mesh_->Abort(status);
  if (arena_) arena_->Interrupt();
}

std::shared_ptr<Work> TcpProcessGroup::Enqueue(OpType op,
                                               const std::optional<absl::Duration>& timeout,
                                               bool collective, Job job) {
  const absl::Time deadline = DeadlineFor(timeout);
  // The worker enforces `deadline` itself, naming the peer at fault; the
  // Work's own backstop only covers a worker that never gets there.
  auto work = std::make_shared<Work>(op, deadline + kBackstop);
  absl::MutexLock lock(&mu_);
  const int64_t seq = collective ? next_seq_++ : -1;
  std::string what = collective ? absl::StrCat(op_type_name(op), " (collective #", seq, ")")
                                : std::string(op_type_name(op));
  std::optional<CallFingerprint> check;
  if (const CallFingerprint* call = IssuingCall(); call != nullptr && collective && size() > 1) {
    check = *call;
  }
  Queued item{{op, seq, deadline, what}, std::move(job), std::move(check)};
  queue_.Push({.work = work,
               .what = std::move(what),
               .deadline = deadline,
               .run = [this, item = std::move(item)] { return Run(item); }});
  return work;
}

// tcp's transport of the call check (Note [Call checks] in
// process_group.cc): each rank sends its words to every peer as step
// kCallCheckStep of the collective, on the channels the collective's data
// takes after them, so a peer's words arrive before its data. The words are
// compared once the collective has run or failed: the mesh refuses any
// message whose size or op differs from the receive posted for it, so a
// mismatch cannot write out of bounds meanwhile; it only fails there with
// the transport's words, which the check's message then replaces. A rank
// that timed out does not wait for words that are not there.
absl::Status TcpProcessGroup::RunChecked(const Queued& item) {
  const OpContext& ctx = item.context;
  if (!item.check) return item.job(ctx);
  const std::vector<int64_t>& words = item.check->words();
  const int n = size(), r = rank();
  const size_t count = words.size();
  std::vector<int64_t> all(count * n);
  std::copy(words.begin(), words.end(), all.begin() + r * count);
  const MessageKey key{MessageKind::kCollective, ctx.seq, kCallCheckStep};
  std::vector<std::shared_ptr<PendingRecv>> recvs(n);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    char* at = reinterpret_cast<char*>(&all[p * count]);
    recvs[p] = mesh_->Post(p, key, kAnyOp, count * sizeof(int64_t), CopySink(at), nullptr, at);
  }
  const absl::Span<const char> mine(reinterpret_cast<const char*>(words.data()),
                                    count * sizeof(int64_t));
  absl::Status status;
  for (int i = 1; i < n && status.ok(); ++i) {
    status = SendTo(*mesh_, ctx, (r + i) % n, kCallCheckStep, mine);
  }
  if (status.ok()) status = item.job(ctx);
  // After a success every peer's words were sent before its data; after a
  // timeout the missing ones are not coming.
  const absl::Time until = status.ok() ? ctx.deadline
                           : absl::IsDeadlineExceeded(status)
                               ? absl::Now()
                               : std::min(ctx.deadline, absl::Now() + absl::Seconds(1));
  // Every receive is finished or cancelled before `all` goes away.
  std::vector<absl::Status> got(n);
  for (int p = 0; p < n; ++p) {
    if (p != r) got[p] = mesh_->Wait(recvs[p], until, ctx.what, /*settle=*/false);
  }
  absl::Status missing;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    if (!got[p].ok()) {
      if (missing.ok()) missing = got[p];
      continue;
    }
    EMBER_RETURN_IF_ERROR(
        item.check->Check(ctx.what, r, p, absl::MakeConstSpan(&all[p * count], count)));
  }
  if (status.ok() && !missing.ok()) {
    return absl::Status(missing.code(),
                        absl::StrCat(missing.message(),
                                     " (the call check waits for every rank to reach the "
                                     "collective; EMBER_CHECK_COLLECTIVES must be alike on "
                                     "every rank)"));
  }
  return status;
}

absl::Status TcpProcessGroup::Admit() {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

absl::Status TcpProcessGroup::Run(const Queued& item) {
  absl::Status status;
  try {
    status = RunChecked(item);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat(item.context.what, ": ", e.what()));
  }
  if (!status.ok() && item.context.seq >= 0) mesh_->Poison(item.context.seq, status);
  return status;
}

// --- The ops ------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoBroadcast(
    const Tensor& tensor, const BroadcastOptions& options) {
  const int root = options.root;
  return Enqueue(OpType::kBroadcast, options.timeout, true,
                 [this, tensor, root](const OpContext& ctx) -> absl::Status {
                   Mesh& m = *mesh_;
                   const int n = size();
                   Tensor data = ContiguousStaging(tensor);
                   std::vector<std::optional<absl::Span<const char>>> sends(n);
                   std::vector<std::optional<Target>> recvs(n);
                   if (rank() == root) {
                     for (int p = 0; p < n; ++p) sends[p] = Bytes(data);
                   } else {
                     recvs[root] = Target{Data(data), data.nbytes()};
                   }
                   EMBER_RETURN_IF_ERROR(Exchange(m, ctx, 0, sends, recvs));
                   if (rank() != root) CopyBackFromStaging(tensor, data);
                   return absl::OkStatus();
                 });
}

TcpProcessGroup::AllReduceKind TcpProcessGroup::ChooseAllReduce(size_t nbytes) const {
  const int n = size();
  if (n == 1) return AllReduceKind::kNone;
  if (nbytes * (n - 1) <= kDirectAllReduceBytes) return AllReduceKind::kDirect;
  if (arena_ && arena_->Usable()) return AllReduceKind::kArena;
  return AllReduceKind::kRing;
}

std::string TcpProcessGroup::AllReduceAlgorithm(size_t nbytes) const {
  switch (ChooseAllReduce(nbytes)) {
    case AllReduceKind::kNone:
      return "none";
    case AllReduceKind::kDirect:
      return "direct";
    case AllReduceKind::kArena:
      return "arena";
    case AllReduceKind::kRing:
      return "ring";
  }
  return "unknown";
}

ShmArena::Op TcpProcessGroup::ArenaOp(const OpContext& ctx) const {
  Mesh* mesh = mesh_.get();
  const int64_t seq = ctx.seq;
  return {.seq = seq,
          .what = ctx.what,
          .deadline = ctx.deadline,
          .failure = [mesh, seq] { return mesh->CollectiveFailure(seq); },
          .describe = [mesh](int peer) { return mesh->DescribePeer(peer); }};
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoAllReduce(
    const Tensor& tensor, const AllReduceOptions& options) {
  const ReduceOp op = options.op;
  return Enqueue(
      OpType::kAllReduce, options.timeout, true,
      [this, tensor, op](const OpContext& ctx) -> absl::Status {
        Tensor data = ContiguousStaging(tensor);
        const AllReduceKind kind = ChooseAllReduce(data.nbytes());
        if (arena_ && kind != AllReduceKind::kArena) {
          arena_->AnnounceElsewhere(ctx.seq, data.nbytes(), data.dtype(), op);
        }
        absl::Status status;
        switch (kind) {
          case AllReduceKind::kNone:
            break;
          case AllReduceKind::kDirect:
            status = DirectAllReduce(*mesh_, ctx, Data(data), data.numel(), data.dtype(), op);
            break;
          case AllReduceKind::kArena:
            status = arena_->AllReduce(ArenaOp(ctx), Data(data), data.numel(), data.dtype(), op);
            break;
          case AllReduceKind::kRing:
            status = RingAllReduce(*mesh_, ctx, Data(data), data.numel(), data.dtype(), op);
            break;
        }
        EMBER_RETURN_IF_ERROR(status);
        CopyBackFromStaging(tensor, data);
        return absl::OkStatus();
      });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoReduce(const Tensor& tensor,
                                                                const ReduceOptions& options) {
  const ReduceOp op = options.op;
  const int root = options.root;
  return Enqueue(OpType::kReduce, options.timeout, true,
                 [this, tensor, op, root](const OpContext& ctx) -> absl::Status {
                   Mesh& m = *mesh_;
                   const int n = size(), r = rank();
                   // Non-roots reduce in a scratch copy: their tensor is left as it was.
                   Tensor data = r == root ? ContiguousStaging(tensor) : tensor.clone();
                   if (!data.is_contiguous()) data = data.contiguous();
                   if (n == 1) return absl::OkStatus();
                   const size_t elem = data.element_size();
                   EMBER_RETURN_IF_ERROR(
                       RingReduceScatter(m, ctx, Data(data), data.numel(), data.dtype(), op));
                   Segment own = SegmentOf(r + 1, n, data.numel(), elem);
                   if (op == ReduceOp::kAvg) {
                     DivideBy(data.dtype(), Data(data) + own.offset,
                              static_cast<int64_t>(own.nbytes / elem), n);
                   }
                   std::vector<std::optional<absl::Span<const char>>> sends(n);
                   std::vector<std::optional<Target>> recvs(n);
                   if (r == root) {
                     for (int p = 0; p < n; ++p) {
                       Segment s = SegmentOf(p + 1, n, data.numel(), elem);
                       recvs[p] = Target{Data(data) + s.offset, s.nbytes};
                     }
                   } else {
                     sends[root] = absl::Span<const char>(Data(data) + own.offset, own.nbytes);
                   }
                   EMBER_RETURN_IF_ERROR(Exchange(m, ctx, n - 1, sends, recvs));
                   if (r == root) CopyBackFromStaging(tensor, data);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoAllGather(
    absl::Span<const Tensor> outputs, const Tensor& input, const AllGatherOptions& options) {
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  return Enqueue(OpType::kAllGather, options.timeout, true,
                 [this, outs, input](const OpContext& ctx) -> absl::Status {
                   std::vector<Tensor> staged;
                   for (const Tensor& t : outs) staged.push_back(ContiguousStaging(t));
                   EMBER_RETURN_IF_ERROR(AllGatherInto(*mesh_, ctx, Targets(staged),
                                                       Bytes(ContiguousStaging(input))));
                   for (size_t i = 0; i < outs.size(); ++i) CopyBackFromStaging(outs[i], staged[i]);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoAllGatherIntoTensor(
    const Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  return Enqueue(OpType::kAllGatherIntoTensor, options.timeout, true,
                 [this, output, input](const OpContext& ctx) -> absl::Status {
                   const int n = size();
                   Tensor out = ContiguousStaging(output);
                   Tensor flat = out.reshape({out.numel()});
                   const int64_t m = input.numel();
                   std::vector<Tensor> parts;
                   for (int p = 0; p < n; ++p) parts.push_back(flat.narrow(0, p * m, m));
                   EMBER_RETURN_IF_ERROR(
                       AllGatherInto(*mesh_, ctx, Targets(parts), Bytes(ContiguousStaging(input))));
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoGather(absl::Span<const Tensor> outputs,
                                                                const Tensor& input,
                                                                const GatherOptions& options) {
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  const int root = options.root;
  return Enqueue(OpType::kGather, options.timeout, true,
                 [this, outs, input, root](const OpContext& ctx) -> absl::Status {
                   const int n = size(), r = rank();
                   Tensor in = ContiguousStaging(input);
                   std::vector<std::optional<absl::Span<const char>>> sends(n);
                   std::vector<std::optional<Target>> recvs(n);
                   std::vector<Tensor> staged;
                   if (r == root) {
                     for (int p = 0; p < n; ++p) {
                       staged.push_back(ContiguousStaging(outs[p]));
                       recvs[p] = Target{Data(staged[p]), staged[p].nbytes()};
                     }
                     std::memcpy(Data(staged[r]), in.raw_data(), in.nbytes());
                   } else {
                     sends[root] = Bytes(in);
                   }
                   EMBER_RETURN_IF_ERROR(Exchange(*mesh_, ctx, 0, sends, recvs));
                   for (size_t i = 0; i < staged.size(); ++i)
                     CopyBackFromStaging(outs[i], staged[i]);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoScatter(const Tensor& output,
                                                                 absl::Span<const Tensor> inputs,
                                                                 const ScatterOptions& options) {
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  const int root = options.root;
  return Enqueue(OpType::kScatter, options.timeout, true,
                 [this, output, ins, root](const OpContext& ctx) -> absl::Status {
                   const int n = size(), r = rank();
                   Tensor out = ContiguousStaging(output);
                   std::vector<std::optional<absl::Span<const char>>> sends(n);
                   std::vector<std::optional<Target>> recvs(n);
                   std::vector<Tensor> staged;
                   if (r == root) {
                     for (int p = 0; p < n; ++p) {
                       staged.push_back(ContiguousStaging(ins[p]));
                       sends[p] = Bytes(staged[p]);
                     }
                     std::memcpy(Data(out), staged[r].raw_data(), out.nbytes());
                   } else {
                     recvs[root] = Target{Data(out), out.nbytes()};
                   }
                   EMBER_RETURN_IF_ERROR(Exchange(*mesh_, ctx, 0, sends, recvs));
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoReduceScatter(
    const Tensor& output, absl::Span<const Tensor> inputs, const ReduceScatterOptions& options) {
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  const ReduceOp op = options.op;
  return Enqueue(OpType::kReduceScatter, options.timeout, true,
                 [this, output, ins, op](const OpContext& ctx) -> absl::Status {
                   const int n = size(), r = rank();
                   Tensor out = ContiguousStaging(output);
                   std::vector<Tensor> staged;
                   std::vector<std::optional<absl::Span<const char>>> sends(n);
                   std::vector<std::optional<Target>> recvs(n);
                   std::vector<std::string> received(n);
                   for (int p = 0; p < n; ++p) {
                     staged.push_back(ContiguousStaging(ins[p]));
                     sends[p] = Bytes(staged[p]);
                     if (p != r) {
                       received[p].resize(out.nbytes());
                       recvs[p] = Target{received[p].data(), out.nbytes()};
                     }
                   }
                   EMBER_RETURN_IF_ERROR(Exchange(*mesh_, ctx, 0, sends, recvs));
                   // Reduce in rank order 0..n-1.
                   auto part = [&](int p) -> const char* {
                     return p == r ? static_cast<const char*>(staged[r].raw_data())
                                   : received[p].data();
                   };
                   std::memcpy(Data(out), part(0), out.nbytes());
                   for (int p = 1; p < n; ++p) {
                     ReduceInto(op, out.dtype(), Data(out), part(p), out.numel());
                   }
                   if (op == ReduceOp::kAvg) DivideBy(out.dtype(), Data(out), out.numel(), n);
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoAllToAll(absl::Span<const Tensor> outputs,
                                                                  absl::Span<const Tensor> inputs,
                                                                  const AllToAllOptions& options) {
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  return Enqueue(OpType::kAllToAll, options.timeout, true,
                 [this, outs, ins](const OpContext& ctx) -> absl::Status {
                   const int n = size(), r = rank();
                   std::vector<Tensor> in_staged, out_staged;
                   std::vector<std::optional<absl::Span<const char>>> sends(n);
                   std::vector<std::optional<Target>> recvs(n);
                   for (int p = 0; p < n; ++p) {
                     in_staged.push_back(ContiguousStaging(ins[p]));
                     out_staged.push_back(ContiguousStaging(outs[p]));
                     sends[p] = Bytes(in_staged[p]);
                     recvs[p] = Target{Data(out_staged[p]), out_staged[p].nbytes()};
                   }
                   if (in_staged[r].nbytes() != out_staged[r].nbytes()) {
                     return absl::InvalidArgumentError(absl::StrCat(
                         ctx.what, ": inputs[", r, "] has ", in_staged[r].numel(),
                         " elements but outputs[", r, "] has ", out_staged[r].numel()));
                   }
                   std::memcpy(Data(out_staged[r]), in_staged[r].raw_data(), in_staged[r].nbytes());
                   EMBER_RETURN_IF_ERROR(Exchange(*mesh_, ctx, 0, sends, recvs));
                   for (int p = 0; p < n; ++p) CopyBackFromStaging(outs[p], out_staged[p]);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoBarrier(const BarrierOptions& options) {
  return Enqueue(
      OpType::kBarrier, options.timeout, true, [this](const OpContext& ctx) -> absl::Status {
        const int n = size();
        std::vector<std::optional<absl::Span<const char>>> sends(n, absl::Span<const char>());
        std::vector<std::optional<Target>> recvs(n, Target{nullptr, 0});
        return Exchange(*mesh_, ctx, 0, sends, recvs);
      });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoMonitoredBarrier(
    const MonitoredBarrierOptions& options) {
  const bool wait_all = options.wait_all_ranks;
  const absl::Duration timeout = options.timeout.value_or(this->timeout());
  return Enqueue(OpType::kMonitoredBarrier, options.timeout, true,
                 [this, wait_all, timeout](const OpContext& ctx) -> absl::Status {
                   Mesh& m = *mesh_;
                   const int n = size(), r = rank();
                   const uint8_t code = static_cast<uint8_t>(ctx.op);
                   const MessageKey arrive{MessageKind::kCollective, ctx.seq, 0};
                   const MessageKey release{MessageKind::kCollective, ctx.seq, 1};
                   if (r != 0) {
                     // Rank 0 judges who is missing; its verdict (poison) arrives after
                     // the timeout, so the others wait a little longer for it.
                     auto ack = m.Post(0, release, code, 0, CopySink(nullptr));
                     EMBER_RETURN_IF_ERROR(SendTo(m, ctx, 0, 0, {}));
                     return m.Wait(ack, ctx.deadline + absl::Seconds(1), ctx.what);
                   }
                   std::vector<std::shared_ptr<PendingRecv>> arrivals(n);
                   for (int p = 1; p < n; ++p)
                     arrivals[p] = m.Post(p, arrive, code, 0, CopySink(nullptr));
                   std::vector<int> missing;
                   for (int p = 1; p < n; ++p) {
                     // A rank that timed out, left or died did not pass the barrier.
                     absl::Status s = m.Wait(arrivals[p], ctx.deadline, ctx.what, /*settle=*/false);
                     if (s.ok()) continue;
                     if (absl::IsAborted(s)) return s;
                     missing.push_back(p);
                     if (!wait_all) break;
                   }
                   if (!missing.empty()) return MonitoredBarrierTimeout(missing, timeout);
                   for (int p = 1; p < n; ++p) EMBER_RETURN_IF_ERROR(SendTo(m, ctx, p, 1, {}));
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> TcpProcessGroup::DoSend(const Tensor& tensor, int dst,
                                                              const P2POptions& options) {
  const int tag = options.tag;
  Tensor data = ContiguousStaging(tensor);
  return Enqueue(OpType::kSend, options.timeout, false,
                 [this, data, dst, tag](const OpContext& ctx) -> absl::Status {
                   absl::Status s = mesh_->Send(dst, {MessageKind::kP2P, tag, 0}, kAnyOp,
                                                Bytes(data), ctx.deadline);
                   if (s.ok()) return s;
                   return absl::Status(s.code(), absl::StrCat("send to ", mesh_->DescribePeer(dst),
                                                              " (tag ", tag, "): ", s.message()));
                 });
}

namespace {

// irecv's Work: at its deadline it cancels the posted receive. It holds the
// mesh weakly: the receive's callback runs on a mesh reader thread and may
// drop the last reference to this Work, which must not destroy the mesh
// there (a reader cannot join itself). A mesh already gone has failed the
// receive (Mesh::~Mesh aborts what is pending).
class TcpRecvWork : public RecvWork {
 public:
  TcpRecvWork(absl::Time deadline, std::weak_ptr<Mesh> mesh, int src, int tag)
      : RecvWork(OpType::kRecv, deadline), mesh_(std::move(mesh)), src_(src), tag_(tag) {}
  void set_recv(std::shared_ptr<PendingRecv> recv) { recv_ = std::move(recv); }

 protected:
  void OnDeadline() override {
    std::shared_ptr<Mesh> mesh = mesh_.lock();
    if (recv_ && mesh) {
      mesh->Cancel(
          recv_, absl::DeadlineExceededError(absl::StrCat("recv from ", mesh->DescribePeer(src_),
                                                          " (tag ", tag_, "): timed out")));
    }
  }

 private:
  std::weak_ptr<Mesh> mesh_;
  int src_;
  int tag_;
  std::shared_ptr<PendingRecv> recv_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<RecvWork>> TcpProcessGroup::DoRecv(const Tensor& tensor, int src,
                                                                  const P2POptions& options) {
  auto work = std::make_shared<TcpRecvWork>(DeadlineFor(options.timeout), mesh_, src, options.tag);
  Tensor staging = ContiguousStaging(tensor);
  std::weak_ptr<TcpRecvWork> weak = work;
  RecvDone done = [weak, tensor, staging](const absl::Status& status, int from) {
    absl::Status s = status;
    if (s.ok()) CopyBackFromStaging(tensor, staging);
    if (auto w = weak.lock()) {
      w->set_source(from);
      w->Finish(s);
    }
  };
  work->set_recv(mesh_->Post(src == kAnySource ? kFromAnyRank : src,
                             {MessageKind::kP2P, options.tag, 0}, kAnyOp, staging.nbytes(),
                             CopySink(Data(staging)), std::move(done), Data(staging)));
  return std::shared_ptr<RecvWork>(work);
}

EMBER_REGISTER_BACKEND(
    tcp,
    BackendInfo{
        .name = "tcp",
        .support = TcpSupportTable(),
        .create =
            [](const BackendOptions& options) -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
          EMBER_ASSIGN_OR_RETURN(const TcpOptions* given, OptionsFor<TcpOptions>(options, "tcp"));
          EMBER_ASSIGN_OR_RETURN(
              auto pg,
              TcpProcessGroup::create(options, given != nullptr ? *given : TcpOptions::FromEnv()));
          return std::shared_ptr<ProcessGroup>(std::move(pg));
        }});

}  // namespace ember::distributed::tcp
