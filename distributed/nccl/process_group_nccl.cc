#include "distributed/nccl/process_group_nccl.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cuda/device.h"
#include "cuda/status.h"
#include "cuda/stream.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/stream.h"

namespace ember::distributed::nccl {

// Note [NCCL communicators]
// A group makes its communicators when an op first needs them, not at
// creation: a process may hold groups it never uses on a GPU, and the device
// of an op is only known from its tensors. Every rank issues collectives in
// the same order, so every rank makes the same communicators in the same
// order, and the n-th communicator of a group reads its ncclUniqueId from the
// store key "<prefix>n" that the communicator's rank 0 wrote (PyTorch's
// ncclCommCounter_). Sends and receives are the exception: only two ranks
// take part, so their communicator is keyed by the pair instead of the
// counter ("<prefix>p2p:<low>:<high>:<k>"), which the other ranks never
// advance. A group that new_group makes gets its first communicator by
// splitting the default group's (Note [NCCL split groups]) where it can, and
// makes any other from fresh ids under its own prefix.
//
// Note [NCCL split groups]
// new_group calls split_for_new_group on the default group on every rank,
// members or not (Note [Splitting new groups] in distributed.cc). When the
// default group has a collective communicator on one device (the first it
// made: every rank made the same ones in the same order, so every rank picks
// the same one) and NCCL has ncclCommSplit (2.18), every rank splits it, as
// PyTorch does when the parent's communicator exists: members with one color
// and their rank in the new group as key, the others with NCCL_SPLIT_NOCOLOR.
// The member's new communicator waits in a process-wide table under the new
// group's store and prefix until the new group, created right after, takes it
// as its communicator for that device; the new group therefore reads no
// ncclUniqueId for it. Otherwise (no communicator yet, an older NCCL) nothing
// is split and the new group makes its communicators through the store as
// any group does. A table entry the new group never takes (its creation
// failed) goes when the default group is destroyed.
//
// Note [NCCL watchdog]
// Ops are asynchronous on the GPU: the call returns once NCCL has queued the
// kernels. A watchdog thread per group polls every op in flight (every
// kWatchdogInterval): an op whose end events have completed finishes OK and
// releases its tensors; one whose deadline has passed, or whose communicator
// reports an asynchronous error, fails with a message that names the group,
// the op, its sequence number and the timeout, and then the group does what
// TORCH_NCCL_ASYNC_ERROR_HANDLING says (process_group_nccl.h). An aborted
// communicator stops its kernels, so the GPU is not left spinning on a peer
// that will never come. Where the group aborts, it is marked aborted before
// the op fails, so whoever sees the failure finds later ops refused. The
// Work's own deadline (what a blocking wait() or a polling is_completed()
// enforce) is kBackstop after the op's, so that the watchdog's error, and the
// abort that follows it, is what they see; the backstop only covers a
// watchdog that is itself stuck.

namespace {

constexpr absl::Duration kWatchdogInterval = absl::Milliseconds(100);
// How long after an op's deadline its Work gives up by itself.
constexpr absl::Duration kBackstop = absl::Seconds(3);
// How long the destructor waits for ops in flight before aborting.
constexpr absl::Duration kDestroyGrace = absl::Seconds(10);

std::optional<std::string> Getenv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// The value of `name`, else of its older `legacy` name; `used` says which.
std::optional<std::string> EnvEither(const char* name, const char* legacy, const char** used) {
  if (auto v = Getenv(name)) {
    *used = name;
    return v;
  }
  *used = legacy;
  return Getenv(legacy);
}

// The element type and count NCCL moves `t` as: its own type, or bytes for a
// dtype NCCL lacks (nothing is reduced, so the bytes are the data).
std::pair<ncclDataType_t, size_t> MoveType(const Tensor& t) {
  absl::StatusOr<ncclDataType_t> type = nccl_dtype(t.dtype());
  if (type.ok()) return {*type, static_cast<size_t>(t.numel())};
  return {ncclUint8, t.nbytes()};
}

std::string Describe(const char* op, const Tensor& t) {
  return absl::StrCat(op, " (", t.numel(), " ", std::string(dtype_name(t.dtype())), " on ",
                      t.device().str(), ")");
}

absl::Status Nccl(ncclResult_t r, std::string_view call) {
  if (r == ncclInProgress) return absl::OkStatus();  // a non-blocking communicator
  return cuda::nccl_status(r, call);
}

}  // namespace

SupportTable NcclSupportTable() {
  SupportTable table;
  for (OpType op : {OpType::kBroadcast, OpType::kAllReduce, OpType::kReduce, OpType::kAllGather,
                    OpType::kAllGatherIntoTensor, OpType::kGather, OpType::kScatter,
                    OpType::kReduceScatter, OpType::kAllToAll, OpType::kSend, OpType::kRecv}) {
    table.allow(op, DeviceType::kCUDA);
  }
  table.allow(OpType::kBarrier, DeviceType::kCPU);
  return table;
}

absl::StatusOr<NcclEnvironment> read_nccl_environment() {
  NcclEnvironment env;
  const char* used = nullptr;
  if (auto v = EnvEither("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", &used)) {
    if (*v != "0" && *v != "1" && *v != "2" && *v != "3") {
      return absl::InvalidArgumentError(
          absl::StrCat(used, "=", *v,
                       " is not one of 0 (no handling), 1 (abort and end the process), 2 (abort "
                       "only) or 3 (end the process without aborting)"));
    }
    env.async_error_handling = static_cast<AsyncErrorHandling>((*v)[0] - '0');
  }
  if (auto v = EnvEither("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT", &used)) {
    if (*v != "0" && *v != "1") {
      return absl::InvalidArgumentError(absl::StrCat(used, "=", *v, " is not 0 or 1"));
    }
    env.blocking_wait = *v == "1";
  }
  return env;
}

// --- Communicators and work ------------------------------------------------------

struct NcclProcessGroup::CommSet {
  std::string name;  // "cuda:0", "cuda:0,1", "p2p with rank 3 on cuda:0"
  // The group's communicator counter that named its ncclUniqueId (Note [NCCL
  // communicators]); -1 for peer and split communicators.
  int64_t number = -1;
  std::vector<int> devices;
  std::vector<std::unique_ptr<NcclComm>> comms;
  std::vector<cuda::Stream> streams;
};

namespace {

// Note [NCCL split groups]: members' split communicators waiting for their
// new group, by the new group's store and prefix.
struct PendingSplit {
  const void* parent;  // the group that split it
  std::unique_ptr<NcclComm> comm;
};
struct PendingSplits {
  absl::Mutex mu;
  std::map<std::pair<const Store*, std::string>, PendingSplit> by_group ABSL_GUARDED_BY(mu);
};
PendingSplits& Pending() {
  static PendingSplits* pending = new PendingSplits;  // never destroyed
  return *pending;
}

}  // namespace

// One op in flight: its end event per device, the tensors it uses, and what
// the watchdog needs to name it.
class NcclProcessGroup::NcclWork : public RecvWork {
 public:
  // `deadline`: when the watchdog fails the op (now + `timeout`).
  NcclWork(OpType op, absl::Time deadline, int64_t seq, std::string what, absl::Duration timeout,
           std::shared_ptr<CommSet> comms, bool blocking_wait)
      : RecvWork(op, deadline + kBackstop),
        seq_(seq),
        what_(std::move(what)),
        timeout_(timeout),
        timeout_at_(deadline),
        comms_(std::move(comms)),
        blocking_wait_(blocking_wait) {}

  using Work::wait;
  // torch's WorkNCCL::wait: the caller's current streams wait for the op;
  // the host waits only with TORCH_NCCL_BLOCKING_WAIT=1 and for barriers
  // (whose point is the host's wait), and then reports the op's error or
  // timeout.
  absl::Status wait(absl::Duration timeout) override {
    if (blocking_wait_ || host_wait_) return Work::wait(timeout);
    return synchronize();
  }

  // The caller's current streams wait for the op's end events; the host does
  // not (WorkNCCL::synchronize). Reports the op's error once it has failed.
  absl::Status synchronize() override {
    if (is_completed()) EMBER_RETURN_IF_ERROR(status());
    for (size_t i = 0; i < ends_.size(); ++i) {
      EMBER_ASSIGN_OR_RETURN(cuda::Stream current, cuda::current_stream(comms_->devices[i]));
      EMBER_RETURN_IF_ERROR(current.wait_event(ends_[i]));
    }
    return absl::OkStatus();
  }

  bool GpuDone() const {
    for (const ember::Event& e : ends_) {
      if (!e.query()) return false;
    }
    return true;
  }
  absl::Status CommError() const {
    for (const auto& comm : comms_->comms) EMBER_RETURN_IF_ERROR(comm->async_error());
    return absl::OkStatus();
  }
  // "all_reduce (4096 float32 on cuda:0), collective #12 of group default_pg/".
  std::string Name(const std::string& group) const {
    return absl::StrCat(what_, ", op #", seq_, " of group ", group);
  }

  int64_t seq_;
  std::string what_;
  absl::Duration timeout_;
  absl::Time timeout_at_;  // the watchdog's deadline; Work's is kBackstop later
  absl::Time started_ = absl::Now();
  std::shared_ptr<CommSet> comms_;
  bool blocking_wait_;
  bool host_wait_ = false;  // barrier
  std::vector<ember::Event> ends_;
  std::vector<Tensor> keep_;  // released when the op finishes
};

absl::StatusOr<std::shared_ptr<NcclProcessGroup>> NcclProcessGroup::create(
    const BackendOptions& options) {
  absl::Status usable = cuda::internal::CheckAvailable("the nccl backend");
  if (!usable.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        usable.message(), "; the nccl backend needs a GPU per rank (use gloo on CPU tensors)"));
  }
  EMBER_ASSIGN_OR_RETURN(NcclEnvironment env, read_nccl_environment());
  EMBER_ASSIGN_OR_RETURN(const NcclOptions* mine, OptionsFor<NcclOptions>(options, "nccl"));
  NcclOptions nccl_options;
  if (mine != nullptr) nccl_options = *mine;
  auto group = std::shared_ptr<NcclProcessGroup>(new NcclProcessGroup(options, env, nccl_options));
  // Note [NCCL split groups]: the communicator split for this group, if any.
  std::unique_ptr<NcclComm> split;
  {
    PendingSplits& pending = Pending();
    absl::MutexLock lock(&pending.mu);
    auto it = pending.by_group.find({options.store.get(), options.store_prefix});
    if (it != pending.by_group.end()) {
      split = std::move(it->second.comm);
      pending.by_group.erase(it);
    }
  }
  if (split != nullptr) EMBER_RETURN_IF_ERROR(group->AdoptSplit(std::move(split)));
  return group;
}

absl::Status NcclProcessGroup::AdoptSplit(std::unique_ptr<NcclComm> comm) {
  if (comm->size() != size() || comm->rank() != rank()) {
    return absl::InternalError(absl::StrCat(
        "the NCCL communicator split for group ", prefix_, " has ", comm->size(),
        " ranks with this one as rank ", comm->rank(), ", but the group has ", size(),
        " ranks with this one as rank ", rank(), "; every rank must call new_group with the "
        "same ranks"));
  }
  const int device = comm->device();
  auto set = std::make_shared<CommSet>();
  set->name = absl::StrCat("cuda:", device, " (split from the default group)");
  set->devices = {device};
  set->comms.push_back(std::move(comm));
  EMBER_ASSIGN_OR_RETURN(cuda::Stream s, cuda::get_stream_from_pool(
                                             nccl_options_.is_high_priority_stream, device));
  set->streams.push_back(s);
  absl::MutexLock lock(&mu_);
  comms_[absl::StrCat(device)] = set;  // CollectiveComms' key for {device}
  last_device_ = device;              // the group's barrier runs there
  return absl::OkStatus();
}

absl::Status NcclProcessGroup::split_for_new_group(const BackendOptions& group,
                                                   const std::string& part) {
  if (!NcclComm::kCanSplit) return absl::OkStatus();
  std::shared_ptr<CommSet> parent;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return absl::OkStatus();
    for (const auto& [key, set] : comms_) {
      if (set->number >= 0 && set->devices.size() == 1 &&
          (parent == nullptr || set->number < parent->number)) {
        parent = set;
      }
    }
  }
  if (parent == nullptr) return absl::OkStatus();
  const auto* theirs = dynamic_cast<const NcclOptions*>(group.pg_options.get());
  const bool member = group.rank >= 0;
  absl::StatusOr<std::unique_ptr<NcclComm>> comm = parent->comms[0]->split(
      member ? 0 : NcclComm::kNoColor, member ? group.rank : rank(),
      theirs != nullptr ? theirs->config : CommConfig{}, absl::Now() + group.timeout);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat("new_group: splitting ", parent->name, " of group ", prefix_,
                                     ": ", comm.status().message()));
  }
  if (*comm == nullptr) return absl::OkStatus();  // not a member
  PendingSplits& pending = Pending();
  absl::MutexLock lock(&pending.mu);
  pending.by_group[{group.store.get(), group.store_prefix + part}] =
      PendingSplit{this, std::move(*comm)};
  return absl::OkStatus();
}

// Note [NCCL shrunken groups]
// shrink_group calls shrink_for_new_group on the group being shrunk, on the
// surviving ranks only. Like a split (Note [NCCL split groups]), the first
// single-device communicator is shrunk, here with ncclCommShrink, which the
// excluded (dead) ranks need not join, and the result waits in the same
// table under the shrunken group's store and prefix until the group takes
// it. With kShrinkAbort the parent's running kernels are stopped first
// (NCCL_SHRINK_ABORT); shrink_group aborts the old group afterwards either
// way. The GPU test is in process_group_nccl_test.cc.
absl::Status NcclProcessGroup::shrink_for_new_group(const BackendOptions& group,
                                                    absl::Span<const int> excluded,
                                                    bool abort_first, const std::string& part) {
  if (!NcclComm::kCanShrink) return absl::OkStatus();
  std::shared_ptr<CommSet> parent;
  {
    absl::MutexLock lock(&mu_);
    // An aborted group's communicators are gone (ncclCommAbort frees them):
    // the shrunken group then makes its own through the store.
    if (!aborted_.ok()) return absl::OkStatus();
    for (const auto& [key, set] : comms_) {
      if (set->number >= 0 && set->devices.size() == 1 &&
          (parent == nullptr || set->number < parent->number)) {
        parent = set;
      }
    }
  }
  if (parent == nullptr) return absl::OkStatus();
  const auto* theirs = dynamic_cast<const NcclOptions*>(group.pg_options.get());
  absl::StatusOr<std::unique_ptr<NcclComm>> comm =
      parent->comms[0]->shrink(excluded, theirs != nullptr ? theirs->config : CommConfig{},
                               abort_first, absl::Now() + group.timeout);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat("shrink_group: shrinking ", parent->name, " of group ",
                                     prefix_, ": ", comm.status().message()));
  }
  PendingSplits& pending = Pending();
  absl::MutexLock lock(&pending.mu);
  pending.by_group[{group.store.get(), group.store_prefix + part}] =
      PendingSplit{this, std::move(*comm)};
  return absl::OkStatus();
}

NcclProcessGroup::NcclProcessGroup(const BackendOptions& options, NcclEnvironment env,
                                   NcclOptions nccl_options)
    : ProcessGroup(options.rank, options.size, "nccl", NcclSupportTable(), options.timeout),
      store_(options.store),
      prefix_(options.store_prefix),
      env_(env),
      nccl_options_(std::move(nccl_options)) {
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    PendingSplits& pending = Pending();
    absl::MutexLock lock(&pending.mu);
    std::erase_if(pending.by_group, [this](const auto& entry) { return entry.second.parent == this; });
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  watchdog_.join();
  // Let the ops in flight finish (bounded), then abort what is still running
  // so that destroying the communicators cannot hang.
  const absl::Time until = absl::Now() + std::min(timeout(), kDestroyGrace);
  bool done = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      done = std::all_of(in_flight_.begin(), in_flight_.end(),
                         [](const auto& w) { return w->GpuDone(); });
    }
    if (done || absl::Now() >= until) break;
    absl::SleepFor(kWatchdogInterval);
  }
  if (!done) AbortAll(absl::AbortedError("the group was destroyed with ops still running"));
  absl::MutexLock lock(&mu_);
  for (auto& w : in_flight_) w->Finish(absl::AbortedError("the process group was destroyed"));
  in_flight_.clear();
}

void NcclProcessGroup::abort() { AbortAll(absl::AbortedError("abort() was called")); }

void NcclProcessGroup::MarkAborted(const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ = absl::AbortedError(
        absl::StrCat("the nccl group ", prefix_, " was aborted: ", cause.message()));
  }
}

void NcclProcessGroup::AbortAll(const absl::Status& cause) {
  MarkAborted(cause);
  std::vector<std::shared_ptr<NcclWork>> works;
  std::vector<std::shared_ptr<CommSet>> sets;
  {
    absl::MutexLock lock(&mu_);
    works.swap(in_flight_);
    for (auto& [key, set] : comms_) sets.push_back(set);
  }
  for (auto& set : sets) {
    for (auto& comm : set->comms) comm->abort();
  }
  for (auto& w : works) {
    w->Finish(absl::AbortedError(absl::StrCat(w->Name(prefix_), ": ", cause.message())));
  }
}

absl::StatusOr<std::shared_ptr<NcclProcessGroup::CommSet>> NcclProcessGroup::CollectiveComms(
    const std::vector<int>& devices) {
  const std::string key = absl::StrJoin(devices, ",");
  int64_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    EMBER_RETURN_IF_ERROR(aborted_);
    auto it = comms_.find(key);
    if (it != comms_.end()) return it->second;
    n = comm_counter_++;
  }
  const int per_rank = static_cast<int>(devices.size());
  EMBER_ASSIGN_OR_RETURN(
      ncclUniqueId id,
      exchange_unique_id(*store_, absl::StrCat(prefix_, n), rank() == 0, timeout()));
  std::vector<CommSpec> specs;
  for (int i = 0; i < per_rank; ++i) {
    specs.push_back({.device = devices[i],
                     .size = size() * per_rank,
                     .rank = rank() * per_rank + i,
                     .id = id,
                     .deadline = absl::Now() + timeout(),
                     .config = nccl_options_.config});
  }
  auto set = std::make_shared<CommSet>();
  set->name = absl::StrCat("cuda:", key);
  set->number = n;
  set->devices = devices;
  EMBER_ASSIGN_OR_RETURN(set->comms, NcclComm::create_many(specs));
  for (int device : devices) {
    EMBER_ASSIGN_OR_RETURN(cuda::Stream s, cuda::get_stream_from_pool(
                                               nccl_options_.is_high_priority_stream, device));
    set->streams.push_back(s);
  }
  absl::MutexLock lock(&mu_);
  comms_[key] = set;
  return set;
}

absl::StatusOr<std::shared_ptr<NcclProcessGroup::CommSet>> NcclProcessGroup::PeerComm(
    int peer, int device) {
  const int low = std::min(rank(), peer), high = std::max(rank(), peer);
  const std::string key = absl::StrCat("p2p:", low, ":", high, "@", device);
  int64_t k = 0;
  {
    absl::MutexLock lock(&mu_);
    EMBER_RETURN_IF_ERROR(aborted_);
    auto it = comms_.find(key);
    if (it != comms_.end()) return it->second;
    for (const auto& [other, set] : comms_) {
      if (absl::StartsWith(other, absl::StrCat("p2p:", low, ":", high, "@"))) ++k;
    }
  }
  EMBER_ASSIGN_OR_RETURN(
      ncclUniqueId id, exchange_unique_id(*store_, absl::StrCat(prefix_, "p2p:", low, ":", high, ":", k),
                                          rank() == low, timeout()));
  auto set = std::make_shared<CommSet>();
  set->name = absl::StrCat("p2p with rank ", peer, " on cuda:", device);
  set->devices = {device};
  EMBER_ASSIGN_OR_RETURN(set->comms, NcclComm::create_many({{.device = device,
                                                             .size = 2,
                                                             .rank = rank() == low ? 0 : 1,
                                                             .id = id,
                                                             .deadline = absl::Now() + timeout(),
                                                             .config = nccl_options_.config}}));
  EMBER_ASSIGN_OR_RETURN(cuda::Stream s,
                         cuda::get_stream_from_pool(nccl_options_.is_high_priority_stream, device));
  set->streams.push_back(s);
  absl::MutexLock lock(&mu_);
  comms_[key] = set;
  return set;
}

absl::StatusOr<std::shared_ptr<NcclProcessGroup::NcclWork>> NcclProcessGroup::Run(
    const std::shared_ptr<CommSet>& comms, Launch launch) {
  int64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    EMBER_RETURN_IF_ERROR(aborted_);
    seq = next_seq_++;
    last_device_ = comms->devices[0];
  }
  const absl::Duration op_timeout = launch.timeout.value_or(timeout());
  auto work = std::make_shared<NcclWork>(launch.op, DeadlineFor(launch.timeout), seq,
                                         std::move(launch.what), op_timeout, comms,
                                         env_.blocking_wait);
  const size_t n = comms->devices.size();
  // The communication streams start after everything the caller queued.
  for (size_t i = 0; i < n; ++i) {
    EMBER_ASSIGN_OR_RETURN(cuda::Stream current, cuda::current_stream(comms->devices[i]));
    ember::Event ready(DeviceType::kCUDA);
    EMBER_RETURN_IF_ERROR(ready.record(current));
    EMBER_RETURN_IF_ERROR(comms->streams[i].wait_event(ready));
  }
  auto on_streams = [&](const std::function<void(size_t)>& body) {
    if (!body) return;
    for (size_t i = 0; i < n; ++i) {
      StreamGuard guard(comms->streams[i]);
      body(i);
    }
  };
  on_streams(launch.before);
  const absl::Time enqueue_deadline = absl::Now() + op_timeout;
  absl::Status issued = [&]() -> absl::Status {
    EMBER_RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart"));
    absl::Status each;
    for (size_t i = 0; i < n && each.ok(); ++i) {
      each = cuda::internal::OnDevice(comms->devices[i], [&]() -> absl::Status {
        return launch.issue(i, comms->comms[i]->get(), comms->streams[i].stream());
      });
    }
    EMBER_RETURN_IF_ERROR(Nccl(ncclGroupEnd(), "ncclGroupEnd"));
    EMBER_RETURN_IF_ERROR(each);
    for (auto& comm : comms->comms) {
      EMBER_RETURN_IF_ERROR(comm->WaitReady(work->what_, enqueue_deadline));
    }
    return absl::OkStatus();
  }();
  if (!issued.ok()) {
    return absl::Status(issued.code(), absl::StrCat(work->Name(prefix_), ": ", issued.message()));
  }
  on_streams(launch.after);
  for (size_t i = 0; i < n; ++i) {
    for (const Tensor& t : launch.tensors) {
      if (t.defined() && t.device().index() == comms->devices[i]) {
        t.record_stream(comms->streams[i]);
      }
    }
    ember::Event end(DeviceType::kCUDA);
    EMBER_RETURN_IF_ERROR(end.record(comms->streams[i]));
    work->ends_.push_back(std::move(end));
  }
  work->keep_ = std::move(launch.tensors);
  work->set_result(std::move(launch.result));
  absl::MutexLock lock(&mu_);
  in_flight_.push_back(work);
  return work;
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Collective(const Tensor& on,
                                                                   Launch launch) {
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, CollectiveComms({on.device().index()}));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  return std::static_pointer_cast<Work>(work);
}

int NcclProcessGroup::BarrierDevice() {
  {
    absl::MutexLock lock(&mu_);
    if (last_device_ >= 0) return last_device_;
  }
  const int count = cuda::device_count();
  return count > 0 ? rank() % count : 0;
}

void NcclProcessGroup::WatchdogLoop() {
  while (true) {
    std::vector<std::shared_ptr<NcclWork>> works;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kWatchdogInterval);
      if (stopping_) return;
      works = in_flight_;
    }
    std::vector<std::shared_ptr<NcclWork>> finished;
    for (const auto& work : works) {
      if (work->is_completed()) {  // aborted, or failed by a waiter
        finished.push_back(work);
        continue;
      }
      if (work->GpuDone()) {
        work->Finish(absl::OkStatus());
        finished.push_back(work);
        continue;
      }
      if (absl::Status error = work->CommError(); !error.ok()) {
        HandleFailure(work, absl::Status(error.code(),
                                         absl::StrCat("[Rank ", rank(), "] ", work->Name(prefix_),
                                                      " failed on ", work->comms_->name, ": ",
                                                      error.message())));
        finished.push_back(work);
        continue;
      }
      if (absl::Now() > work->timeout_at_) {
        HandleFailure(
            work,
            absl::DeadlineExceededError(absl::StrCat(
                "[Rank ", rank(), "] Watchdog caught collective operation timeout: ",
                work->Name(prefix_), " ran for ",
                absl::ToInt64Milliseconds(absl::Now() - work->started_),
                " milliseconds before timing out (timeout ", absl::FormatDuration(work->timeout_),
                "); a rank of the group has not called it, or is stuck before it")));
        finished.push_back(work);
      }
    }
    if (finished.empty()) continue;
    absl::MutexLock lock(&mu_);
    std::erase_if(in_flight_, [&](const auto& w) {
      return std::find(finished.begin(), finished.end(), w) != finished.end();
    });
    for (auto& w : finished) w->keep_.clear();
  }
}

void NcclProcessGroup::HandleFailure(const std::shared_ptr<NcclWork>& work, absl::Status status) {
  // Note [NCCL watchdog]: aborted before the op fails, where the group aborts.
  if (env_.async_error_handling == AsyncErrorHandling::kCleanUpOnly ||
      env_.async_error_handling == AsyncErrorHandling::kTearDown) {
    MarkAborted(status);
  }
  work->Finish(status);
  std::fprintf(stderr, "ember nccl: %s\n", std::string(status.message()).c_str());
  switch (env_.async_error_handling) {
    case AsyncErrorHandling::kNoHandling:
      return;
    case AsyncErrorHandling::kCleanUpOnly:
      AbortAll(status);
      return;
    case AsyncErrorHandling::kTearDown:
      AbortAll(status);
      std::fprintf(stderr,
                   "ember nccl: TORCH_NCCL_ASYNC_ERROR_HANDLING=1: the communicators were "
                   "aborted; to avoid computing on inconsistent data the process ends now\n");
      std::abort();
    case AsyncErrorHandling::kSkipCleanUp:
      std::fprintf(stderr,
                   "ember nccl: TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (the default): to avoid "
                   "computing on inconsistent data the process ends now, without aborting the "
                   "communicators (set it to 2 to abort and continue, 0 to do nothing)\n");
      std::abort();
  }
}

// --- Ops ---------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoBroadcast(
    const Tensor& tensor, const BroadcastOptions& options) {
  Tensor buf = tensor.contiguous();
  auto [type, count] = MoveType(buf);
  const int root = options.root;
  Launch launch{.op = OpType::kBroadcast,
                .what = Describe("broadcast", tensor),
                .timeout = options.timeout,
                .tensors = {tensor, buf},
                .result = {tensor}};
  launch.issue = [buf, type, count, root](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclBroadcast(buf.raw_data(), buf.raw_data(), count, type, root, comm, stream),
                "ncclBroadcast");
  };
  if (!buf.is_same(tensor)) launch.after = [tensor, buf](size_t) { tensor.copy_(buf); };
  return Collective(tensor, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoAllReduce(
    const Tensor& tensor, const AllReduceOptions& options) {
  EMBER_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_dtype(tensor.dtype()));
  EMBER_ASSIGN_OR_RETURN(ncclRedOp_t op, nccl_reduce_op(options.op, tensor.dtype()));
  Tensor buf = tensor.contiguous();
  const size_t count = buf.numel();
  Launch launch{.op = OpType::kAllReduce,
                .what = Describe("all_reduce", tensor),
                .timeout = options.timeout,
                .tensors = {tensor, buf},
                .result = {tensor}};
  launch.issue = [buf, type, op, count](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclAllReduce(buf.raw_data(), buf.raw_data(), count, type, op, comm, stream),
                "ncclAllReduce");
  };
  if (!buf.is_same(tensor)) launch.after = [tensor, buf](size_t) { tensor.copy_(buf); };
  return Collective(tensor, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoReduce(const Tensor& tensor,
                                                                 const ReduceOptions& options) {
  EMBER_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_dtype(tensor.dtype()));
  EMBER_ASSIGN_OR_RETURN(ncclRedOp_t op, nccl_reduce_op(options.op, tensor.dtype()));
  Tensor buf = tensor.contiguous();
  const size_t count = buf.numel();
  const int root = options.root;
  Launch launch{.op = OpType::kReduce,
                .what = Describe("reduce", tensor),
                .timeout = options.timeout,
                .tensors = {tensor, buf},
                .result = {tensor}};
  launch.issue = [buf, type, op, count, root](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclReduce(buf.raw_data(), buf.raw_data(), count, type, op, root, comm, stream),
                "ncclReduce");
  };
  if (!buf.is_same(tensor) && rank() == root) {
    launch.after = [tensor, buf](size_t) { tensor.copy_(buf); };
  }
  return Collective(tensor, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoAllGatherIntoTensor(
    const Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  Tensor in = input.contiguous();
  Tensor out = output.is_contiguous() ? output : empty(output.sizes(), output.options());
  auto [type, count] = MoveType(in);
  Launch launch{.op = OpType::kAllGatherIntoTensor,
                .what = Describe("all_gather_into_tensor", input),
                .timeout = options.timeout,
                .tensors = {input, in, output, out},
                .result = {output}};
  launch.issue = [in, out, type, count](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclAllGather(in.raw_data(), out.raw_data(), count, type, comm, stream),
                "ncclAllGather");
  };
  if (!out.is_same(output)) launch.after = [output, out](size_t) { output.copy_(out); };
  return Collective(input, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoAllGather(
    absl::Span<const Tensor> outputs, const Tensor& input, const AllGatherOptions& options) {
  Tensor in = input.contiguous();
  const int64_t n = in.numel();
  Tensor flat = empty({size() * n}, in.options());
  auto [type, count] = MoveType(in);
  std::vector<Tensor> outs(outputs.begin(), outputs.end());
  Launch launch{.op = OpType::kAllGather,
                .what = Describe("all_gather", input),
                .timeout = options.timeout,
                .tensors = outs,
                .result = outs};
  launch.tensors.push_back(input);
  launch.tensors.push_back(in);
  launch.tensors.push_back(flat);
  launch.issue = [in, flat, type, count](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclAllGather(in.raw_data(), flat.raw_data(), count, type, comm, stream),
                "ncclAllGather");
  };
  launch.after = [outs, flat, n](size_t) {
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
    }
  };
  return Collective(input, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoReduceScatter(
    const Tensor& output, absl::Span<const Tensor> inputs, const ReduceScatterOptions& options) {
  EMBER_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_dtype(output.dtype()));
  EMBER_ASSIGN_OR_RETURN(ncclRedOp_t op, nccl_reduce_op(options.op, output.dtype()));
  const int64_t n = output.numel();
  Tensor flat = empty({size() * n}, output.options());
  Tensor out = output.is_contiguous() ? output : empty(output.sizes(), output.options());
  std::vector<Tensor> ins(inputs.begin(), inputs.end());
  Launch launch{.op = OpType::kReduceScatter,
                .what = Describe("reduce_scatter", output),
                .timeout = options.timeout,
                .tensors = ins,
                .result = {output}};
  launch.tensors.insert(launch.tensors.end(), {output, out, flat});
  launch.before = [ins, flat, n](size_t) {
    for (size_t i = 0; i < ins.size(); ++i) {
      flat.narrow(0, static_cast<int64_t>(i) * n, n).copy_(ins[i].reshape({n}));
    }
  };
  launch.issue = [flat, out, type, op, n](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclReduceScatter(flat.raw_data(), out.raw_data(), static_cast<size_t>(n), type,
                                  op, comm, stream),
                "ncclReduceScatter");
  };
  if (!out.is_same(output)) launch.after = [output, out](size_t) { output.copy_(out); };
  return Collective(output, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoAllToAll(
    absl::Span<const Tensor> outputs, absl::Span<const Tensor> inputs,
    const AllToAllOptions& options) {
  // One send and one receive per peer inside one group call: equal and
  // uneven splits alike.
  std::vector<Tensor> ins, outs, results(outputs.begin(), outputs.end());
  for (const Tensor& t : inputs) ins.push_back(t.contiguous());
  for (const Tensor& t : outputs) {
    outs.push_back(t.is_contiguous() ? t : empty(t.sizes(), t.options()));
  }
  Launch launch{.op = OpType::kAllToAll,
                .what = Describe("all_to_all", inputs[0]),
                .timeout = options.timeout,
                .tensors = ins,
                .result = results};
  launch.tensors.insert(launch.tensors.end(), outs.begin(), outs.end());
  launch.tensors.insert(launch.tensors.end(), results.begin(), results.end());
  launch.issue = [ins, outs](size_t, ncclComm_t comm, cudaStream_t stream) -> absl::Status {
    for (size_t peer = 0; peer < ins.size(); ++peer) {
      auto [stype, scount] = MoveType(ins[peer]);
      auto [rtype, rcount] = MoveType(outs[peer]);
      EMBER_RETURN_IF_ERROR(Nccl(ncclSend(ins[peer].raw_data(), scount, stype,
                                          static_cast<int>(peer), comm, stream),
                                 "ncclSend"));
      EMBER_RETURN_IF_ERROR(Nccl(ncclRecv(outs[peer].raw_data(), rcount, rtype,
                                          static_cast<int>(peer), comm, stream),
                                 "ncclRecv"));
    }
    return absl::OkStatus();
  };
  launch.after = [results, outs](size_t) {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].is_same(results[i])) results[i].copy_(outs[i]);
    }
  };
  return Collective(inputs[0], std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoGather(absl::Span<const Tensor> outputs,
                                                                 const Tensor& input,
                                                                 const GatherOptions& options) {
  // As PyTorch builds gather on NCCL: every rank sends to the root, which
  // receives from every rank (itself included), in one group call.
  Tensor in = input.contiguous();
  std::vector<Tensor> results(outputs.begin(), outputs.end()), outs;
  for (const Tensor& t : outputs) {
    outs.push_back(t.is_contiguous() ? t : empty(t.sizes(), t.options()));
  }
  const int root = options.root;
  const bool is_root = rank() == root;
  Launch launch{.op = OpType::kGather,
                .what = Describe("gather", input),
                .timeout = options.timeout,
                .tensors = outs,
                .result = results};
  launch.tensors.insert(launch.tensors.end(), {input, in});
  launch.tensors.insert(launch.tensors.end(), results.begin(), results.end());
  launch.issue = [in, outs, root, is_root](size_t, ncclComm_t comm,
                                           cudaStream_t stream) -> absl::Status {
    auto [type, count] = MoveType(in);
    if (is_root) {
      for (size_t peer = 0; peer < outs.size(); ++peer) {
        EMBER_RETURN_IF_ERROR(Nccl(ncclRecv(outs[peer].raw_data(), count, type,
                                            static_cast<int>(peer), comm, stream),
                                   "ncclRecv"));
      }
    }
    return Nccl(ncclSend(in.raw_data(), count, type, root, comm, stream), "ncclSend");
  };
  launch.after = [results, outs](size_t) {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].is_same(results[i])) results[i].copy_(outs[i]);
    }
  };
  return Collective(input, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoScatter(
    const Tensor& output, absl::Span<const Tensor> inputs, const ScatterOptions& options) {
  Tensor out = output.is_contiguous() ? output : empty(output.sizes(), output.options());
  std::vector<Tensor> ins;
  for (const Tensor& t : inputs) ins.push_back(t.contiguous());
  const int root = options.root;
  const bool is_root = rank() == root;
  Launch launch{.op = OpType::kScatter,
                .what = Describe("scatter", output),
                .timeout = options.timeout,
                .tensors = ins,
                .result = {output}};
  launch.tensors.insert(launch.tensors.end(), {output, out});
  launch.issue = [ins, out, root, is_root](size_t, ncclComm_t comm,
                                           cudaStream_t stream) -> absl::Status {
    auto [type, count] = MoveType(out);
    if (is_root) {
      for (size_t peer = 0; peer < ins.size(); ++peer) {
        EMBER_RETURN_IF_ERROR(Nccl(ncclSend(ins[peer].raw_data(), count, type,
                                            static_cast<int>(peer), comm, stream),
                                   "ncclSend"));
      }
    }
    return Nccl(ncclRecv(out.raw_data(), count, type, root, comm, stream), "ncclRecv");
  };
  if (!out.is_same(output)) launch.after = [output, out](size_t) { output.copy_(out); };
  return Collective(output, std::move(launch));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoBarrier(const BarrierOptions& options) {
  // An all_reduce of one element on the group's device, as PyTorch's barrier
  // on NCCL; its Work finishes when the GPU is done, so wait() returns when
  // every rank has reached the barrier.
  const int device = BarrierDevice();
  Tensor one = zeros({1}, TensorOptions(kFloat32).device(Device(DeviceType::kCUDA, device)));
  Launch launch{.op = OpType::kBarrier,
                .what = absl::StrCat("barrier (on cuda:", device, ")"),
                .timeout = options.timeout,
                .tensors = {one}};
  launch.issue = [one](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, comm, stream),
                "ncclAllReduce");
  };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, CollectiveComms({device}));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  work->host_wait_ = true;
  return std::static_pointer_cast<Work>(work);
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoMonitoredBarrier(
    const MonitoredBarrierOptions&) {
  // The support table refuses it before this is reached.
  return absl::UnimplementedError("monitored_barrier is not supported by the nccl backend");
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::DoSend(const Tensor& tensor, int dst,
                                                               const P2POptions& options) {
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, PeerComm(dst, tensor.device().index()));
  Tensor buf = tensor.contiguous();
  auto [type, count] = MoveType(buf);
  const int peer = rank() < dst ? 1 : 0;
  Launch launch{.op = OpType::kSend,
                .what = absl::StrCat(Describe("send", tensor), " to rank ", dst),
                .timeout = options.timeout,
                .tensors = {tensor, buf},
                .result = {tensor}};
  launch.issue = [buf, type, count, peer](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclSend(buf.raw_data(), count, type, peer, comm, stream), "ncclSend");
  };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  return std::static_pointer_cast<Work>(work);
}

absl::StatusOr<std::shared_ptr<RecvWork>> NcclProcessGroup::DoRecv(const Tensor& tensor, int src,
                                                                   const P2POptions& options) {
  if (src == kAnySource) {
    return absl::UnimplementedError(
        "recv from any source is not supported by the nccl backend (NCCL needs the sender's "
        "rank); name the source rank");
  }
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, PeerComm(src, tensor.device().index()));
  Tensor buf = tensor.is_contiguous() ? tensor : empty(tensor.sizes(), tensor.options());
  auto [type, count] = MoveType(buf);
  const int peer = rank() < src ? 1 : 0;
  Launch launch{.op = OpType::kRecv,
                .what = absl::StrCat(Describe("recv", tensor), " from rank ", src),
                .timeout = options.timeout,
                .tensors = {tensor, buf},
                .result = {tensor}};
  launch.issue = [buf, type, count, peer](size_t, ncclComm_t comm, cudaStream_t stream) {
    return Nccl(ncclRecv(buf.raw_data(), count, type, peer, comm, stream), "ncclRecv");
  };
  if (!buf.is_same(tensor)) launch.after = [tensor, buf](size_t) { tensor.copy_(buf); };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  work->set_source(src);
  return std::static_pointer_cast<RecvWork>(work);
}

absl::StatusOr<std::vector<std::shared_ptr<Work>>> NcclProcessGroup::DoBatchP2P(
    absl::Span<const P2PRequest> ops) {
  // Every op on the group's communicator of op 0's device, inside the one
  // ncclGroupStart/End that Run makes: NCCL pairs each ncclSend with its
  // peer's ncclRecv within a group call whatever the order, so a batch may
  // list sends and receives in any order on either side.
  const int device = ops[0].tensor.device().index();
  int sends = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2PRequest& op = ops[i];
    if (op.tensor.device().index() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch_isend_irecv: op ", i, "'s tensor is on cuda:", op.tensor.device().index(),
          " but op 0's is on cuda:", device, "; the nccl backend runs a batch on one device"));
    }
    if (op.op == OpType::kRecv && op.peer == kAnySource) {
      return absl::UnimplementedError(absl::StrCat(
          "batch_isend_irecv: op ", i, " receives from any source, which the nccl backend does "
          "not support (NCCL needs the sender's rank); name the source rank"));
    }
    if (op.op == OpType::kSend) ++sends;
  }
  struct Move {
    bool send;
    Tensor tensor;  // the caller's
    Tensor buf;     // contiguous: the tensor itself, or a staging copy
    ncclDataType_t type;
    size_t count;
    int peer;
  };
  std::vector<Move> moves;
  Launch launch{.op = ops[0].op,
                .what = absl::StrCat("batch_isend_irecv (", sends, " sends, ",
                                     ops.size() - sends, " recvs)"),
                .timeout = ops[0].options.timeout};
  for (const P2PRequest& op : ops) {
    const bool send = op.op == OpType::kSend;
    Tensor buf = send                         ? op.tensor.contiguous()
                 : op.tensor.is_contiguous() ? op.tensor
                                             : empty(op.tensor.sizes(), op.tensor.options());
    auto [type, count] = MoveType(buf);
    moves.push_back({send, op.tensor, buf, type, count, op.peer});
    launch.tensors.push_back(op.tensor);
    launch.tensors.push_back(buf);
    launch.result.push_back(op.tensor);
  }
  launch.issue = [moves](size_t, ncclComm_t comm, cudaStream_t stream) -> absl::Status {
    for (const Move& m : moves) {
      if (m.send) {
        EMBER_RETURN_IF_ERROR(
            Nccl(ncclSend(m.buf.raw_data(), m.count, m.type, m.peer, comm, stream), "ncclSend"));
      } else {
        EMBER_RETURN_IF_ERROR(
            Nccl(ncclRecv(m.buf.raw_data(), m.count, m.type, m.peer, comm, stream), "ncclRecv"));
      }
    }
    return absl::OkStatus();
  };
  launch.after = [moves](size_t) {
    for (const Move& m : moves) {
      if (!m.send && !m.buf.is_same(m.tensor)) m.tensor.copy_(m.buf);
    }
  };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, CollectiveComms({device}));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  // The batch is one NCCL group: every op's Work is the batch's.
  return std::vector<std::shared_ptr<Work>>(ops.size(), std::static_pointer_cast<Work>(work));
}

// --- Multi-GPU ops -----------------------------------------------------------------

namespace {

// One tensor per distinct local GPU, all of one dtype and size.
absl::StatusOr<std::vector<int>> CheckMultiGpu(const char* op, absl::Span<const Tensor> tensors) {
  if (tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": the tensor list is empty"));
  }
  std::vector<int> devices;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined() || !t.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " is not a CUDA tensor; the multi-GPU ops take one "
                                           "CUDA tensor per local GPU"));
    }
    if (t.dtype() != tensors[0].dtype() || t.numel() != tensors[0].numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": tensor ", i, " is ", t.numel(), " ", std::string(dtype_name(t.dtype())), ", tensor 0 is ",
          tensors[0].numel(), " ", std::string(dtype_name(tensors[0].dtype())), "; they must agree"));
    }
    if (std::find(devices.begin(), devices.end(), t.device().index()) != devices.end()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": two tensors are on ",
                                                     t.device().str(),
                                                     "; give one tensor per GPU"));
    }
    devices.push_back(t.device().index());
  }
  return devices;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::broadcast_multigpu(
    absl::Span<const Tensor> tensors, int src_rank, int src_tensor) {
  EMBER_ASSIGN_OR_RETURN(std::vector<int> devices, CheckMultiGpu("broadcast_multigpu", tensors));
  if (src_rank < 0 || src_rank >= size() || src_tensor < 0 ||
      src_tensor >= static_cast<int>(tensors.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "broadcast_multigpu: source rank ", src_rank, " tensor ", src_tensor,
        " is out of range (ranks 0..", size() - 1, ", tensors 0..", tensors.size() - 1, ")"));
  }
  std::vector<Tensor> bufs;
  for (const Tensor& t : tensors) bufs.push_back(t.contiguous());
  const int root = src_rank * static_cast<int>(tensors.size()) + src_tensor;
  std::vector<Tensor> originals(tensors.begin(), tensors.end());
  Launch launch{.op = OpType::kBroadcast,
                .what = Describe("broadcast_multigpu", tensors[0]),
                .tensors = bufs,
                .result = originals};
  launch.tensors.insert(launch.tensors.end(), originals.begin(), originals.end());
  launch.issue = [bufs, root](size_t i, ncclComm_t comm, cudaStream_t stream) {
    auto [type, count] = MoveType(bufs[i]);
    return Nccl(ncclBroadcast(bufs[i].raw_data(), bufs[i].raw_data(), count, type, root, comm,
                              stream),
                "ncclBroadcast");
  };
  launch.after = [bufs, originals](size_t i) {
    if (!bufs[i].is_same(originals[i])) originals[i].copy_(bufs[i]);
  };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, CollectiveComms(devices));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  return std::static_pointer_cast<Work>(work);
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::all_reduce_multigpu(
    absl::Span<const Tensor> tensors, ReduceOp op) {
  return reduce_multigpu(tensors, /*dst_rank=*/-1, op, 0);
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::reduce_multigpu(
    absl::Span<const Tensor> tensors, int dst_rank, ReduceOp op, int dst_tensor) {
  const bool all = dst_rank < 0;  // all_reduce_multigpu
  const char* name = all ? "all_reduce_multigpu" : "reduce_multigpu";
  EMBER_ASSIGN_OR_RETURN(std::vector<int> devices, CheckMultiGpu(name, tensors));
  if (!all && (dst_rank >= size() || dst_tensor < 0 ||
               dst_tensor >= static_cast<int>(tensors.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": destination rank ", dst_rank, " tensor ", dst_tensor, " is out of range (ranks 0..",
        size() - 1, ", tensors 0..", tensors.size() - 1, ")"));
  }
  EMBER_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_dtype(tensors[0].dtype()));
  EMBER_ASSIGN_OR_RETURN(ncclRedOp_t red, nccl_reduce_op(op, tensors[0].dtype()));
  std::vector<Tensor> bufs, originals(tensors.begin(), tensors.end());
  for (const Tensor& t : tensors) bufs.push_back(t.contiguous());
  const int root = all ? -1 : dst_rank * static_cast<int>(tensors.size()) + dst_tensor;
  Launch launch{.op = all ? OpType::kAllReduce : OpType::kReduce,
                .what = Describe(name, tensors[0]),
                .tensors = bufs,
                .result = originals};
  launch.tensors.insert(launch.tensors.end(), originals.begin(), originals.end());
  launch.issue = [bufs, type, red, root](size_t i, ncclComm_t comm, cudaStream_t stream) {
    void* p = bufs[i].raw_data();
    const size_t count = bufs[i].numel();
    if (root < 0) return Nccl(ncclAllReduce(p, p, count, type, red, comm, stream), "ncclAllReduce");
    return Nccl(ncclReduce(p, p, count, type, red, root, comm, stream), "ncclReduce");
  };
  launch.after = [bufs, originals](size_t i) {
    if (!bufs[i].is_same(originals[i])) originals[i].copy_(bufs[i]);
  };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, CollectiveComms(devices));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  return std::static_pointer_cast<Work>(work);
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::all_gather_multigpu(
    absl::Span<const std::vector<Tensor>> outputs, absl::Span<const Tensor> inputs) {
  EMBER_ASSIGN_OR_RETURN(std::vector<int> devices, CheckMultiGpu("all_gather_multigpu", inputs));
  const size_t total = static_cast<size_t>(size()) * inputs.size();
  if (outputs.size() != inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("all_gather_multigpu: ", outputs.size(), " output lists for ", inputs.size(),
                     " inputs; give one list per input"));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].size() != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_gather_multigpu: output list ", i, " has ", outputs[i].size(),
          " tensors, expected world size x inputs = ", total));
    }
    for (const Tensor& o : outputs[i]) {
      if (!o.defined() || o.device() != inputs[i].device() || o.numel() != inputs[i].numel() ||
          o.dtype() != inputs[i].dtype()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "all_gather_multigpu: every tensor of output list ", i, " must be ",
            inputs[i].numel(), " ", std::string(dtype_name(inputs[i].dtype())), " on ",
            inputs[i].device().str(), ", as input ", i));
      }
    }
  }
  std::vector<Tensor> ins, flats;
  for (const Tensor& t : inputs) {
    ins.push_back(t.contiguous());
    flats.push_back(empty({static_cast<int64_t>(total) * t.numel()}, t.options()));
  }
  std::vector<std::vector<Tensor>> outs(outputs.begin(), outputs.end());
  Launch launch{.op = OpType::kAllGather,
                .what = Describe("all_gather_multigpu", inputs[0]),
                .tensors = ins};
  launch.tensors.insert(launch.tensors.end(), flats.begin(), flats.end());
  for (const auto& list : outs) {
    launch.tensors.insert(launch.tensors.end(), list.begin(), list.end());
    launch.result.insert(launch.result.end(), list.begin(), list.end());
  }
  launch.issue = [ins, flats](size_t i, ncclComm_t comm, cudaStream_t stream) {
    auto [type, count] = MoveType(ins[i]);
    return Nccl(ncclAllGather(ins[i].raw_data(), flats[i].raw_data(), count, type, comm, stream),
                "ncclAllGather");
  };
  launch.after = [outs, flats](size_t i) {
    const int64_t n = outs[i][0].numel();
    for (size_t j = 0; j < outs[i].size(); ++j) {
      outs[i][j].copy_(flats[i].narrow(0, static_cast<int64_t>(j) * n, n).view(outs[i][j].sizes()));
    }
  };
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<CommSet> comms, CollectiveComms(devices));
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<NcclWork> work, Run(comms, std::move(launch)));
  return std::static_pointer_cast<Work>(work);
}

EMBER_REGISTER_BACKEND(nccl, BackendInfo{.name = "nccl",
                                         .support = NcclSupportTable(),
                                         .create = [](const BackendOptions& options)
                                             -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
                                           EMBER_ASSIGN_OR_RETURN(
                                               auto pg, NcclProcessGroup::create(options));
                                           return std::static_pointer_cast<ProcessGroup>(pg);
                                         },
                                         .default_timeout = kDefaultNcclTimeout});

}  // namespace ember::distributed::nccl
