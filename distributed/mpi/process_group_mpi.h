// MpiProcessGroup: the "mpi" backend: ProcessGroup's ops on CPU tensors
// through MPI (Debian's Open MPI), as PyTorch's ProcessGroupMPI.
//
//   // Every process, started by `mpirun -np 4 prog` (no init_method, rank or
//   // world_size: they come from MPI_COMM_WORLD):
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "mpi"}));
//   EMBER_ASSIGN_OR_RETURN(auto pair, ember::distributed::new_group({0, 1}));
//
// Groups: the default group is a duplicate of MPI_COMM_WORLD; new_group
// over a subset is a sub-communicator of its members (MPI_Comm_create_group,
// which only the members call), so the default group's ranks must be
// MPI_COMM_WORLD's. Creating a group blocks until every member creates it
// (MPI has no timeout for that).
//
// Store: a group created without one (init_process_group, new_group) makes
// its own for the layer above's desync reports and TORCH_DISTRIBUTED_DEBUG=
// DETAIL call check: a TcpStore at MASTER_ADDR:MASTER_PORT for the default
// group when both are set, else one served by the group's rank 0 whose
// address travels by MPI_Bcast (Note [mpi's store] in process_group_mpi.cc);
// EMBER_MPI_STORE=0 goes without.
//
// Ops: broadcast, all_reduce and reduce (SUM, PRODUCT, MIN, MAX; on bool
// "or" and "and"), all_gather, all_gather_into_tensor, gather, scatter,
// reduce_scatter (MPI_Reduce_scatter_block), all_to_all (MPI_Alltoallv, so
// uneven sizes too), barrier, monitored_barrier (which PyTorch's mpi
// backend lacks: Note [MPI monitored barriers] in process_group_mpi.cc),
// send and recv (tags in [0, MPI_TAG_UB], any source) for every dtype Ember
// has: float16 and bfloat16 travel as 2-byte types of Ember's own and reduce
// in float (runtime.h). ReduceOp::kAvg is refused with kUnimplemented, as in
// PyTorch's mpi backend. At most 2^31-1 elements per rank and op (MPI's int
// counts).
//
// Execution: collectives run in call order on one worker thread per group,
// each a blocking MPI call made under the process-wide MPI lock (Note [MPI
// threads] in runtime.h). Sends and receives are posted at once
// (MPI_Isend / MPI_Irecv) and completed by the worker, which tests them
// between collectives. While a collective runs, the process's other MPI
// calls wait for it, as in PyTorch: post the sends a peer needs before a
// collective that peer waits on.
//
// Timeouts (Note [MPI timeouts] in process_group_mpi.cc): MPI has none for
// collectives and cannot cancel one. Work::wait returns kDeadlineExceeded at
// the timeout instead of hanging, but the collective goes on running and the
// group's later ops queue behind it; a collective is never skipped, even past
// its deadline, so the ranks stay in step. A receive is cancelled at its
// deadline. abort() fails every queued, running and pending op with kAborted
// at once and cancels the pending receives; it does not call MPI_Abort (as
// PyTorch's does) so that a job with nothing stuck inside MPI can go on.
// Destroying a group while one of its collectives is still inside MPI (after
// abort(), or past that op's deadline) calls MPI_Abort, ending the job, since
// that rank could neither finish nor finalize MPI.
//
// Errors: an MPI error is the Work's status, naming the op and the MPI
// function with MPI's text (runtime.h MpiStatus). MPI does not check that
// ranks pass matching sizes to a collective; mismatches are undefined, as in
// PyTorch's mpi backend.
//
// Thread-safety: as ProcessGroup.
#ifndef EMBER_DISTRIBUTED_MPI_PROCESS_GROUP_MPI_H_
#define EMBER_DISTRIBUTED_MPI_PROCESS_GROUP_MPI_H_

#include <mpi.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "distributed/backend_registry.h"
#include "distributed/op_queue.h"
#include "distributed/process_group.h"

namespace ember::distributed::mpi {

// The mpi row of the backend support table: every op but monitored_barrier,
// CPU tensors only.
SupportTable MpiSupportTable();

// The backend's world_from_launcher (backend_registry.h): starts MPI and
// returns this process's place in MPI_COMM_WORLD, checking a rank or
// world_size given to init_process_group against it.
absl::StatusOr<LauncherWorld> MpiWorldFromLauncher(int rank, int world_size);

class MpiProcessGroup : public ProcessGroup {
 public:
  // Starts MPI if needed and builds the group's communicator: a duplicate
  // of MPI_COMM_WORLD, or of `options.ranks` (global ranks) when they are a
  // subset. kInvalidArgument when the options' rank and size disagree with
  // MPI_COMM_WORLD, naming both. Blocks until every member has joined.
  static absl::StatusOr<std::shared_ptr<MpiProcessGroup>> create(const BackendOptions& options);
  // Fails what is still queued with kAborted and waits for the collective
  // running now (until its deadline; see the header comment for MPI_Abort).
  ~MpiProcessGroup() override;

  void abort() override;
  // The group's communicator (for benchmarks that call MPI beside it).
  MPI_Comm comm() const { return comm_; }

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
  // Runs on the worker; `what` names the op ("all_reduce (collective #3)").
  using Job = std::function<absl::Status(const std::string& what)>;
  // A posted send or receive, completed by the worker.
  struct PendingP2P {
    MPI_Request request = MPI_REQUEST_NULL;
    std::shared_ptr<Work> work;
    std::shared_ptr<RecvWork> recv;  // receives only
    Tensor user;                     // the caller's tensor (receives: copied back into)
    Tensor staging;                  // what MPI reads or writes
    int64_t count = 0;
    std::string what;
  };
  // A posted request that finished, to complete outside the MPI lock.
  struct Completion {
    std::shared_ptr<PendingP2P> p2p;
    absl::Status status;
    int source = -1;
  };

  MpiProcessGroup(const BackendOptions& options, MPI_Comm comm, MPI_Comm barrier_comm,
                  std::vector<int> world_ranks);
  std::shared_ptr<Work> Enqueue(OpType op, const std::optional<absl::Duration>& timeout, Job job);
  // The queue's poll (Note [Op queues]): PollP2P, then how long the worker
  // may wait before polling again, backing off while nothing completes.
  absl::Duration Poll(bool woken);
  // Tests the posted sends and receives (cancelling receives that were
  // aborted or timed out); true when one finished.
  bool PollP2P();
  absl::StatusOr<std::shared_ptr<PendingP2P>> PostP2P(OpType op, const Tensor& tensor, int peer,
                                                      const P2POptions& options);
  // "rank 2 (MPI_COMM_WORLD rank 5)".
  std::string DescribePeer(int rank) const;
  // The worker's part of monitored barrier `number` (Note [MPI monitored
  // barriers] in process_group_mpi.cc).
  absl::Status MonitoredBarrier(const std::string& what, int64_t number, absl::Duration timeout,
                                bool wait_all);

  const MPI_Comm comm_;
  const MPI_Comm barrier_comm_;  // monitored barriers' messages only
  const std::vector<int> world_ranks_;  // MPI_COMM_WORLD rank of each member

  // Held while an op is numbered and queued (so numbers follow the queue's
  // order) and while abort() fails what is queued.
  absl::Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> monitored_barriers_{0};  // numbers them, in call order
  std::vector<std::shared_ptr<PendingP2P>> p2p_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  absl::Duration poll_;  // the worker's polling interval (Poll only)
  // The collectives, in call order on one worker that also completes the
  // posted sends and receives (Note [Op queues]).
  OpQueue queue_;
};

}  // namespace ember::distributed::mpi

#endif  // EMBER_DISTRIBUTED_MPI_PROCESS_GROUP_MPI_H_
