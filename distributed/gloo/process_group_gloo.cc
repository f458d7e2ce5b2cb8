#include "distributed/gloo/process_group_gloo.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "distributed/backend_util.h"
#include "distributed/gloo/device.h"
#include "distributed/gloo/mesh.h"
#include "distributed/gloo/pair_abort.h"
#include "distributed/gloo/staging.h"
#include "distributed/gloo/store_adapter.h"
#include "distributed/peer_process.h"
#include "distributed/reduce.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/gather.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/scatter.h"
#include "gloo/transport/unbound_buffer.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::gloo {

// Note [gloo exceptions]
// gloo reports every failure by throwing (gloo::IoException for the network
// and timeouts, gloo::EnforceNotMet for calls it refuses, such as peers
// whose sizes disagree). Those exceptions are confined to this file: each
// job runs inside one try block on the worker thread (or a p2p waiter), and
// Translate turns what it caught into the Work's Status, naming the op and
// the peers at fault. gloo's messages name neither ranks nor ops, so after a
// collective fails each rank writes "failed/<seq>/<rank>" to the store and
// waits a short grace for the others' keys: a rank whose key does not appear
// never got as far as failing this collective (it is stopped, dead, or busy
// elsewhere), and is the one named. Ranks on this host are described with
// their process state, as the tcp backend does. The store round trips happen
// only after a failure, so successful ops pay nothing for this.
//
// gloo writes to its sockets with plain write calls, so a peer that dies
// mid-collective would end the writer with SIGPIPE before any exception could
// be thrown. Creating a gloo group therefore ignores SIGPIPE when the process
// still has the default action (a handler the program installed is left
// alone), as the Python interpreter does for PyTorch's gloo users: the write
// then fails with EPIPE, gloo throws, and the error names the lost peer.
//
// One failure cannot be caught: when ranks pass different sizes, gloo's
// network thread reads a message longer than the posted buffer and its
// assertion ends the process (PyTorch's gloo backend crashes the same way).
// So each collective's call is checked first (Note [Call checks] in
// process_group.cc: the layer above builds the words and compares them; here
// they only travel): when the call is made, its words are sent to every
// peer and a receive for each peer's is posted (PostCheck), and the worker,
// before the collective, waits for them and compares (CheckPosted). A
// disagreement fails the collective on every rank with kFailedPrecondition
// naming both calls, before gloo sees any data. Posting at the call rather
// than all-gathering on the worker lets the words travel while the worker
// is still busy or waking up; a lone collective still waits one message for
// them. EMBER_CHECK_COLLECTIVES=0 turns it off for jobs known to be
// consistent.

// Note [Joining PyTorch ranks]
// PyTorch's ranks can share a group with this backend's when they share a
// store and agree on every key and tag:
// - the group's keys are where PyTorch puts them (Note [Store layout] in
//   distributed.cc): the full mesh is met in each peer's gloo dialect (Note
//   [Two gloo dialects] in mesh.cc: libgloo's rendezvous under "<group>/0/"
//   for PyTorch 1.13, which links the same libgloo; the newer gloo's record
//   for PyTorch 2.x), and rank 0 writes the 8-byte
//   "<group>/SEQ_NUM_STORE_KEY" that PyTorch 1.13's other ranks wait for;
// - collective #n (counting from 0 in the order issued) runs with gloo tag
//   n and the same gloo algorithm PyTorch calls (gloo::allreduce with its
//   default ring, gloo::broadcast, gloo::allgather over flat buffers, ...);
// - send/recv use the caller's tag as the slot.
// Ember's own keys (where each rank runs, which ranks failed a collective)
// live under "<group>/ember_gloo/"; a rank that wrote none is a PyTorch
// rank, which cannot take part in the call check, so a group with one runs
// without it. Ops PyTorch's gloo backend lacks (reduce_scatter, AVG) or
// implements with other messages (monitored_barrier) are Ember-only.
// distributed/gloo/torch_interop_test runs such mixed groups.

namespace {

using ::ember::distributed::gloo::GlooProcessGroup;
using Clock = std::chrono::milliseconds;

// Note [gloo exceptions]: SIGPIPE.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

// Where Ember's own keys live under a group's prefix (Note [Joining PyTorch
// ranks]).
constexpr char kEmberKeys[] = "ember_gloo/";
// Collective #seq runs with gloo tag seq, as PyTorch numbers its gloo
// collectives; the top bit, which PyTorch's counter never reaches, is kept
// clear (it marked the call check's all-gather before the check moved to
// slots of its own, kCheckSlot below).
constexpr uint32_t kCheckTagBit = uint32_t{1} << 31;
// Point-to-point messages use the caller's tag as the slot, as PyTorch's
// gloo backend does (gloo's collectives build slots with a nonzero top
// byte, gloo::Slot::build, so the two never meet). Ember's monitored barrier
// uses slots of its own.
constexpr uint64_t kArriveSlot = uint64_t{0xE2} << 56;
constexpr uint64_t kReleaseSlot = uint64_t{0xE3} << 56;
// The call check's words of collective #seq travel in slot kCheckSlot | seq.
constexpr uint64_t kCheckSlot = uint64_t{0xE4} << 56;
// How long after an op's deadline its Work gives up on the worker, so that
// the worker's error (which names the peers) is the one reported.
constexpr absl::Duration kBackstop = absl::Seconds(3);

char* Data(const Tensor& t) { return static_cast<char*>(t.raw_data()); }
// Whether two contiguous tensors' bytes overlap.
bool Overlap(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.raw_data());
  const char* b0 = static_cast<const char*>(b.raw_data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

std::chrono::milliseconds Left(absl::Time deadline) {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// gloo's reduce function: c[i] = a[i] op b[i] for n elements, with the
// kernels the tcp backend uses (distributed/reduce.h); gloo passes c == a
// (or b) when it reduces in place.
std::function<void(void*, const void*, const void*, size_t)> ReduceFunction(ReduceOp op,
                                                                            Dtype dtype) {
  return [op, dtype](void* c, const void* a, const void* b, size_t n) {
    const auto count = static_cast<int64_t>(n);
    if (c == a) {
      ReduceInto(op, dtype, c, b, count);
    } else if (c == b) {
      ReduceInto(op, dtype, c, a, count);
    } else {
      ReduceTo(op, dtype, c, a, b, count);
    }
  };
}

// The queue's admission (Note [Op queues]): a collective whose timeout
// passed while it waited for its turn fails without running.
absl::Status StartsInTime(const OpQueue::Op& op) {
  if (absl::Now() < op.deadline) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat(op.what, ": its timeout passed before it could start"));
}

// The call check's words of one collective (Note [gloo exceptions]):
// `all` holds every rank's (this rank's included); one send to and one
// receive from each peer, posted when the call is made.
struct PostedCheck {
  CallFingerprint call;
  std::vector<int64_t> all;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends, recvs;  // by rank
  std::exception_ptr error;  // what gloo threw while posting them
};

void PostCheck(::gloo::Context& context, int rank, int size, int64_t seq, PostedCheck& check) {
  const std::vector<int64_t>& mine = check.call.words();
  const size_t count = mine.size(), bytes = count * sizeof(int64_t);
  check.all.assign(count * size, 0);
  std::copy(mine.begin(), mine.end(), check.all.begin() + rank * count);
  check.sends.resize(size);
  check.recvs.resize(size);
  const uint64_t slot = kCheckSlot | static_cast<uint64_t>(seq);
  try {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      check.recvs[p] = context.createUnboundBuffer(&check.all[p * count], bytes);
      check.recvs[p]->recv(p, slot);
      check.sends[p] = context.createUnboundBuffer(const_cast<int64_t*>(mine.data()), bytes);
      check.sends[p]->send(p, slot);
    }
  } catch (const std::exception&) {
    check.error = std::current_exception();
  }
}

// Waits for every peer's words and compares. gloo's exceptions (a peer
// lost while posting, the deadline while waiting) go to the worker, which
// turns them into an error naming the ranks at fault.
absl::Status CheckPosted(const GlooProcessGroup::OpContext& ctx, int rank, PostedCheck& check) {
  if (check.error) std::rethrow_exception(check.error);
  for (auto& recv : check.recvs) {
    if (recv != nullptr) recv->waitRecv(Left(ctx.deadline));
  }
  for (auto& send : check.sends) {
    if (send != nullptr) send->waitSend(Left(ctx.deadline));
  }
  return check.call.CheckAll(ctx.what, rank, check.all);
}

}  // namespace

SupportTable GlooSupportTable() {
  SupportTable table = SupportTable().allow_all(DeviceType::kCPU);
  // Device tensors go through pinned host memory (Note [gloo on device
  // tensors] in staging.cc); the barriers carry no tensor.
  for (int op = 0; op < kNumOpTypes; ++op) {
    const auto type = static_cast<OpType>(op);
    if (type != OpType::kBarrier && type != OpType::kMonitoredBarrier) {
      table.allow(type, DeviceType::kCUDA);
    }
  }
  return table;
}

// --- Creation --------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<GlooProcessGroup>> GlooProcessGroup::create(
    const BackendOptions& options) {
  EMBER_RETURN_IF_ERROR(CheckBackendOptions("gloo", options));
  const int rank = options.rank, n = options.size;
  // Note [Joining PyTorch ranks]: the mesh and sequence-number keys are
  // PyTorch's; Ember's own keys live under "ember_gloo/".
  const std::string prefix = options.store_prefix + kEmberKeys;
  const absl::Time deadline = absl::Now() + options.timeout;
  Store& store = *options.store;

  // Where this rank runs, for error messages.
  const std::string host_key = HostKey({"pid"});  // ranks that see each other's pids
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EMBER_RETURN_IF_ERROR(store.set(absl::StrCat(prefix, "proc/", rank),
                                  absl::StrCat(host_key, "|", getpid(), "|", host)));
  if (rank == 0) {
    // PyTorch's other ranks read their group's sequence number from rank 0.
    const uint64_t seq = absl::Uniform<uint64_t>(absl::BitGen());
    EMBER_RETURN_IF_ERROR(store.set(options.store_prefix + "SEQ_NUM_STORE_KEY",
                                    std::string_view(reinterpret_cast<const char*>(&seq), 8)));
  }

  EMBER_ASSIGN_OR_RETURN(const GlooOptions* given, OptionsFor<GlooOptions>(options, "gloo"));
  DeviceChoice choice = ChooseDevice();
  if (given != nullptr && !given->interface.empty()) {
    choice = {.interface = given->interface,
              .describe = absl::StrCat("interface ", given->interface, " (pg_options)")};
  }
  IgnoreSigpipeUnlessHandled();
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<::gloo::transport::Device> device, CreateDevice(choice));
  // Each peer is met in its gloo's dialect (Note [Two gloo dialects] in
  // mesh.cc): libgloo's for Ember and PyTorch 1.13 ranks, the newer one for
  // PyTorch 2.x ranks.
  absl::StatusOr<MeshResult> mesh = ConnectFullMesh({.store = options.store,
                                                     .group_prefix = options.store_prefix,
                                                     .rank = rank,
                                                     .size = n,
                                                     .device = device,
                                                     .timeout = deadline - absl::Now(),
                                                     .ember_record_prefix = prefix + "proc/"});
  if (!mesh.ok()) {
    return absl::Status(mesh.status().code(), absl::StrCat(mesh.status().message(), " (over ",
                                                           choice.describe, ")"));
  }
  std::shared_ptr<::gloo::Context> context = std::move(mesh->context);
  context->setTimeout(Clock(absl::ToInt64Milliseconds(options.timeout)));

  // Every Ember rank wrote its record before connecting, so a record missing
  // now belongs to a rank that is not Ember (a PyTorch process).
  std::vector<Peer> peers(n);
  for (int p = 0; p < n; ++p) {
    absl::StatusOr<std::string> got =
        store.get(absl::StrCat(prefix, "proc/", p), absl::ZeroDuration());
    if (!got.ok()) {
      if (absl::IsDeadlineExceeded(got.status()) || absl::IsNotFound(got.status())) {
        peers[p].ember = false;
        continue;
      }
      return got.status();
    }
    std::vector<std::string> f = absl::StrSplit(*got, '|');
    if (f.size() != 3 || !absl::SimpleAtoi(f[1], &peers[p].pid)) {
      return absl::DataLossError(absl::StrCat("gloo backend: rank ", p, "'s record '", *got,
                                              "' in the store is malformed"));
    }
    peers[p].same_host = f[0] == host_key;
    peers[p].host = f[2];
  }
  return std::shared_ptr<GlooProcessGroup>(
      new GlooProcessGroup(options, std::move(context), choice.describe, std::move(peers)));
}

GlooProcessGroup::GlooProcessGroup(const BackendOptions& options,
                                   std::shared_ptr<::gloo::Context> context,
                                   std::string device_description, std::vector<Peer> peers)
    : ProcessGroup(options.rank, options.size, "gloo", GlooSupportTable(), options.timeout),
      store_(options.store),
      prefix_(options.store_prefix + kEmberKeys),
      context_(std::move(context)),
      check_calls_(std::all_of(peers.begin(), peers.end(), [](const Peer& p) { return p.ember; })),
      device_description_(std::move(device_description)),
      peers_(std::move(peers)),
      queue_({.admit = &StartsInTime}) {
  PublishProgress(options.store, prefix_);
}

GlooProcessGroup::~GlooProcessGroup() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (OpQueue::Op& op : queue_.TakeQueued()) {
      op.work->Finish(absl::AbortedError("the process group was destroyed"));
    }
    queue_.Stop();
  }
  queue_.Join();
  // Each waiter takes p2p_mu_ once its wait returns, so they are joined
  // outside it (joining under it deadlocks with a waiter that just finished).
  std::vector<std::unique_ptr<PendingP2P>> pending;
  {
    absl::MutexLock lock(&p2p_mu_);
    for (auto& p : p2p_) {
      p->buffer->abortWaitRecv();
      p->buffer->abortWaitSend();
    }
    pending.swap(p2p_);
  }
  for (auto& p : pending) p->waiter.join();
}

// Note [Aborting gloo]: gloo has no call that stops an op, and a collective
// waits inside gloo (in an unbound buffer's wait on one of the context's
// pairs) until data comes or gloo's own timeout, the group's, passes: a
// stopped peer would hold the worker, and with it the group's destructor,
// for that long. abort() therefore fails the running collective's Work at
// once (the job holds its tensors, so gloo may still write into them
// safely), and then closes every pair of the context with an exception
// (tcp::Pair::signalExceptionExternal, which gloo itself uses when a wait
// times out): gloo fails every buffer and pending operation of the pair,
// closes its socket and unregisters it from the device's loop, so the
// worker's wait throws at once, Translate maps it to the abort's status,
// and the queued ops fail in their turn. Posted sends and receives are woken
// by abortWaitSend / abortWaitRecv. The pairs stay closed: a group is never
// used again after abort().
void GlooProcessGroup::abort() {
  OnAbort();
  absl::Status aborted;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = absl::AbortedError(AbortReason());
    aborted = aborted_;
    for (OpQueue::Op& op : queue_.TakeQueued()) op.work->Finish(aborted);
    if (const std::shared_ptr<Work> running = queue_.running().work) running->Finish(aborted);
  }
  ClosePairs(std::string(aborted.message()));
  absl::MutexLock lock(&p2p_mu_);
  for (auto& p : p2p_) {
    p->buffer->abortWaitRecv();
    p->buffer->abortWaitSend();
  }
}

bool GlooProcessGroup::Ending() {
  absl::MutexLock lock(&mu_);
  return !aborted_.ok() || stopping_;
}

absl::Status GlooProcessGroup::AbortedOr(absl::Status status, const std::string& what) {
  if (status.ok()) return status;
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) return status;
  return absl::Status(aborted_.code(), absl::StrCat(what, ": ", aborted_.message()));
}

void GlooProcessGroup::ClosePairs(const std::string& reason) {
  absl::MutexLock lock(&close_mu_);
  if (pairs_closed_) return;
  pairs_closed_ = true;
  (void)FailPairs(*context_, rank(), size(), reason);
}

// --- Execution ---------------------------------------------------------------------

std::shared_ptr<Work> GlooProcessGroup::Enqueue(OpType op,
                                                const std::optional<absl::Duration>& timeout,
                                                std::optional<Call> call, Job job,
                                                std::shared_ptr<DeviceStaging> stage) {
  const absl::Time deadline = DeadlineFor(timeout);
  auto work = std::make_shared<StagedWork<Work>>(op, deadline + kBackstop);
  if (stage != nullptr && stage->active()) {
    work->set_staging(stage);
    job = [stage, job = std::move(job)](const OpContext& ctx) -> absl::Status {
      EMBER_RETURN_IF_ERROR(stage->WaitForInputs(ctx.deadline, ctx.what));
      EMBER_RETURN_IF_ERROR(job(ctx));
      return stage->CopyBack();
    };
  }
  // The call check (Note [gloo exceptions]) runs first; its words are
  // posted below, once the collective has its number.
  std::shared_ptr<PostedCheck> check;
  if (const CallFingerprint* issued = IssuingCall();
      issued != nullptr && call && check_calls_ && size() > 1) {
    check = std::make_shared<PostedCheck>();
    check->call = *issued;
    job = [this, check, job = std::move(job)](const OpContext& ctx) -> absl::Status {
      EMBER_RETURN_IF_ERROR(CheckPosted(ctx, rank(), *check));
      return job(ctx);
    };
  }
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) {
    work->Finish(aborted_);
    return work;
  }
  const int64_t seq = next_seq_++;
  if (check != nullptr) PostCheck(*context_, rank(), size(), seq, *check);
  const uint32_t tag = static_cast<uint32_t>(seq) & ~kCheckTagBit;
  OpContext context{op, seq, tag, deadline,
                    absl::StrCat(op_type_name(op), " (collective #", seq, ")")};
  std::string what = context.what;
  queue_.Push({.work = work,
               .what = std::move(what),
               .deadline = deadline,
               .run = [this, context = std::move(context), job = std::move(job)] {
                 return RunJob(context, job);
               }});
  return work;
}

absl::Status GlooProcessGroup::RunJob(const OpContext& ctx, const Job& job) {
  try {
    return job(ctx);
  } catch (const ::gloo::IoException& e) {
    return Translate(ctx, e.what(), /*io_error=*/true);
  } catch (const std::exception& e) {
    return Translate(ctx, e.what(), /*io_error=*/false);
  }
}

std::string GlooProcessGroup::DescribePeer(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) return "any rank";
  const Peer& p = peers_[rank];
  if (p.same_host && p.pid != getpid()) {
    return absl::StrCat("rank ", rank, " (pid ", p.pid, " on this host, ", ProcessState(p.pid),
                        ")");
  }
  if (!p.ember) return absl::StrCat("rank ", rank, " (not an Ember process)");
  if (p.same_host) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " (on ", p.host, ")");
}

std::vector<int> GlooProcessGroup::RanksThatDidNotFail(const OpContext& ctx) {
  const std::string key = absl::StrCat(prefix_, "failed/", ctx.seq, "/");
  std::vector<int> missing;
  if (!store_->set(absl::StrCat(key, rank()), "1").ok()) return missing;
  // The others fail the same collective at about the same time; a rank
  // that does not within this grace never reached it.
  const absl::Duration grace = std::clamp(timeout() / 4, absl::Milliseconds(200), absl::Seconds(1));
  const absl::Time until = absl::Now() + grace;
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    // A peer on this host whose process is gone cannot report: no grace.
    if (peers_[p].same_host && peers_[p].pid != getpid() &&
        ProcessState(peers_[p].pid) == "exited") {
      missing.push_back(p);
      continue;
    }
    // In short slices, so that abort() and the destructor, which wait for
    // this worker, need not wait out the grace (Note [Aborting gloo]).
    bool reported = false;
    while (!reported) {
      const absl::Duration left = std::max(until - absl::Now(), absl::ZeroDuration());
      reported = store_->get(absl::StrCat(key, p), std::min(left, absl::Milliseconds(20))).ok();
      if (reported || left <= absl::ZeroDuration() || Ending()) break;
    }
    if (!reported) missing.push_back(p);
  }
  return missing;
}

absl::Status GlooProcessGroup::Translate(const OpContext& ctx, const std::string& what,
                                         bool io_error) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok())
      return absl::Status(aborted_.code(), absl::StrCat(ctx.what, ": ", aborted_.message()));
    if (stopping_)
      return absl::AbortedError(absl::StrCat(ctx.what, ": the process group was destroyed"));
  }
  const bool timed_out = absl::StrContains(what, "Timed out");
  absl::StatusCode code = timed_out  ? absl::StatusCode::kDeadlineExceeded
                          : io_error ? absl::StatusCode::kUnavailable
                                     : absl::StatusCode::kFailedPrecondition;
  std::string peers;
  if (ctx.seq >= 0 && size() > 1) {
    std::vector<int> missing = RanksThatDidNotFail(ctx);
    std::vector<std::string> names;
    bool exited = false;
    for (int p : missing) {
      names.push_back(DescribePeer(p));
      exited |= absl::StrContains(names.back(), "exited");
    }
    if (exited) code = absl::StatusCode::kUnavailable;
    if (!missing.empty()) {
      peers = timed_out ? absl::StrCat("timed out waiting for ", absl::StrJoin(names, ", "),
                                       ", which did not join it or did not fail it with the "
                                       "others")
                        : absl::StrCat("lost ", absl::StrJoin(names, ", "));
    } else {
      peers = absl::StrCat(
          timed_out ? "timed out" : "failed",
          "; every rank reached this collective, so they disagree about it: every rank must "
          "run the same collectives in the same order with tensors of the same size and dtype");
    }
  } else {
    peers = timed_out ? "timed out" : "failed";
  }
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok())  // aborted meanwhile
      return absl::Status(aborted_.code(), absl::StrCat(ctx.what, ": ", aborted_.message()));
  }
  return absl::Status(code, absl::StrCat(ctx.what, ": ", peers, " (gloo: ", what, ")"));
}

// --- Collectives -------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoBroadcast(
    const Tensor& given, const BroadcastOptions& options) {
  const int root = options.root;
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(const Tensor tensor,
                         rank() == root ? stage->Input(given) : stage->Output(given));
  Tensor staging = ContiguousStaging(tensor);
  return Enqueue(OpType::kBroadcast, options.timeout, Call{tensor.dtype(), tensor.nbytes(), root},
                 [this, tensor, staging, root](const OpContext& ctx) -> absl::Status {
                   ::gloo::BroadcastOptions opts(context_);
                   opts.setOutput(reinterpret_cast<uint8_t*>(Data(staging)), staging.nbytes());
                   opts.setRoot(root);
                   opts.setTag(ctx.tag);
                   opts.setTimeout(Left(ctx.deadline));
                   ::gloo::broadcast(opts);
                   CopyBackFromStaging(tensor, staging);
                   return absl::OkStatus();
                 },
                 stage);
}

namespace {

// An in-place all_reduce of `data` with gloo's ring algorithm.
void GlooAllReduce(const std::shared_ptr<::gloo::Context>& context,
                   const GlooProcessGroup::OpContext& ctx, const Tensor& data, ReduceOp op) {
  ::gloo::AllreduceOptions opts(context);
  VisitDtype(data.dtype(), [&]<typename T>() {
    opts.setOutput(static_cast<T*>(data.raw_data()), static_cast<size_t>(data.numel()));
    opts.setReduceFunction(ReduceFunction(op, data.dtype()));
  });
  opts.setTag(ctx.tag);
  opts.setTimeout(Left(ctx.deadline));
  ::gloo::allreduce(opts);
}

}  // namespace

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoAllReduce(
    const Tensor& given, const AllReduceOptions& options) {
  EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kAllReduce, options.op, "gloo"));
  const ReduceOp op = options.op;
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(const Tensor tensor, stage->InOut(given));
  Tensor staging = ContiguousStaging(tensor);
  return Enqueue(OpType::kAllReduce, options.timeout, Call{tensor.dtype(), tensor.nbytes(), -1, op},
                 [this, tensor, staging, op](const OpContext& ctx) -> absl::Status {
                   if (size() > 1) GlooAllReduce(context_, ctx, staging, op);
                   CopyBackFromStaging(tensor, staging);
                   return absl::OkStatus();
                 },
                 stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoReduce(const Tensor& given,
                                                                 const ReduceOptions& options) {
  EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kReduce, options.op, "gloo"));
  const ReduceOp op = options.op;
  const int root = options.root;
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(const Tensor tensor,
                         rank() == root ? stage->InOut(given) : stage->Input(given));
  // gloo uses every rank's buffer as scratch; only the root's is the caller's
  // (a staged device tensor's stand-in is private already, and is still
  // being filled, so it is not read here).
  Tensor staging =
      rank() == root || stage->active() ? ContiguousStaging(tensor) : tensor.contiguous().clone();
  return Enqueue(OpType::kReduce, options.timeout, Call{tensor.dtype(), tensor.nbytes(), root, op},
                 [this, tensor, staging, op, root](const OpContext& ctx) -> absl::Status {
                   if (size() == 1) return absl::OkStatus();
                   ::gloo::ReduceOptions opts(context_);
                   VisitDtype(staging.dtype(), [&]<typename T>() {
                     opts.setOutput(static_cast<T*>(staging.raw_data()),
                                    static_cast<size_t>(staging.numel()));
                     opts.setReduceFunction(ReduceFunction(op, staging.dtype()));
                   });
                   opts.setRoot(root);
                   opts.setTag(ctx.tag);
                   opts.setTimeout(Left(ctx.deadline));
                   ::gloo::reduce(opts);
                   if (rank() == root) CopyBackFromStaging(tensor, staging);
                   return absl::OkStatus();
                 },
                 stage);
}

// Note [Rings over gloo's buffers]
// gloo (this snapshot) has no reduce_scatter over unbound buffers. PyTorch's
// gloo backend all_reduces the concatenated inputs and keeps its part; gloo's
// ring all_reduce is a reduce-scatter followed by an all-gather, so that
// moves every byte twice and, at two ranks, posts four sends and four
// receives per rank for a 1 MiB input. And gloo's all_gather moves each
// chunk in two halves, two messages a step. Every message costs a
// notification each way before its data moves (gloo's tcp transport sends
// only into posted receives) and a hand-off through gloo's network thread
// (Note [gloo's network thread] in device.cc), which is what a collective of
// FSDP's sizes mostly costs. So when every rank is Ember, reduce_scatter and
// all_gather run as rings of their own over gloo's point-to-point buffers,
// one message per step and segment:
// - reduce_scatter: in step s (0 <= s < n-1) rank r sends its partial sum
//   of chunk (r-s-1) mod n to rank r+1 and adds the partial sum of chunk
//   (r-s-2) mod n that rank r-1 sends it, so after n-1 steps chunk r holds
//   every rank's input, summed in the order r+1, r+2, ..., r (fixed for a
//   world size, so every run gives the same bits). Receives land in a
//   scratch buffer of n-1 chunks.
// - all_gather: in step s rank r sends chunk (r-s) mod n to rank r+1 and
//   receives chunk (r-s-1) mod n from rank r-1, straight into the output.
// At two ranks each is one send and one receive. Every receive is posted
// first; chunks travel in segments of at most 1 MiB, and each segment is
// reduced (reduce_scatter) and forwarded as soon as it arrives, so the work
// on one segment overlaps the transfer of the next. A group with a PyTorch
// rank keeps gloo's algorithms (Note [Joining PyTorch ranks]).

namespace {

constexpr uint64_t kReduceScatterSlot = uint64_t{0xE5} << 56;
constexpr uint64_t kAllGatherSlot = uint64_t{0xE6} << 56;
constexpr int64_t kRingSegmentBytes = int64_t{1} << 20;

// Splits a chunk of `chunk` items into segments of at most
// kRingSegmentBytes (at least one item each).
struct Segments {
  Segments(int64_t chunk, int64_t item_bytes)
      : chunk(chunk),
        per(std::max<int64_t>(1, kRingSegmentBytes / item_bytes)),
        count((chunk + per - 1) / per) {}
  int64_t offset(int64_t k) const { return k * per; }
  int64_t size(int64_t k) const { return std::min(per, chunk - k * per); }
  int64_t chunk, per, count;
};

int Mod(int v, int n) { return ((v % n) + n) % n; }

// The reduce_scatter ring of Note [Rings over gloo's buffers]: `in` holds
// this rank's size() input chunks of `chunk` elements (contiguous, left as
// they are), `out` receives chunk `rank` reduced.
void RingReduceScatter(::gloo::Context& context, const GlooProcessGroup::OpContext& ctx,
                       const std::vector<Tensor>& in, const Tensor& out, ReduceOp op) {
  const int n = context.size, r = context.rank;
  const Dtype dtype = out.dtype();
  const int64_t chunk = out.numel();
  const auto item = static_cast<int64_t>(out.element_size());
  const int64_t chunk_bytes = chunk * item;
  if (chunk_bytes == 0) return;
  const Segments seg(chunk, item);
  const uint64_t slot = kReduceScatterSlot | static_cast<uint64_t>(ctx.tag);
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  // Step s receives into scratch chunk s, adds its own input there and
  // forwards it, except in the last step, which adds into `out`.
  const auto scratch_bytes = static_cast<size_t>((n - 1) * chunk_bytes);
  std::unique_ptr<char[]> scratch(new char[scratch_bytes]);
  auto partial = context.createUnboundBuffer(scratch.get(), scratch_bytes);
  const Tensor& first = in[Mod(r - 1, n)];
  auto first_send = context.createUnboundBuffer(first.raw_data(), first.nbytes());
  auto at = [&](int s, int64_t k) { return s * chunk_bytes + seg.offset(k) * item; };
  auto bytes = [&](int64_t k) { return static_cast<size_t>(seg.size(k) * item); };
  // Every receive, in the order the sender posts its sends.
  for (int s = 0; s + 1 < n; ++s) {
    for (int64_t k = 0; k < seg.count; ++k) partial->recv(prev, slot, at(s, k), bytes(k));
  }
  for (int64_t k = 0; k < seg.count; ++k) first_send->send(next, slot, at(0, k), bytes(k));
  int64_t forwarded = 0;
  for (int s = 0; s + 1 < n; ++s) {
    const char* mine = static_cast<const char*>(in[Mod(r - s - 2, n)].raw_data());
    for (int64_t k = 0; k < seg.count; ++k) {
      partial->waitRecv(Left(ctx.deadline));
      char* got = scratch.get() + at(s, k);
      const int64_t offset = seg.offset(k) * item;
      if (s + 2 < n) {
        ReduceInto(op, dtype, got, mine + offset, seg.size(k));
        partial->send(next, slot, at(s, k), bytes(k));  // the next step's message
        ++forwarded;
      } else {
        ReduceTo(op, dtype, static_cast<char*>(out.raw_data()) + offset, got, mine + offset,
                 seg.size(k));
      }
    }
  }
  for (int64_t k = 0; k < seg.count; ++k) first_send->waitSend(Left(ctx.deadline));
  for (int64_t i = 0; i < forwarded; ++i) partial->waitSend(Left(ctx.deadline));
}

// The all_gather ring of Note [Rings over gloo's buffers] over `out` (size
// chunks of `chunk_bytes`, this rank's already in place).
void RingAllGather(::gloo::Context& context, const GlooProcessGroup::OpContext& ctx, char* out,
                   int64_t chunk_bytes) {
  const int n = context.size, r = context.rank;
  if (n == 1 || chunk_bytes == 0) return;
  const Segments seg(chunk_bytes, 1);
  const uint64_t slot = kAllGatherSlot | static_cast<uint64_t>(ctx.tag);
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  auto buffer = context.createUnboundBuffer(out, static_cast<size_t>(n * chunk_bytes));
  auto at = [&](int c, int64_t k) { return static_cast<size_t>(c * chunk_bytes + seg.offset(k)); };
  for (int s = 0; s + 1 < n; ++s) {
    for (int64_t k = 0; k < seg.count; ++k) {
      buffer->recv(prev, slot, at(Mod(r - s - 1, n), k), static_cast<size_t>(seg.size(k)));
    }
  }
  for (int64_t k = 0; k < seg.count; ++k) {
    buffer->send(next, slot, at(r, k), static_cast<size_t>(seg.size(k)));
  }
  int64_t posted = seg.count;
  for (int s = 0; s + 1 < n; ++s) {
    for (int64_t k = 0; k < seg.count; ++k) {
      buffer->waitRecv(Left(ctx.deadline));
      if (s + 2 < n) {  // forwarded in the next step
        buffer->send(next, slot, at(Mod(r - s - 1, n), k), static_cast<size_t>(seg.size(k)));
        ++posted;
      }
    }
  }
  for (int64_t i = 0; i < posted; ++i) buffer->waitSend(Left(ctx.deadline));
}

// All ranks' `input` concatenated into `flat` (world x input bytes); with
// `ring`, by the ring of Note [Rings over gloo's buffers], else by gloo's.
void GlooAllGather(const std::shared_ptr<::gloo::Context>& context,
                   const GlooProcessGroup::OpContext& ctx, const Tensor& input,
                   const Tensor& flat, bool ring) {
  if (ring) {
    char* out = static_cast<char*>(flat.raw_data());
    const auto bytes = static_cast<int64_t>(input.nbytes());
    if (bytes > 0) std::memcpy(out + context->rank * bytes, input.raw_data(), bytes);
    RingAllGather(*context, ctx, out, bytes);
    return;
  }
  ::gloo::AllgatherOptions opts(context);
  opts.setInput(reinterpret_cast<uint8_t*>(input.raw_data()), input.nbytes());
  opts.setOutput(reinterpret_cast<uint8_t*>(flat.raw_data()), flat.nbytes());
  opts.setTag(ctx.tag);
  opts.setTimeout(Left(ctx.deadline));
  ::gloo::allgather(opts);
}

}  // namespace

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoAllGather(
    absl::Span<const Tensor> outputs, const Tensor& given, const AllGatherOptions& options) {
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(std::vector<Tensor> outs, stage->Outputs(outputs));
  EMBER_ASSIGN_OR_RETURN(const Tensor input, stage->Input(given));
  Tensor in = ContiguousStaging(input);
  Tensor flat = empty({size() * input.numel()}, TensorOptions(input.dtype()));
  return Enqueue(OpType::kAllGather, options.timeout, Call{input.dtype(), input.nbytes()},
                 [this, outs, in, flat](const OpContext& ctx) -> absl::Status {
                   GlooAllGather(context_, ctx, in, flat, check_calls_);
                   const int64_t n = in.numel();
                   for (int p = 0; p < size(); ++p) {
                     outs[p].copy_(flat.narrow(0, p * n, n).view(outs[p].sizes()));
                   }
                   return absl::OkStatus();
                 },
                 stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoAllGatherIntoTensor(
    const Tensor& given_output, const Tensor& given_input, const AllGatherOptions& options) {
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(const Tensor input, stage->Input(given_input));
  EMBER_ASSIGN_OR_RETURN(const Tensor output, stage->Output(given_output));
  Tensor in = ContiguousStaging(input);
  Tensor out = ContiguousStaging(output);
  return Enqueue(OpType::kAllGatherIntoTensor, options.timeout, Call{input.dtype(), input.nbytes()},
                 [this, output, in, out](const OpContext& ctx) -> absl::Status {
                   GlooAllGather(context_, ctx, in, out, check_calls_);
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 },
                 stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoGather(absl::Span<const Tensor> outputs,
                                                                 const Tensor& given,
                                                                 const GatherOptions& options) {
  const int root = options.root;
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(std::vector<Tensor> outs, stage->Outputs(outputs));
  EMBER_ASSIGN_OR_RETURN(const Tensor input, stage->Input(given));
  Tensor in = ContiguousStaging(input);
  Tensor flat;
  if (rank() == root) flat = empty({size() * input.numel()}, TensorOptions(input.dtype()));
  return Enqueue(OpType::kGather, options.timeout, Call{input.dtype(), input.nbytes(), root},
                 [this, outs, in, flat, root](const OpContext& ctx) -> absl::Status {
                   ::gloo::GatherOptions opts(context_);
                   opts.setInput(reinterpret_cast<uint8_t*>(in.raw_data()), in.nbytes());
                   if (rank() == root) {
                     opts.setOutput(reinterpret_cast<uint8_t*>(flat.raw_data()), flat.nbytes());
                   }
                   opts.setRoot(root);
                   opts.setTag(ctx.tag);
                   opts.setTimeout(Left(ctx.deadline));
                   ::gloo::gather(opts);
                   const int64_t n = in.numel();
                   for (size_t p = 0; p < outs.size(); ++p) {
                     outs[p].copy_(flat.narrow(0, p * n, n).view(outs[p].sizes()));
                   }
                   return absl::OkStatus();
                 },
                 stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoScatter(const Tensor& given,
                                                                  absl::Span<const Tensor> inputs,
                                                                  const ScatterOptions& options) {
  const int root = options.root;
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(const Tensor output, stage->Output(given));
  EMBER_ASSIGN_OR_RETURN(const std::vector<Tensor> staged_inputs, stage->Inputs(inputs));
  std::vector<Tensor> ins;
  for (const Tensor& t : staged_inputs) ins.push_back(ContiguousStaging(t));
  Tensor out = ContiguousStaging(output);
  return Enqueue(OpType::kScatter, options.timeout, Call{output.dtype(), output.nbytes(), root},
                 [this, output, ins, out, root](const OpContext& ctx) -> absl::Status {
                   ::gloo::ScatterOptions opts(context_);
                   std::vector<uint8_t*> ptrs;
                   for (const Tensor& t : ins) ptrs.push_back(reinterpret_cast<uint8_t*>(Data(t)));
                   if (rank() == root) opts.setInputs(ptrs, out.nbytes());
                   opts.setOutput(reinterpret_cast<uint8_t*>(Data(out)), out.nbytes());
                   opts.setRoot(root);
                   opts.setTag(ctx.tag);
                   opts.setTimeout(Left(ctx.deadline));
                   ::gloo::scatter(opts);
                   CopyBackFromStaging(output, out);
                   return absl::OkStatus();
                 },
                 stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoReduceScatter(
    const Tensor& given, absl::Span<const Tensor> inputs, const ReduceScatterOptions& options) {
  EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kReduceScatter, options.op, "gloo"));
  const ReduceOp op = options.op;
  const int64_t n = given.numel();
  auto stage = std::make_shared<DeviceStaging>();
  // Contiguous host inputs, one per rank. Device inputs are concatenated on
  // their device, then staged as one.
  std::vector<Tensor> ins;
  if (std::all_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.is_cpu(); })) {
    for (const Tensor& t : inputs) ins.push_back(ContiguousStaging(t));
  } else {
    Tensor flat = empty({size() * n}, TensorOptions(given.dtype()).device(inputs[0].device()));
    for (int p = 0; p < size(); ++p) flat.narrow(0, p * n, n).copy_(inputs[p].reshape({n}));
    EMBER_ASSIGN_OR_RETURN(flat, stage->Input(flat));
    for (int p = 0; p < size(); ++p) ins.push_back(flat.narrow(0, p * n, n));
  }
  EMBER_ASSIGN_OR_RETURN(const Tensor output, stage->Output(given));
  const bool ring = check_calls_;  // every rank is Ember
  return Enqueue(
      OpType::kReduceScatter, options.timeout, Call{output.dtype(), output.nbytes(), -1, op},
      [this, output, ins, op, n, ring](const OpContext& ctx) -> absl::Status {
        if (size() == 1) {
          output.copy_(ins[0].view(output.sizes()));
        } else if (ring) {  // Note [Rings over gloo's buffers]
          // The ring writes its result while it still reads the inputs, so
          // an output that shares memory with one gets a buffer of its own.
          Tensor out = ContiguousStaging(output);
          if (std::any_of(ins.begin(), ins.end(),
                          [&](const Tensor& t) { return Overlap(t, out); })) {
            out = empty(output.sizes(), TensorOptions(output.dtype()));
          }
          RingReduceScatter(*context_, ctx, ins, out, op);
          CopyBackFromStaging(output, out);
        } else {
          // As PyTorch: all_reduce the concatenated inputs, keep this rank's part.
          Tensor flat = empty({size() * n}, TensorOptions(output.dtype()));
          for (int p = 0; p < size(); ++p) flat.narrow(0, p * n, n).copy_(ins[p].reshape({n}));
          GlooAllReduce(context_, ctx, flat, op);
          output.copy_(flat.narrow(0, rank() * n, n).view(output.sizes()));
        }
        return absl::OkStatus();
      },
      stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoAllToAll(absl::Span<const Tensor> outputs,
                                                                   absl::Span<const Tensor> inputs,
                                                                   const AllToAllOptions& options) {
  std::vector<int64_t> in_counts, out_counts;
  int64_t in_total = 0, out_total = 0;
  for (const Tensor& t : inputs) {
    in_counts.push_back(t.numel());
    in_total += t.numel();
  }
  for (const Tensor& t : outputs) {
    out_counts.push_back(t.numel());
    out_total += t.numel();
  }
  const Dtype dtype = inputs[0].dtype();
  // Device inputs are concatenated on their device, then staged as one.
  Tensor in = empty({in_total}, TensorOptions(dtype).device(inputs[0].device()));
  Tensor out = empty({out_total}, TensorOptions(dtype));
  int64_t off = 0;
  for (const Tensor& t : inputs) {
    in.narrow(0, off, t.numel()).copy_(t.reshape({t.numel()}));
    off += t.numel();
  }
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(in, stage->Input(in));
  EMBER_ASSIGN_OR_RETURN(std::vector<Tensor> outs, stage->Outputs(outputs));
  Call call{dtype, 0};
  call.sends = in_counts;
  call.receives = out_counts;
  return Enqueue(
      OpType::kAllToAll, options.timeout, std::move(call),
      [this, in, out, outs, in_counts, out_counts](const OpContext& ctx) -> absl::Status {
        ::gloo::AlltoallvOptions opts(context_);
        VisitDtype(in.dtype(), [&]<typename T>() {
          opts.setInput(static_cast<T*>(in.raw_data()), in_counts);
          opts.setOutput(static_cast<T*>(out.raw_data()), out_counts);
        });
        opts.setTag(ctx.tag);
        opts.setTimeout(Left(ctx.deadline));
        ::gloo::alltoallv(opts);
        int64_t at = 0;
        for (const Tensor& t : outs) {
          t.copy_(out.narrow(0, at, t.numel()).view(t.sizes()));
          at += t.numel();
        }
        return absl::OkStatus();
      },
      stage);
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoBarrier(const BarrierOptions& options) {
  return Enqueue(OpType::kBarrier, options.timeout, Call{},
                 [this](const OpContext& ctx) -> absl::Status {
                   ::gloo::BarrierOptions opts(context_);
                   opts.setTag(ctx.tag);
                   opts.setTimeout(Left(ctx.deadline));
                   ::gloo::barrier(opts);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoMonitoredBarrier(
    const MonitoredBarrierOptions& options) {
  const bool wait_all = options.wait_all_ranks;
  const absl::Duration timeout = options.timeout.value_or(this->timeout());
  return Enqueue(OpType::kMonitoredBarrier, options.timeout, std::nullopt,
                 [this, wait_all, timeout](const OpContext& ctx) -> absl::Status {
                   const int n = size(), r = rank();
                   const uint64_t seq = ctx.tag;
                   char byte = 0;
                   if (r != 0) {
                     auto send = context_->createUnboundBuffer(&byte, 1);
                     char ack = 0;
                     auto recv = context_->createUnboundBuffer(&ack, 1);
                     recv->recv(0, kReleaseSlot | seq);
                     send->send(0, kArriveSlot | seq);
                     send->waitSend(Left(ctx.deadline));
                     // Rank 0 judges who is missing; wait a little longer for it.
                     recv->waitRecv(Left(ctx.deadline + absl::Seconds(1)));
                     return absl::OkStatus();
                   }
                   std::vector<char> bytes(n);
                   std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> arrivals(n);
                   for (int p = 1; p < n; ++p) {
                     arrivals[p] = context_->createUnboundBuffer(&bytes[p], 1);
                     arrivals[p]->recv(p, kArriveSlot | seq);
                   }
                   std::vector<int> missing;
                   for (int p = 1; p < n; ++p) {
                     try {
                       arrivals[p]->waitRecv(Left(ctx.deadline));
                     } catch (const ::gloo::IoException&) {
                       missing.push_back(p);
                       if (!wait_all) break;
                     }
                   }
                   if (!missing.empty()) return MonitoredBarrierTimeout(missing, timeout);
                   std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> releases(n);
                   for (int p = 1; p < n; ++p) {
                     releases[p] = context_->createUnboundBuffer(&byte, 1);
                     releases[p]->send(p, kReleaseSlot | seq);
                   }
                   for (int p = 1; p < n; ++p) releases[p]->waitSend(Left(ctx.deadline));
                   return absl::OkStatus();
                 });
}

// --- Point-to-point ----------------------------------------------------------------

void GlooProcessGroup::ReapP2P() {
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    if ((*it)->done) {
      (*it)->waiter.join();
      it = p2p_.erase(it);
    } else {
      ++it;
    }
  }
}

void GlooProcessGroup::StartP2P(std::unique_ptr<::gloo::transport::UnboundBuffer> buffer,
                                std::function<void(::gloo::transport::UnboundBuffer&)> wait) {
  absl::MutexLock lock(&p2p_mu_);
  ReapP2P();
  auto pending = std::make_unique<PendingP2P>();
  pending->buffer = std::move(buffer);
  PendingP2P* p = pending.get();
  pending->waiter = std::thread([this, p, wait = std::move(wait)] {
    wait(*p->buffer);
    absl::MutexLock lock(&p2p_mu_);
    p->done = true;
  });
  p2p_.push_back(std::move(pending));
}

namespace {

// Waits for a posted send or receive; the status of its Work.
absl::Status WaitP2P(const std::function<bool()>& wait, const std::string& what) {
  try {
    if (wait()) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat(what, ": the process group was aborted"));
  } catch (const std::exception& e) {
    const bool timed_out = absl::StrContains(e.what(), "Timed out");
    return absl::Status(
        timed_out ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
        absl::StrCat(what, timed_out ? ": timed out" : ": failed", " (gloo: ", e.what(), ")"));
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::DoSend(const Tensor& tensor, int dst,
                                                               const P2POptions& options) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return Work::Completed(OpType::kSend, aborted_);
  }
  const absl::Time deadline = DeadlineFor(options.timeout);
  auto work = std::make_shared<Work>(OpType::kSend, deadline + kBackstop);
  const std::string what = absl::StrCat("send to ", DescribePeer(dst), " (tag ", options.tag, ")");
  // A device tensor is sent from its pinned copy, which must be complete
  // before gloo may read it: the send waits for the device here, at the call
  // (posting it later, from another thread, could reorder sends).
  DeviceStaging stage;
  EMBER_ASSIGN_OR_RETURN(const Tensor host, stage.Input(tensor));
  if (absl::Status ready = stage.WaitForInputs(deadline, what); !ready.ok()) {
    return Work::Completed(OpType::kSend, ready);
  }
  Tensor data = ContiguousStaging(host);
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
  try {
    buffer = context_->createUnboundBuffer(Data(data), data.nbytes());
    buffer->send(dst, static_cast<uint32_t>(options.tag));
  } catch (const std::exception& e) {
    return Work::Completed(OpType::kSend,
                           absl::UnavailableError(absl::StrCat(what, ": ", e.what())));
  }
  StartP2P(std::move(buffer),
           [this, work, data, deadline, what](::gloo::transport::UnboundBuffer& b) {
             work->Finish(AbortedOr(WaitP2P([&] { return b.waitSend(Left(deadline)); }, what),
                                    what));
           });
  return work;
}

absl::StatusOr<std::shared_ptr<RecvWork>> GlooProcessGroup::DoRecv(const Tensor& tensor, int src,
                                                                   const P2POptions& options) {
  const absl::Time deadline = DeadlineFor(options.timeout);
  auto work = std::make_shared<StagedWork<RecvWork>>(OpType::kRecv, deadline + kBackstop);
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) {
      work->Finish(aborted_);
      return work;
    }
  }
  // A device tensor receives into a pinned stand-in, copied back once the
  // message is in (Note [gloo on device tensors]).
  auto stage = std::make_shared<DeviceStaging>();
  EMBER_ASSIGN_OR_RETURN(const Tensor host, stage->Output(tensor));
  if (stage->active()) work->set_staging(stage);
  Tensor staging = ContiguousStaging(host);
  const std::string what =
      absl::StrCat("recv from ", DescribePeer(src), " (tag ", options.tag, ")");
  const uint64_t slot = static_cast<uint32_t>(options.tag);
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
  try {
    buffer = context_->createUnboundBuffer(Data(staging), staging.nbytes());
    if (src == kAnySource) {
      std::vector<int> sources;
      for (int p = 0; p < size(); ++p) {
        if (p != rank()) sources.push_back(p);
      }
      buffer->recv(sources, slot);
    } else {
      buffer->recv(src, slot);
    }
  } catch (const std::exception& e) {
    work->Finish(absl::UnavailableError(absl::StrCat(what, ": ", e.what())));
    return work;
  }
  StartP2P(std::move(buffer),
           [this, work, host, staging, stage, deadline,
            what](::gloo::transport::UnboundBuffer& b) {
             int from = -1;
             absl::Status s = AbortedOr(
                 WaitP2P([&] { return b.waitRecv(&from, Left(deadline)); }, what), what);
             if (s.ok()) {
               CopyBackFromStaging(host, staging);
               s = stage->CopyBack();
               work->set_source(from);
             }
             work->Finish(s);
           });
  return work;
}

EMBER_REGISTER_BACKEND(gloo, BackendInfo{.name = "gloo",
                                         .support = GlooSupportTable(),
                                         .create = [](const BackendOptions& options)
                                             -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
                                           EMBER_ASSIGN_OR_RETURN(
                                               auto pg, GlooProcessGroup::create(options));
                                           return std::shared_ptr<ProcessGroup>(std::move(pg));
                                         }});

}  // namespace ember::distributed::gloo
