// NcclProcessGroup: the "nccl" backend: ProcessGroup's ops on CUDA tensors
// through NVIDIA's NCCL (from the CUDA toolkit), as PyTorch's
// ProcessGroupNCCL.
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   // One process per GPU, e.g. started by `launch --nproc_per_node=8`:
//   EMBER_RETURN_IF_ERROR(ember::cuda::set_device(local_rank));
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "nccl"}));
//   ember::Tensor t = ember::ones(
//       {1024}, ember::TensorOptions().device(ember::Device(ember::DeviceType::kCUDA, local_rank)));
//   EMBER_ASSIGN_OR_RETURN(auto work, ember::distributed::all_reduce_async(t));
//   EMBER_RETURN_IF_ERROR(work->wait());  // the current stream waits; the host does not
//   ```
//
// Communicators (Note [NCCL communicators] in process_group_nccl.cc): made
// lazily, on a group's first op on a device, from a ncclUniqueId that the
// communicator's first rank publishes in the group's store under
// "<group prefix><n>" (n counts the group's communicators, as PyTorch's
// ncclCommCounter_). Collectives use one communicator per device (or per
// device list, for the multi-GPU ops); a send or receive uses a
// communicator of just the two ranks, made on their first exchange, as
// PyTorch does, so that ranks not taking part never have to join anything.
// Each rank of a communicator must be on a distinct GPU: NCCL refuses two
// ranks on one device (use gloo with CUDA tensors for that).
//
// Streams: each device has one communication stream (from the device's
// pool, high priority when NcclOptions::is_high_priority_stream). An op
// first makes that stream wait for the caller's current stream, so it sees
// every write queued before the call; its tensors are recorded on the
// communication stream with the caching allocator (Tensor::record_stream),
// so their memory is not reused until the op is done. Work::synchronize()
// and, unless TORCH_NCCL_BLOCKING_WAIT=1, Work::wait() make the caller's
// current stream wait for the op's end event without blocking the host, as
// PyTorch's WorkNCCL; with TORCH_NCCL_BLOCKING_WAIT=1, wait() blocks until
// the op has finished on the GPU and reports its error or timeout.
//
// Ops: broadcast, all_reduce, reduce (SUM, PRODUCT, MIN, MAX, AVG through
// ncclAvg; on bool "or" and "and"), all_gather, all_gather_into_tensor,
// reduce_scatter, all_to_all (equal and uneven splits), gather and scatter
// (grouped sends and receives, as PyTorch builds them), send and recv (not
// from any source: NCCL needs the peer), barrier (an all_reduce of one
// element on the group's device, after which the host waits), every dtype
// NCCL has; int16, which NCCL lacks, moves as bytes where nothing is
// reduced and is refused by the reductions. monitored_barrier is gloo's
// only. The multi-GPU ops of older torch.distributed (one tensor per local
// GPU: broadcast_multigpu, all_reduce_multigpu, reduce_multigpu,
// all_gather_multigpu) are methods here.
//
// Errors, timeouts and hangs (Note [NCCL watchdog]): a watchdog thread per
// group polls every op in flight. When an op's deadline passes (the group's
// timeout: 10 minutes by default for nccl, as PyTorch's
// default_pg_nccl_timeout) or NCCL reports an asynchronous error, the op
// fails with an error naming the group, the op, its sequence number, its
// sizes and the timeout, and TORCH_NCCL_ASYNC_ERROR_HANDLING decides what
// else happens, as in PyTorch: 0 nothing more; 1 abort the group's
// communicators, fail every op in flight, and end the process; 2 abort and
// fail only; 3 (the default) end the process without aborting.
//
// Environment: TORCH_NCCL_ASYNC_ERROR_HANDLING, TORCH_NCCL_BLOCKING_WAIT
// (and their older NCCL_ASYNC_ERROR_HANDLING / NCCL_BLOCKING_WAIT names);
// NCCL's own NCCL_* variables (NCCL_DEBUG, NCCL_SOCKET_IFNAME, NCCL_IB_*,
// ...) reach NCCL untouched, which reads them itself.
//
// Thread-safety: as ProcessGroup.
#ifndef EMBER_DISTRIBUTED_NCCL_PROCESS_GROUP_NCCL_H_
#define EMBER_DISTRIBUTED_NCCL_PROCESS_GROUP_NCCL_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "distributed/backend_registry.h"
#include "distributed/nccl/communicator.h"
#include "distributed/process_group.h"

namespace ember::distributed::nccl {

// The nccl row of the backend support table: every op but monitored_barrier
// on CUDA tensors; barrier (which has no tensor) is listed under CPU.
SupportTable NcclSupportTable();

// PyTorch's default timeout for nccl groups (default_pg_nccl_timeout).
inline constexpr absl::Duration kDefaultNcclTimeout = absl::Minutes(10);

// TORCH_NCCL_ASYNC_ERROR_HANDLING's values (PyTorch's ErrorHandlingMode).
enum class AsyncErrorHandling : int {
  kNoHandling = 0,
  kTearDown = 1,     // abort the communicators, then end the process
  kCleanUpOnly = 2,  // abort the communicators, keep the process
  kSkipCleanUp = 3,  // end the process without aborting
};

// What the environment says, read once per group.
struct NcclEnvironment {
  AsyncErrorHandling async_error_handling = AsyncErrorHandling::kSkipCleanUp;
  bool blocking_wait = false;
};
// Parses TORCH_NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_BLOCKING_WAIT (the
// older NCCL_ names when the TORCH_ ones are unset). kInvalidArgument names
// the variable and its value when it is not one of the documented ones.
absl::StatusOr<NcclEnvironment> read_nccl_environment();

// The nccl backend's pg_options (torch's ProcessGroupNCCL.Options).
struct NcclOptions : BackendSpecificOptions {
  std::string_view backend() const override { return "nccl"; }
  // Communication streams from the high-priority pool.
  bool is_high_priority_stream = false;
  // ncclConfig_t fields (torch's Options.config).
  CommConfig config;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  // Checks that CUDA is usable (kFailedPrecondition with the reason when
  // not) and reads the environment; connects nothing yet (communicators are
  // made on first use).
  static absl::StatusOr<std::shared_ptr<NcclProcessGroup>> create(const BackendOptions& options);
  // Waits (bounded) for the ops in flight, then destroys the communicators.
  ~NcclProcessGroup() override;

  // Aborts every communicator and fails every op in flight with kAborted.
  void abort() override;
  // new_group's turn on the default group (Note [NCCL split groups] in
  // process_group_nccl.cc): splits the group's first collective communicator
  // with ncclCommSplit, non-members included, and keeps a member's part for
  // the new group; nothing when there is no communicator yet or NCCL is
  // older than 2.18 (the new group then makes its own through the store).
  absl::Status split_for_new_group(const BackendOptions& group,
                                   const std::string& part) override;
  // shrink_group's hook (Note [NCCL shrunken groups]): shrinks this group's
  // first single-device communicator with ncclCommShrink (NCCL 2.27+) for the
  // shrunken group, which takes it as the split ones; nothing when there is
  // no communicator yet or NCCL is older (the new group then makes its own
  // through the store, without the excluded ranks).
  absl::Status shrink_for_new_group(const BackendOptions& group, absl::Span<const int> excluded,
                                    bool abort_first, const std::string& part) override;

  // The multi-GPU ops (torch.distributed's deprecated *_multigpu): one tensor
  // per local GPU, each on a different device, the same list shape on every
  // rank. The communicator spans size() * tensors.size() NCCL ranks.
  absl::StatusOr<std::shared_ptr<Work>> broadcast_multigpu(absl::Span<const Tensor> tensors,
                                                           int src_rank, int src_tensor = 0);
  absl::StatusOr<std::shared_ptr<Work>> all_reduce_multigpu(absl::Span<const Tensor> tensors,
                                                            ReduceOp op = ReduceOp::kSum);
  absl::StatusOr<std::shared_ptr<Work>> reduce_multigpu(absl::Span<const Tensor> tensors,
                                                        int dst_rank, ReduceOp op = ReduceOp::kSum,
                                                        int dst_tensor = 0);
  // outputs[i] holds size() * tensors.size() tensors for device i.
  absl::StatusOr<std::shared_ptr<Work>> all_gather_multigpu(
      absl::Span<const std::vector<Tensor>> outputs, absl::Span<const Tensor> inputs);

  const NcclEnvironment& environment() const { return env_; }
  // The group's name in messages: its store prefix ("default_pg/", "1/").
  const std::string& group_name() const { return prefix_; }

 protected:
  absl::StatusOr<std::shared_ptr<Work>> DoBroadcast(const Tensor& tensor,
                                                    const BroadcastOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduce(const Tensor& tensor,
                                                    const AllReduceOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoReduce(const Tensor& tensor,
                                                 const ReduceOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllGather(absl::Span<const Tensor> outputs,
                                                    const Tensor& input,
                                                    const AllGatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllGatherIntoTensor(
      const Tensor& output, const Tensor& input, const AllGatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoGather(absl::Span<const Tensor> outputs,
                                                 const Tensor& input,
                                                 const GatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoScatter(const Tensor& output,
                                                  absl::Span<const Tensor> inputs,
                                                  const ScatterOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoReduceScatter(
      const Tensor& output, absl::Span<const Tensor> inputs,
      const ReduceScatterOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllToAll(absl::Span<const Tensor> outputs,
                                                   absl::Span<const Tensor> inputs,
                                                   const AllToAllOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoBarrier(const BarrierOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoMonitoredBarrier(
      const MonitoredBarrierOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoSend(const Tensor& tensor, int dst,
                                               const P2POptions& options) override;
  absl::StatusOr<std::shared_ptr<RecvWork>> DoRecv(const Tensor& tensor, int src,
                                                   const P2POptions& options) override;
  // One NCCL group call on the group's communicator for every op of the
  // batch (torch's coalesced batch_isend_irecv).
  absl::StatusOr<std::vector<std::shared_ptr<Work>>> DoBatchP2P(
      absl::Span<const P2PRequest> ops) override;

 private:
  class NcclWork;
  // The communicators of one key (a device, a device list, or a peer pair),
  // with the communication stream of each device.
  struct CommSet;
  // What an op does on each communicator of its set, between the stream
  // sync and the end event; runs with the device current, inside one NCCL
  // group call.
  using Issue = std::function<absl::Status(size_t index, ncclComm_t comm, cudaStream_t stream)>;
  struct Launch {
    OpType op;
    std::string what;                // "all_reduce (4096 float32)"
    std::optional<absl::Duration> timeout;
    std::vector<Tensor> tensors;     // recorded on the streams, kept until done
    std::vector<Tensor> result;      // Work::result()
    // Run on communicator i's stream, with its device current.
    std::function<void(size_t i)> before;  // copy-in
    Issue issue;
    std::function<void(size_t i)> after;   // copy-out
  };

  NcclProcessGroup(const BackendOptions& options, NcclEnvironment env, NcclOptions nccl_options);
  // Makes `comm`, split for this group from the default group's, the
  // group's communicator for its device.
  absl::Status AdoptSplit(std::unique_ptr<NcclComm> comm);

  // The communicators for collectives on `devices` (one per device), made
  // on first use.
  absl::StatusOr<std::shared_ptr<CommSet>> CollectiveComms(const std::vector<int>& devices);
  // The two-rank communicator with `peer` on `device`, made on first use.
  absl::StatusOr<std::shared_ptr<CommSet>> PeerComm(int peer, int device);
  absl::StatusOr<std::shared_ptr<NcclWork>> Run(const std::shared_ptr<CommSet>& comms,
                                                Launch launch);
  absl::StatusOr<std::shared_ptr<Work>> Collective(const Tensor& on, Launch launch);
  // The device the group's barrier runs on: the last device an op used,
  // else rank % device_count(), as PyTorch guesses it.
  int BarrierDevice();
  void WatchdogLoop();
  // Fails `work` with `status`, then does what TORCH_NCCL_ASYNC_ERROR_HANDLING
  // says; where that is an abort (1 or 2), the group is marked aborted before
  // `work` fails.
  void HandleFailure(const std::shared_ptr<NcclWork>& work, absl::Status status);
  // Refuses later ops with kAborted naming `cause` (the first cause wins).
  void MarkAborted(const absl::Status& cause);
  // MarkAborted, then aborts every communicator and fails every op in flight.
  void AbortAll(const absl::Status& cause);

  const std::shared_ptr<Store> store_;
  const std::string prefix_;
  const NcclEnvironment env_;
  const NcclOptions nccl_options_;

  absl::Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t comm_counter_ ABSL_GUARDED_BY(mu_) = 0;
  int last_device_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<std::string, std::shared_ptr<CommSet>> comms_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<NcclWork>> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

}  // namespace ember::distributed::nccl

#endif  // EMBER_DISTRIBUTED_NCCL_PROCESS_GROUP_NCCL_H_
