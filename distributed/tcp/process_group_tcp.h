// TcpProcessGroup: Ember's zero-dependency backend ("tcp"): every op of
// ProcessGroup on CPU tensors, for any world size, over shared memory between
// ranks on one host and TCP sockets between hosts.
//
//   ```cpp
//   #include "distributed/hash_store.h"
//   #include "distributed/tcp/process_group_tcp.h"
//   #include "tensor/factories.h"
//   namespace dist = ember::distributed;
//   auto store = std::make_shared<dist::HashStore>();  // a TcpStore for several processes
//   int r = 0, n = 1;                                  // this rank, the group's size
//   dist::BackendOptions options{.store = store, .store_prefix = "job7/", .rank = r, .size = n,
//                                .timeout = absl::Seconds(30)};
//   EMBER_ASSIGN_OR_RETURN(auto pg, dist::tcp::TcpProcessGroup::create(options));
//   ember::Tensor t = ember::ones({4});
//   EMBER_ASSIGN_OR_RETURN(auto work, pg->allreduce(t));
//   EMBER_RETURN_IF_ERROR(work->wait());
//   ```
//
// Setup: each rank publishes "host key|address|port|pid" in the store, reads
// everyone's, then builds one Channel per peer: a ShmChannel when both share
// a host (same boot id, hostname, pid and network namespace) and
// `shared_memory` is on, else a TCP connection (the higher rank connects).
// Create blocks until every peer is connected or `timeout` passes.
//
// Execution: ops run in call order on one worker thread per group; a
// receive (Recv / irecv) is posted at once and completes on a reader
// thread. Algorithms (Note [tcp algorithms] in algorithms.h): large
// all_reduce in shared staging segments when the whole group shares a host
// (ShmArena), else ring reduce-scatter + all-gather, as for reduce; direct
// exchange for the others. Every reduction happens once per element in a fixed order, so
// all ranks get the same bits.
//
// Environment: EMBER_TCP_SHM=0 forces sockets between ranks on one host;
// EMBER_TCP_DIRECT=0 keeps large messages in the rings;
// EMBER_TCP_ARENA=0 runs large all_reduce as a ring even when every rank is
// on this host;
// EMBER_TCP_RING_BYTES sets the shared-memory ring size;
// EMBER_SOCKET_IFNAME / GLOO_SOCKET_IFNAME pick the interface to publish.
//
// Thread-safety: as ProcessGroup.
#ifndef EMBER_DISTRIBUTED_TCP_PROCESS_GROUP_TCP_H_
#define EMBER_DISTRIBUTED_TCP_PROCESS_GROUP_TCP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "distributed/backend_registry.h"
#include "distributed/op_queue.h"
#include "distributed/process_group.h"
#include "distributed/tcp/algorithms.h"
#include "distributed/tcp/mesh.h"
#include "distributed/tcp/shm_arena.h"

namespace ember::distributed::tcp {

// The tcp backend's pg_options (InitOptions::pg_options).
struct TcpOptions : BackendSpecificOptions {
  std::string_view backend() const override { return "tcp"; }
  // Shared memory between ranks on one host (EMBER_TCP_SHM=0 turns it off).
  bool shared_memory = true;
  // Large messages between processes on one host are read straight from
  // the sender's memory when the kernel allows it (EMBER_TCP_DIRECT=0 turns
  // it off; Note [Direct reads] in mesh.h).
  bool direct_reads = true;
  // all_reduce through per-rank staging segments when every rank of the
  // group is on this host (EMBER_TCP_ARENA=0 turns it off; Note
  // [Shared-memory all_reduce] in shm_arena.h).
  bool arena = true;
  // Bytes per direction of each shared-memory ring (EMBER_TCP_RING_BYTES).
  size_t ring_bytes = size_t{2} << 20;
  // The defaults, overridden by the environment variables above.
  static TcpOptions FromEnv();
};

// The tcp row of the backend support table: every op, CPU tensors only.
SupportTable TcpSupportTable();

class TcpProcessGroup : public ProcessGroup {
 public:
  static absl::StatusOr<std::shared_ptr<TcpProcessGroup>> create(
      const BackendOptions& options, const TcpOptions& tcp = TcpOptions::FromEnv());
  ~TcpProcessGroup() override;

  void abort() override;
  // How bytes reach `peer`: "shared memory" or "tcp <address>".
  std::string TransportTo(int peer) const;
  // How an all_reduce of `nbytes` would run now: "none" (a group of one),
  // "direct" (small: one hop), "arena" (ShmArena) or "ring".
  std::string AllReduceAlgorithm(size_t nbytes) const;

  using OpContext = ::ember::distributed::tcp::OpContext;

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
  using Job = std::function<absl::Status(const OpContext&)>;
  // A queued op as its job sees it (its Work is the queue's).
  struct Queued {
    OpContext context;
    Job job;
    // The call check's fingerprint (Note [Call checks] in process_group.cc).
    std::optional<CallFingerprint> check;
  };

  TcpProcessGroup(const BackendOptions& options, std::shared_ptr<Mesh> mesh,
                  std::unique_ptr<ShmArena> arena, std::vector<std::string> transports);
  // Queues `job`; a collective takes the next sequence number.
  std::shared_ptr<Work> Enqueue(OpType op, const std::optional<absl::Duration>& timeout,
                                bool collective, Job job);
  // The queue's admission (Note [Op queues]): after abort(), every op still
  // queued, or queued later, fails in its turn with abort's status.
  absl::Status Admit();
  // On the worker: RunChecked; a collective that failed then tells every
  // peer (Mesh::Poison), so that their receives for it fail at once.
  absl::Status Run(const Queued& item);
  // Runs `item`'s job; with a call check, first sends its words to every
  // peer ahead of the collective's messages and compares theirs before
  // returning (Note [Call checks] in process_group.cc).
  absl::Status RunChecked(const Queued& item);
  enum class AllReduceKind { kNone, kDirect, kArena, kRing };
  // The one place that picks an all_reduce algorithm (AllReduceAlgorithm
  // names its choice).
  AllReduceKind ChooseAllReduce(size_t nbytes) const;
  // How the arena reports failures and names peers for the op `ctx`.
  ShmArena::Op ArenaOp(const OpContext& ctx) const;

  std::shared_ptr<Mesh> mesh_;
  // Null unless every rank is on this host (TcpOptions::arena).
  const std::unique_ptr<ShmArena> arena_;
  const std::vector<std::string> transports_;
  // Held while an op is numbered and queued, so numbers follow the queue's
  // order.
  absl::Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // Every op, in call order on one worker (Note [Op queues]).
  OpQueue queue_;
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_PROCESS_GROUP_TCP_H_
