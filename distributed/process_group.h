// ProcessGroup: a set of ranks that run collectives and point-to-point ops
// together (torch.distributed's ProcessGroup), as one abstract interface that
// every backend (tcp, gloo and mpi; nccl with CUDA) implements.
//
//   ```cpp
//   #include "distributed/backend_registry.h"
//   #include "distributed/hash_store.h"
//   #include "distributed/process_group.h"
//   #include "tensor/factories.h"
//   namespace dist = ember::distributed;
//   // From init_process_group (distributed.h) or a backend factory; here one rank:
//   EMBER_ASSIGN_OR_RETURN(const dist::BackendInfo* tcp, dist::find_backend("tcp"));
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<dist::ProcessGroup> pg,
//                          tcp->create({.store = std::make_shared<dist::HashStore>()}));
//   ember::Tensor t = ember::ones({4});
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<dist::Work> work,
//                          pg->allreduce(t, {.op = dist::ReduceOp::kSum}));
//   EMBER_RETURN_IF_ERROR(work->wait());  // t now holds the sum over ranks
//   ```
//
// Layering (Note [ProcessGroup layers]): the public, non-virtual methods
// check what is the same for every backend (tensors defined, sizes and dtypes
// that agree, roots and peers in range, the op allowed for the dtype, and the
// backend support table: op x device) and only then call the backend's
// protected Do* method. A backend therefore only ever sees well-formed calls,
// and the same mistake gives the same message on every backend.
//
// Ranks in a ProcessGroup's methods are ranks within that group (0..size-1).
// Tensors are handles: ops read and write the caller's storage, as in
// PyTorch (all_reduce is in place). The caller must keep the tensors alive and
// untouched until the Work completes.
//
// Errors: a user's mistake (an empty list, a root out of range, different
// dtypes, an op the backend does not support) is returned by the call itself
// as kInvalidArgument / kUnimplemented, before any communication. Failures
// that happen while the op runs (a dead or stopped peer, a timeout, a peer
// that disagrees on the tensor size, abort) are the Work's status:
// kDeadlineExceeded, kUnavailable, kFailedPrecondition (mismatched
// collective), kAborted; messages name the op and the peer.
//
// Thread-safety: ProcessGroup methods may be called from any thread; ops
// issued from several threads are ordered as the calls are. Collectives must
// be issued in the same order on every rank (as in PyTorch). Work is
// thread-safe.
#ifndef EMBER_DISTRIBUTED_PROCESS_GROUP_H_
#define EMBER_DISTRIBUTED_PROCESS_GROUP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distributed/debug.h"
#include "distributed/desync.h"
#include "distributed/flight_recorder.h"
#include "distributed/future.h"
#include "distributed/store.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::distributed {

// torch.distributed.ReduceOp. AVG divides the sum by the group size and
// needs a floating dtype. On bool tensors SUM and MAX are "or", PRODUCT and
// MIN are "and", as in PyTorch.
enum class ReduceOp : int8_t { kSum, kProduct, kMin, kMax, kAvg };
const char* reduce_op_name(ReduceOp op);  // "SUM", "PRODUCT", ...

// Every operation a ProcessGroup offers; the rows of the support table.
enum class OpType : int8_t {
  kBroadcast,
  kAllReduce,
  kReduce,
  kAllGather,
  kAllGatherIntoTensor,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kMonitoredBarrier,
  kSend,
  kRecv,
};
inline constexpr int kNumOpTypes = 13;
// The torch.distributed name: "broadcast", "all_reduce", ...
const char* op_type_name(OpType op);

// The ops a backend implements, per device type (Note [Backend support
// table]). Value type.
class SupportTable {
 public:
  SupportTable& allow(OpType op, DeviceType device);
  // Allows every op on `device`.
  SupportTable& allow_all(DeviceType device);
  bool supports(OpType op, DeviceType device) const;

 private:
  uint32_t mask_[kNumDeviceTypes] = {};
};

// The outcome of one asynchronous op (torch's Work). Created by backends;
// completed exactly once, with OK or the op's error.
class Work : public std::enable_shared_from_this<Work> {
 public:
  // `deadline`: when Wait gives up on the op. Backends that enforce the op's
  // timeout themselves pass a later backstop, so that their error (which
  // names the peer) is the one reported.
  Work(OpType op, absl::Time deadline);
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the op completes and returns its status. Without a timeout
  // it waits until the op's deadline, after which the op is cancelled and
  // fails with kDeadlineExceeded. With a timeout shorter than that it
  // returns kDeadlineExceeded when the timeout passes and leaves the op
  // running (call Wait again).
  //
  // A backend whose ops run on device streams may override it (nccl): wait()
  // then makes the caller's current stream wait for the op and returns
  // without blocking the host, as torch's WorkNCCL::wait, unless the backend
  // is told to block (TORCH_NCCL_BLOCKING_WAIT=1).
  virtual absl::Status wait(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status wait() { return wait(absl::InfiniteDuration()); }

  // Whether the op has finished (successfully or not). Never blocks; past
  // the deadline it fails the op as Wait would, so polling also times out.
  bool is_completed() ABSL_LOCKS_EXCLUDED(mu_);
  // OK while running or after success; the error after a failure.
  absl::Status status() ABSL_LOCKS_EXCLUDED(mu_);
  OpType op() const { return op_; }
  absl::Time deadline() const { return deadline_; }

  // torch's Work.synchronize(): for ops on CPU tensors, wait() (the host
  // blocks until the op completes). A backend whose ops run on device
  // streams overrides it to make the caller's current stream wait for the
  // op instead, without blocking the host.
  virtual absl::Status synchronize() { return wait(); }

  // torch's Work.result(): the tensors the op writes (all_reduce and
  // broadcast: the tensor; all_gather, gather, all_to_all: the outputs;
  // scatter, reduce_scatter, all_gather_into_tensor: the output; send and
  // recv: the tensor), meaningful once the op completed; empty for
  // barriers. Set by ProcessGroup when the op is queued.
  const std::vector<Tensor>& result() const { return result_; }
  void set_result(std::vector<Tensor> tensors) { result_ = std::move(tensors); }

  // torch's Work.get_future(): a Future (distributed/future.h) that
  // completes when the op does, with result() as its value; its wait() is
  // this Work's wait() (on nccl, the caller's stream waits). The future
  // holds this Work alive.
  std::shared_ptr<Future> get_future();

  // For backends: completes the work (the first call wins) and wakes
  // waiters.
  void Finish(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // For backends: the op has started running (its worker picked it up);
  // the flight recorder's "started" (Note [Flight recorder]). Optional.
  void MarkStarted() ABSL_LOCKS_EXCLUDED(mu_);
  // For ProcessGroup: the flight recorder entry `id` follows this op; a
  // timeout is explained by `desync` when the group publishes its progress
  // (Note [Desync reports]).
  void AttachRecord(std::shared_ptr<FlightRecorder> recorder, int64_t id,
                    std::weak_ptr<ProgressPublisher> desync = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // A Work that is already finished with `status`.
  static std::shared_ptr<Work> Completed(OpType op, absl::Status status);

 protected:
  // Called by Wait once the deadline has passed and the op is not done.
  // Backends stop the op here; the default finishes with kDeadlineExceeded.
  virtual void OnDeadline();

 private:
  const OpType op_;
  const absl::Time deadline_;
  std::vector<Tensor> result_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // waiters may return
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // status_ is final
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t started_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<FlightRecorder> recorder_ ABSL_GUARDED_BY(mu_);
  int64_t record_id_ ABSL_GUARDED_BY(mu_) = -1;
  std::weak_ptr<ProgressPublisher> desync_ ABSL_GUARDED_BY(mu_);
};

// Options of each op. `timeout` overrides the group's timeout for one call.
struct BroadcastOptions {
  int root = 0;
  std::optional<absl::Duration> timeout;
};
struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout;
};
struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout;
};
struct AllGatherOptions {
  std::optional<absl::Duration> timeout;
};
struct GatherOptions {
  int root = 0;
  std::optional<absl::Duration> timeout;
};
struct ScatterOptions {
  int root = 0;
  std::optional<absl::Duration> timeout;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout;
};
struct AllToAllOptions {
  std::optional<absl::Duration> timeout;
};
struct BarrierOptions {
  std::optional<absl::Duration> timeout;
};
struct MonitoredBarrierOptions {
  std::optional<absl::Duration> timeout;
  // Rank 0 waits for every rank and names all the missing ones, instead of
  // failing at the first.
  bool wait_all_ranks = false;
};
struct P2POptions {
  int tag = 0;
  std::optional<absl::Duration> timeout;
};

// Passed to Recv/IRecv for "from any rank"; Work's source() then tells which.
inline constexpr int kAnySource = -1;

// A collective's call as the ranks compare it (Note [Call checks] in
// process_group.cc): op, dtype, bytes, root, reduce op, the elements sent to
// each rank (all_to_all) and, at TORCH_DISTRIBUTED_DEBUG=DETAIL, the shape.
// Built by ProcessGroup for every collective; a backend carries words() to
// its peers and calls CheckAll / Check with theirs. Value type.
class CallFingerprint {
 public:
  // words(): kFixedWords, then one count per rank.
  static constexpr int kFixedWords = 14;
  static constexpr int kMaxDims = 8;  // dims beyond are folded into the last

  CallFingerprint() = default;
  // `like`: the tensor whose dtype (and, with `shapes`, shape) the call is
  // compared by; null for barriers. `root` -1 and `reduce` nullopt when the
  // op has none.
  CallFingerprint(OpType op, const Tensor* like, int64_t nbytes, int root,
                  std::optional<ReduceOp> reduce, int group_size, bool shapes);
  // all_to_all: elements sent to / expected from each rank.
  void set_counts(std::vector<int64_t> sends, std::vector<int64_t> receives);

  const std::vector<int64_t>& words() const { return words_; }
  // "all_reduce of 4 KiB float32 (SUM)", "broadcast of 32 B int64 with root 1".
  std::string Describe() const { return DescribeWords(words_, false); }
  static std::string DescribeWords(absl::Span<const int64_t> words, bool shape);

  // kFailedPrecondition naming both calls when rank `peer`'s words differ
  // from this rank's ("mismatched collectives: <what>: rank 1 ran ... but
  // this rank (0) ran ...").
  absl::Status Check(const std::string& what, int rank, int peer,
                     absl::Span<const int64_t> theirs) const;
  // The same over every rank's words, `all` holding size() rows of
  // words().size() words (this rank's row included); the lowest differing
  // rank is named.
  absl::Status CheckAll(const std::string& what, int rank, absl::Span<const int64_t> all) const;

 private:
  std::vector<int64_t> words_;
  std::vector<int64_t> receives_;
};

class RecvWork;
struct BackendOptions;  // backend_registry.h

// One op of a batch of point-to-point ops (ProcessGroup::batch_p2p; torch's
// P2POp), in the group's ranks.
struct P2PRequest {
  OpType op = OpType::kSend;  // kSend or kRecv
  Tensor tensor;
  int peer = -1;  // the destination or the source (kAnySource for a kRecv)
  P2POptions options;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, std::string backend, SupportTable support,
               absl::Duration timeout);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend() const { return backend_; }
  const SupportTable& support() const { return support_; }
  // The default timeout of every op (torch's `timeout` argument).
  absl::Duration timeout() const { return timeout_; }

  // Each op returns at once with a Work (or an error for a malformed call);
  // the op runs in the background. Shapes, as in torch.distributed:
  //   Broadcast       tensor: root's data -> every rank's `tensor`
  //   AllReduce       tensor: reduced in place on every rank
  //   Reduce          tensor: the result lands on the root only
  //   AllGather       outputs[i] <- rank i's input (size() outputs)
  //   AllGatherIntoTensor  output = concatenation of inputs along dim 0
  //   Gather          root's outputs[i] <- rank i's input (outputs empty elsewhere)
  //   Scatter         output <- root's inputs[rank] (inputs empty elsewhere)
  //   ReduceScatter   output <- reduction over ranks of inputs[rank]
  //   AllToAll        outputs[i] <- rank i's inputs[rank]
  //   Barrier         returns when every rank has entered
  //   MonitoredBarrier  as Barrier; rank 0's error names the missing ranks
  absl::StatusOr<std::shared_ptr<Work>> broadcast(const Tensor& tensor,
                                                  const BroadcastOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> allreduce(const Tensor& tensor,
                                                  const AllReduceOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> reduce(const Tensor& tensor,
                                               const ReduceOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> allgather(absl::Span<const Tensor> outputs,
                                                  const Tensor& input,
                                                  const AllGatherOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> allgather_into_tensor(const Tensor& output,
                                                              const Tensor& input,
                                                              const AllGatherOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> gather(absl::Span<const Tensor> outputs,
                                               const Tensor& input,
                                               const GatherOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> scatter(const Tensor& output,
                                                absl::Span<const Tensor> inputs,
                                                const ScatterOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> reduce_scatter(const Tensor& output,
                                                       absl::Span<const Tensor> inputs,
                                                       const ReduceScatterOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> alltoall(absl::Span<const Tensor> outputs,
                                                 absl::Span<const Tensor> inputs,
                                                 const AllToAllOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> barrier(const BarrierOptions& options = {});
  absl::StatusOr<std::shared_ptr<Work>> monitored_barrier(
      const MonitoredBarrierOptions& options = {});

  // Point-to-point (torch's isend / irecv). Messages between two ranks with
  // the same tag arrive in the order sent. `src` may be kAnySource.
  absl::StatusOr<std::shared_ptr<Work>> send(const Tensor& tensor, int dst,
                                             const P2POptions& options = {});
  absl::StatusOr<std::shared_ptr<RecvWork>> recv(const Tensor& tensor, int src,
                                                 const P2POptions& options = {});
  // A batch of sends and receives (torch's batch_isend_irecv): every op is
  // checked as send and recv check theirs before any is issued; then they
  // are issued together and one Work per op comes back, in order. Backends
  // that can issue them as one group (nccl: one ncclGroupStart/End, where
  // every op's Work is the batch's) override DoBatchP2P; the default issues
  // them one by one in order through send and recv, which return before
  // the peer has received, so a batch may pair sends and receives in any
  // order on either side.
  absl::StatusOr<std::vector<std::shared_ptr<Work>>> batch_p2p(absl::Span<const P2PRequest> ops);

  // Fails every pending and future op of this group with kAborted and wakes
  // every waiter. Never blocks for long. Backends call OnAbort() first.
  // Note [Failing cleanly] (distributed.cc): a pending op fails at once even
  // when its peer is stopped or dead; the group's connections are shut down
  // then, and its threads, sockets and shared memory are released when it
  // is destroyed, which no longer waits for peers. Idempotent.
  virtual void abort() = 0;
  // destroy_process_group's abort: abort(), with "the process group was
  // destroyed" as the ops' reason and no flight-recorder dump (abort()
  // called first keeps its own reason). Never blocks for long.
  void shutdown();

  // shrink_group's hook (Note [Shrinking groups] in distributed.cc): called
  // on the group being shrunk, on every surviving rank, just before the
  // shrunken group is made with the same backend; `group` is what that
  // backend will be given, `excluded` the group ranks left out (sorted) and
  // `part` as for split_for_new_group. A backend that can make the
  // survivors' communicator from its own without the excluded ranks (nccl:
  // ncclCommShrink) does this rank's part here; `abort_first` is
  // shrink_group's kShrinkAbort. The default does nothing, and the new group
  // meets through the store.
  virtual absl::Status shrink_for_new_group(const BackendOptions& group,
                                            absl::Span<const int> excluded, bool abort_first,
                                            const std::string& part = "") {
    return absl::OkStatus();
  }

  // new_group's hook (Note [Splitting new groups] in distributed.cc): called
  // on the default group on every rank of the job, members of the new group
  // or not, in the same order, just before the new group is made with the
  // same backend; `group` is what that backend will be given (its `rank` is
  // -1 on a non-member), and `part` what a mixed group's backend adds to its
  // store prefix ("cuda/"; empty otherwise). A backend that makes a new
  // group's communicators by splitting its own, collectively (nccl:
  // ncclCommSplit), does this rank's part here. The default does nothing.
  virtual absl::Status split_for_new_group(const BackendOptions& group,
                                           const std::string& part = "") {
    return absl::OkStatus();
  }

  // This group's flight recorder (Note [Flight recorder]); its capacity is
  // TORCH_FR_BUFFER_SIZE (0: off) when the group was created.
  FlightRecorder& flight_recorder() const { return *recorder_; }
  // How much of each collective the ranks compare (Note [Call checks]).
  CallCheckLevel call_check_level() const { return call_check_; }

 protected:
  // Called only with validated arguments (Note [ProcessGroup layers]).
  virtual absl::StatusOr<std::shared_ptr<Work>> DoBroadcast(const Tensor& tensor,
                                                            const BroadcastOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoAllReduce(const Tensor& tensor,
                                                            const AllReduceOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoReduce(const Tensor& tensor,
                                                         const ReduceOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoAllGather(absl::Span<const Tensor> outputs,
                                                            const Tensor& input,
                                                            const AllGatherOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoAllGatherIntoTensor(
      const Tensor& output, const Tensor& input, const AllGatherOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoGather(absl::Span<const Tensor> outputs,
                                                         const Tensor& input,
                                                         const GatherOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoScatter(const Tensor& output,
                                                          absl::Span<const Tensor> inputs,
                                                          const ScatterOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoReduceScatter(
      const Tensor& output, absl::Span<const Tensor> inputs,
      const ReduceScatterOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoAllToAll(absl::Span<const Tensor> outputs,
                                                           absl::Span<const Tensor> inputs,
                                                           const AllToAllOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoBarrier(const BarrierOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoMonitoredBarrier(
      const MonitoredBarrierOptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<Work>> DoSend(const Tensor& tensor, int dst,
                                                       const P2POptions& options) = 0;
  virtual absl::StatusOr<std::shared_ptr<RecvWork>> DoRecv(const Tensor& tensor, int src,
                                                           const P2POptions& options) = 0;
  // `ops` are checked and not empty. The default: send / recv, in order.
  virtual absl::StatusOr<std::vector<std::shared_ptr<Work>>> DoBatchP2P(
      absl::Span<const P2PRequest> ops);

  // Note [Call checks]: for a backend's Do* (on the calling thread): the
  // fingerprint of the collective being issued, which the backend compares
  // with its peers' before the op's data can do harm (CheckAll); null for
  // p2p ops, when the check is off, or when DETAIL has already compared it
  // through the store.
  static const CallFingerprint* IssuingCall();
  // The deadline of an op that starts now.
  absl::Time DeadlineFor(const std::optional<absl::Duration>& timeout) const;
  // Backends call this at the start of abort(): dumps the flight recorders
  // (Note [Flight recorder dumps]).
  void OnAbort();
  // What an aborted op's kAborted says: "the process group was aborted", or
  // "the process group was destroyed" after shutdown().
  std::string AbortReason() const;
  // Whether the abort comes from shutdown() (destroy_process_group).
  bool shutting_down() const { return shut_down_.load(); }
  // Backends with a store call this once: the group publishes its progress
  // under `prefix` and timeouts name the ranks that are behind (Note
  // [Desync reports]); TORCH_DISTRIBUTED_DEBUG=DETAIL's checks use the same
  // store.
  void PublishProgress(std::shared_ptr<Store> store, const std::string& prefix);

 private:
  absl::Status CheckSupported(OpType op, DeviceType device) const;
  absl::Status CheckTensor(OpType op, const Tensor& tensor, const std::string& what) const;
  absl::Status CheckRank(OpType op, int rank, const std::string& what) const;
  absl::Status CheckList(OpType op, absl::Span<const Tensor> list, const std::string& what,
                         const Tensor& like, bool same_numel) const;
  absl::Status CheckReduceOp(OpType op, ReduceOp reduce, Dtype dtype) const;
  // Records an accepted op in the flight recorder and hands the entry to its
  // Work; passes `work` through.
  template <typename W>
  absl::StatusOr<std::shared_ptr<W>> Recorded(absl::StatusOr<std::shared_ptr<W>> work,
                                              const FlightOp& op, int64_t created_ns);
  // The call check (Note [Call checks]) of a collective: compares `call`
  // through the store at DETAIL, or makes it the IssuingCall() of `run` (the
  // Do* call) for the backend to compare; then runs `run`.
  template <typename F>
  auto Checked(const CallFingerprint& call, const FlightOp& op, F run) -> decltype(run());
  // A fingerprint of this group's level.
  CallFingerprint Fingerprint(OpType op, const Tensor* like, int64_t nbytes, int root,
                              std::optional<ReduceOp> reduce = std::nullopt) const;
  // The clock reading for an op's "scheduled" time; 0 when recording is off.
  int64_t RecordClock() const;

  const int rank_;
  const int size_;
  const std::string backend_;
  const SupportTable support_;
  const absl::Duration timeout_;
  const std::shared_ptr<FlightRecorder> recorder_;
  std::shared_ptr<ProgressPublisher> publisher_;  // set once, by the backend's constructor
  const CallCheckLevel call_check_;
  std::shared_ptr<Store> debug_store_;  // set with publisher_
  std::string debug_prefix_;
  std::atomic<int64_t> fingerprint_seq_{0};
  std::atomic<bool> aborted_once_{false};
  std::atomic<bool> shut_down_{false};  // shutdown() came before any abort()
};

// A receive's Work: also tells which rank the message came from (useful
// with kAnySource).
class RecvWork : public Work {
 public:
  using Work::Work;
  // The sender's rank once completed; -1 before.
  int source() const { return source_.load(); }
  void set_source(int rank) { source_.store(rank); }

 private:
  std::atomic<int> source_{-1};
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_PROCESS_GROUP_H_
