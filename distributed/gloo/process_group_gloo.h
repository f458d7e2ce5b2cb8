// GlooProcessGroup: the "gloo" backend: every op of ProcessGroup on CPU
// tensors through Facebook's gloo library (Debian's libgloo, tcp transport),
// as PyTorch's ProcessGroupGloo; and on CUDA tensors through pinned host
// memory, ordered on the tensors' stream (Note [gloo on device tensors] in
// staging.cc), which also lets several ranks share one GPU.
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "gloo"}));
//   ```
//
// Rendezvous: gloo's full mesh is connected through the group's Ember Store
// (GlooStore in store_adapter.h), with the group's timeout. Network: as
// PyTorch, GLOO_SOCKET_IFNAME, else the address the host name resolves to,
// else loopback (device.h).
//
// Ops: broadcast, all_reduce and reduce (SUM, PRODUCT, MIN, MAX; on bool "or"
// and "and"), all_gather, all_gather_into_tensor, gather, scatter, all_to_all
// (uneven sizes through gloo's alltoallv), barrier, send and recv (with tags
// and from any source) are gloo's own algorithms, except that where every
// rank is Ember all_gather and reduce_scatter are rings of Ember's over
// gloo's point-to-point buffers, with fewer messages (Note [Rings over
// gloo's buffers]); in a group with PyTorch ranks all_gather is gloo's and
// reduce_scatter an all_reduce of the concatenated inputs of which each rank
// keeps its part, as PyTorch does. monitored_barrier uses gloo's
// point-to-point buffers, as PyTorch does. Every dtype Ember has. ReduceOp::kAvg is refused with
// kUnimplemented, as PyTorch refuses it for gloo ("use SUM and divide").
//
// CUDA tensors: every op but the barriers, which carry none. At the call
// the tensors are copied to pinned host memory on the device's current
// stream; the worker waits for those copies, runs gloo on the host, and
// queues the copies back on the same stream. The Work finishes once they are
// queued, and wait() makes the waiting thread's current stream wait for them
// without blocking the host, as the nccl backend's wait(). A send of a CUDA
// tensor waits at the call until its copy to the host is done. An op's CUDA
// tensors must all be on one device.
//
// Execution: collectives run in call order on one worker thread per group,
// each with its own gloo tag (the collective's sequence number); a send or
// receive is posted at once and completes on a thread of its own. gloo's
// results are deterministic for a given world size, so every rank gets the
// same bits.
//
// Environment: GLOO_SOCKET_IFNAME and EMBER_GLOO_BATCH_NETWORK_THREAD
// (device.h); EMBER_GLOO_CHECK_COLLECTIVES=0
// skips comparing the ranks' calls before each collective (then ranks that
// pass different sizes crash inside gloo, as in PyTorch).
//
// Errors: gloo throws; its exceptions never leave this backend (Note [gloo
// exceptions] in process_group_gloo.cc). A failed op's Work has
// kDeadlineExceeded (its timeout), kUnavailable (a peer died or hung up),
// kFailedPrecondition (gloo refused the call, e.g. mismatched sizes) or
// kAborted, and the message names the op and the ranks at fault when they
// can be found.
//
// Thread-safety: as ProcessGroup.
#ifndef EMBER_DISTRIBUTED_GLOO_PROCESS_GROUP_GLOO_H_
#define EMBER_DISTRIBUTED_GLOO_PROCESS_GROUP_GLOO_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "distributed/backend_registry.h"
#include "distributed/op_queue.h"
#include "distributed/process_group.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace ember::distributed::gloo {

class DeviceStaging;  // staging.h

// The gloo row of the backend support table: every op on CPU tensors, and
// every op with tensors on CUDA tensors.
SupportTable GlooSupportTable();

// The gloo backend's pg_options (torch's ProcessGroupGloo.Options).
struct GlooOptions : BackendSpecificOptions {
  std::string_view backend() const override { return "gloo"; }
  // The network interface gloo's transport binds (as GLOO_SOCKET_IFNAME, which
  // it overrides); empty: GLOO_SOCKET_IFNAME, else the host name's address,
  // else loopback (device.h).
  std::string interface;
};

class GlooProcessGroup : public ProcessGroup {
 public:
  // Connects to every rank of the group; blocks until all are connected or
  // the options' timeout passes.
  static absl::StatusOr<std::shared_ptr<GlooProcessGroup>> create(const BackendOptions& options);
  // Fails what is still queued with kAborted and waits for the op running
  // now (at most its timeout; after abort() or shutdown(), not at all).
  ~GlooProcessGroup() override;

  // Also closes the context's pairs, which pulls the running collective out
  // of gloo at once, even when a peer is stopped (Note [Aborting gloo]).
  void abort() override;
  // Which address gloo uses, e.g. "hostname node7" (device.h).
  const std::string& device_description() const { return device_description_; }

  struct OpContext {
    OpType op;
    int64_t seq;   // the collective's sequence number
    uint32_t tag;  // gloo's tag for the op (CheckCall uses tag - 1)
    absl::Time deadline;
    std::string what;  // "all_reduce (collective #3)"
  };

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

 private:
  // A job may throw gloo's exceptions; the worker translates them.
  using Job = std::function<absl::Status(const OpContext&)>;
  // What a rank passed to a collective, compared across ranks before it runs
  // (Note [gloo exceptions]).
  struct Call {
    Dtype dtype = Dtype::kFloat32;
    size_t nbytes = 0;
    int root = -1;
    ReduceOp reduce = ReduceOp::kSum;
    std::vector<int64_t> sends;     // all_to_all: elements to each rank
    std::vector<int64_t> receives;  // all_to_all: elements from each rank
  };
  // Where each rank runs, for naming peers in errors.
  struct Peer {
    bool ember = true;  // false: the rank wrote no Ember record (a PyTorch process)
    bool same_host = false;
    int pid = 0;
    std::string host;
  };
  // A posted send or receive and the thread that waits for it.
  struct PendingP2P {
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
    std::thread waiter;
    bool done = false;  // guarded by p2p_mu_
  };

  GlooProcessGroup(const BackendOptions& options, std::shared_ptr<::gloo::Context> context,
                   std::string device_description, std::vector<Peer> peers);
  // Queues `job`; `call`, when given, is checked against the other ranks'
  // first. With an active `stage` the job waits for its copies in first and
  // queues its copies back after, and the Work's wait() orders the waiter's
  // stream after them (Note [gloo on device tensors]).
  std::shared_ptr<Work> Enqueue(OpType op, const std::optional<absl::Duration>& timeout,
                                std::optional<Call> call, Job job,
                                std::shared_ptr<DeviceStaging> stage = nullptr);
  // On the worker: runs `job`, turning what gloo throws into its status.
  absl::Status RunJob(const OpContext& ctx, const Job& job);
  // The status of a job that threw `what` (Note [gloo exceptions]).
  absl::Status Translate(const OpContext& ctx, const std::string& what, bool io_error);
  // "rank 2 (pid 4711 on this host, stopped)".
  std::string DescribePeer(int rank) const;
  // After a collective failed: the ranks that did not report failing it
  // too within a short grace (so probably never reached it).
  std::vector<int> RanksThatDidNotFail(const OpContext& ctx);
  // Starts a send or receive on `buffer` and its waiter thread.
  void StartP2P(std::unique_ptr<::gloo::transport::UnboundBuffer> buffer,
                std::function<void(::gloo::transport::UnboundBuffer&)> wait);
  void ReapP2P() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p2p_mu_);
  // Note [Aborting gloo]: fails every pair of the context with `reason`,
  // once.
  void ClosePairs(const std::string& reason) ABSL_LOCKS_EXCLUDED(close_mu_);
  // A failed send or receive of an aborted group fails with the abort's
  // status (the closed pair's error is its echo); `status` otherwise.
  absl::Status AbortedOr(absl::Status status, const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the group is aborted or being destroyed.
  bool Ending() ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<Store> store_;
  const std::string prefix_;
  const std::shared_ptr<::gloo::Context> context_;
  // Every rank is Ember, so the call check can run.
  const bool check_calls_;
  const std::string device_description_;
  const std::vector<Peer> peers_;

  // Held while an op is numbered and queued (so numbers follow the queue's
  // order) and while abort() fails what is queued.
  absl::Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // The collectives, in call order on one worker (Note [Op queues]).
  OpQueue queue_;

  absl::Mutex p2p_mu_;
  std::vector<std::unique_ptr<PendingP2P>> p2p_ ABSL_GUARDED_BY(p2p_mu_);

  absl::Mutex close_mu_;
  bool pairs_closed_ ABSL_GUARDED_BY(close_mu_) = false;
};

}  // namespace ember::distributed::gloo

#endif  // EMBER_DISTRIBUTED_GLOO_PROCESS_GROUP_GLOO_H_
