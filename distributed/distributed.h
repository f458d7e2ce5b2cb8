// torch.distributed for C++ programs: one default process group per process,
// created by init_process_group, and the free functions that run ops on it
// (or on a group made by new_group).
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "tensor/factories.h"
//   // Every process (launched with MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK):
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "tcp"}));
//   ember::Tensor t = ember::ones({1024});
//   EMBER_RETURN_IF_ERROR(ember::distributed::all_reduce(t));   // t == world_size
//   EMBER_ASSIGN_OR_RETURN(auto pair, ember::distributed::new_group({0, 1}));
//   EMBER_RETURN_IF_ERROR(ember::distributed::broadcast(t, /*src=*/0, pair));
//   EMBER_RETURN_IF_ERROR(ember::distributed::destroy_process_group());
//   ```
//
// As in torch, ranks passed to the free functions (src, dst) are global ranks
// even when a group is given; inside ProcessGroup's own methods they are ranks
// within the group. Each op has a blocking form returning absl::Status and an
// `_async` form returning the op's Work (torch's async_op=True). Calls on a
// group this process is not a member of fail with kFailedPrecondition naming
// the rank and the group's members; calls before init_process_group fail
// with kFailedPrecondition ("call init_process_group first").
//
// Errors: absl::Status throughout (see process_group.h for the codes);
// init_process_group's rendezvous errors name the variable or URL at fault
// (distributed/rendezvous.h).
//
// Thread-safety: all functions are thread-safe; init_process_group and
// destroy_process_group must not race with ops on the default group.
#ifndef EMBER_DISTRIBUTED_DISTRIBUTED_H_
#define EMBER_DISTRIBUTED_DISTRIBUTED_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distributed/backend_registry.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "tensor/tensor.h"

namespace ember::distributed {

// torch.distributed's default_pg_timeout: 30 minutes.
inline constexpr absl::Duration kDefaultProcessGroupTimeout = absl::Minutes(30);

// A handle to a process group; null means the default group.
using Group = std::shared_ptr<ProcessGroup>;

struct InitOptions {
  // Empty: "tcp", or "cpu:gloo,cuda:nccl" when a CUDA device is usable and
  // the nccl backend is linked (PyTorch 2.x's choice when none is named).
  std::string backend;
  // env://, tcp://host:port, tcp://<multicast address>:port, file:///path.
  // Not used by "mpi": mpirun has placed the processes, and rank and
  // world_size come from MPI_COMM_WORLD (given ones must agree), as in
  // PyTorch.
  std::string init_method = "env://";
  int world_size = -1;  // -1: from the init method / environment
  int rank = -1;        // -1: from the init method / environment
  std::string group_name;
  // Unset: the backend's default, kDefaultProcessGroupTimeout (30 minutes),
  // or 10 minutes for nccl, as PyTorch's default_pg_nccl_timeout.
  std::optional<absl::Duration> timeout;
  // torch's `store=` argument: use this store instead of a rendezvous
  // (world_size and rank must then be given).
  std::shared_ptr<Store> store;
  // torch's `pg_options`: the backend's own options (tcp::TcpOptions,
  // gloo::GlooOptions); null for its defaults.
  std::shared_ptr<const BackendSpecificOptions> pg_options;
};

// Rendezvous with the other processes, then builds the default group with
// the backend. Blocks until every rank has joined or `timeout`.
// kFailedPrecondition if already initialised.
absl::Status init_process_group(const InitOptions& options = {});
bool is_initialized();
// This process's rank in `group` (global rank for the default group), or -1
// when it is not a member, as torch returns; and the group's size. Queries
// that cannot fail once the process group is initialised return plain values,
// as torch's do; calling them before init_process_group is a programming
// error and throws ember::Error, as torch raises.
int get_rank(const Group& group = nullptr);
int get_world_size(const Group& group = nullptr);
// The default group (for the ProcessGroup methods).
absl::StatusOr<Group> get_default_group();
// Destroys `group`, or every group and the default one when null. Ops
// already issued on it that have not completed fail with kAborted ("the
// process group was destroyed") at once: wait for them first to have them
// finish. Never waits for a peer: returns within moments even when a peer
// is dead, stopped or slow (Note [Failing cleanly] in distributed.cc;
// ProcessGroup::shutdown). Handles the caller still holds fail every op.
absl::Status destroy_process_group(const Group& group = nullptr);

// shrink_group's flags (torch.distributed.SHRINK_DEFAULT / SHRINK_ABORT):
// kShrinkAbort aborts the group's pending ops before the survivors' group is
// made; with kShrinkDefault the group is aborted once the backend has done
// its part (nccl: ncclCommShrink with NCCL_SHRINK_DEFAULT wants no op
// pending on it).
inline constexpr int kShrinkDefault = 0x00;
inline constexpr int kShrinkAbort = 0x01;

// torch.distributed.shrink_group: a new group of the ranks of `group` (the
// default group when null) that are not in `ranks_to_exclude` (ranks of that
// group), renumbered 0..n-1 in their old order, made without the excluded
// ranks and without re-initialising the process; only the surviving ranks
// call it, each with the same list. The old group is aborted and destroyed
// (its pending ops fail with kAborted). When the default group is shrunk
// the new group becomes the default one: get_rank() and get_world_size()
// then give the new numbering, and every other group is aborted and
// destroyed, as in PyTorch, since its ranks no longer mean the same.
// `pg_options`: the backend's options for the new group (the old group's
// when null).
//
// tcp and gloo: the survivors meet through the group's store under a fresh
// prefix that each derives alone ("<group prefix>shrink:<excluded>/"), so
// the store must outlive the excluded ranks (host it on a survivor or
// outside the job). nccl: ncclCommShrink on the group's communicator where
// NCCL has it (2.27 and later), else the store. Blocks until the survivors
// have connected or the group's timeout.
//
// Errors: kInvalidArgument for an empty list, a rank out of range (naming
// it), a rank listed twice, a list that names every rank, a group of one,
// or flags other than the two above; kFailedPrecondition when this rank is
// itself excluded or not a member; kUnimplemented for a backend placed by a
// launcher (mpi); the new group's creation errors otherwise.
absl::StatusOr<Group> shrink_group(std::vector<int> ranks_to_exclude, const Group& group = nullptr,
                                   int shrink_flags = kShrinkDefault,
                                   std::shared_ptr<const BackendSpecificOptions> pg_options = nullptr);

struct NewGroupOptions {
  std::optional<absl::Duration> timeout;                     // the default group's when unset
  std::string backend;                                       // the default group's when empty
  std::shared_ptr<const BackendSpecificOptions> pg_options;  // as InitOptions'
};
// A group of the given global ranks (all ranks when empty). Every process
// must call new_group, with the same ranks, in the same order. Members block
// until the group's ranks have connected; every rank then counts itself in
// at PyTorch's store-based barrier and, with TORCH_DIST_INIT_BARRIER=1, waits
// there until every rank of the job has its handle (PyTorch 2.x's default,
// unset, does not wait). Non-members get a handle whose ops fail clearly.
absl::StatusOr<Group> new_group(std::vector<int> ranks = {}, const NewGroupOptions& options = {});

// --- Point-to-point (blocking forms wait for completion) ----------------------
absl::Status send(const Tensor& tensor, int dst, const Group& group = nullptr, int tag = 0);
// Returns the sender's global rank (useful with src = kAnySource).
absl::StatusOr<int> recv(const Tensor& tensor, int src = kAnySource, const Group& group = nullptr,
                         int tag = 0);
absl::StatusOr<std::shared_ptr<Work>> isend(const Tensor& tensor, int dst,
                                            const Group& group = nullptr, int tag = 0);
absl::StatusOr<std::shared_ptr<RecvWork>> irecv(const Tensor& tensor, int src = kAnySource,
                                                const Group& group = nullptr, int tag = 0);

// One op of batch_isend_irecv (torch's P2POp): an isend of `tensor` to, or
// an irecv into it from, global rank `peer` of `group`.
struct P2POp {
  enum class Kind { kIsend, kIrecv };
  Kind op = Kind::kIsend;
  Tensor tensor;
  int peer = -1;
  Group group = nullptr;  // the default group when null
  int tag = 0;
};
// Issues the isends and irecvs of `ops`, all of one group, as one batch
// (ProcessGroup::batch_p2p: nccl groups them in one ncclGroupStart/End; the
// other backends issue them in order) and returns one Work per op, in
// order: wait on each. Nothing is issued when an op is refused: an empty
// list, ops of different groups (all ops need to use the same group, as in
// torch), a peer outside the group, or what isend and irecv refuse.
absl::StatusOr<std::vector<std::shared_ptr<Work>>> batch_isend_irecv(absl::Span<const P2POp> ops);

// --- Collectives ----------------------------------------------------------------
absl::Status broadcast(const Tensor& tensor, int src, const Group& group = nullptr);
absl::Status all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                        const Group& group = nullptr);
absl::Status reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::kSum,
                    const Group& group = nullptr);
absl::Status all_gather(absl::Span<const Tensor> tensor_list, const Tensor& tensor,
                        const Group& group = nullptr);
absl::Status all_gather_into_tensor(const Tensor& output, const Tensor& input,
                                    const Group& group = nullptr);
// `gather_list` is used on dst only (pass {} elsewhere); likewise
// `scatter_list` on src.
absl::Status gather(const Tensor& tensor, absl::Span<const Tensor> gather_list, int dst,
                    const Group& group = nullptr);
absl::Status scatter(const Tensor& tensor, absl::Span<const Tensor> scatter_list, int src,
                     const Group& group = nullptr);
absl::Status reduce_scatter(const Tensor& output, absl::Span<const Tensor> input_list,
                            ReduceOp op = ReduceOp::kSum, const Group& group = nullptr);
absl::Status all_to_all(absl::Span<const Tensor> output_list, absl::Span<const Tensor> input_list,
                        const Group& group = nullptr);
absl::Status barrier(const Group& group = nullptr);
// Rank 0's error names the ranks that did not arrive within `timeout` (the
// group's timeout when unset).
absl::Status monitored_barrier(const Group& group = nullptr,
                               std::optional<absl::Duration> timeout = std::nullopt,
                               bool wait_all_ranks = false);

// The same ops, returning their Work instead of waiting (torch's async_op).
absl::StatusOr<std::shared_ptr<Work>> broadcast_async(const Tensor& tensor, int src,
                                                      const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> all_reduce_async(const Tensor& tensor,
                                                       ReduceOp op = ReduceOp::kSum,
                                                       const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> reduce_async(const Tensor& tensor, int dst,
                                                   ReduceOp op = ReduceOp::kSum,
                                                   const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> all_gather_async(absl::Span<const Tensor> tensor_list,
                                                       const Tensor& tensor,
                                                       const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> all_gather_into_tensor_async(const Tensor& output,
                                                                   const Tensor& input,
                                                                   const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> gather_async(const Tensor& tensor,
                                                   absl::Span<const Tensor> gather_list, int dst,
                                                   const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> scatter_async(const Tensor& tensor,
                                                    absl::Span<const Tensor> scatter_list, int src,
                                                    const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> reduce_scatter_async(const Tensor& output,
                                                           absl::Span<const Tensor> input_list,
                                                           ReduceOp op = ReduceOp::kSum,
                                                           const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> all_to_all_async(absl::Span<const Tensor> output_list,
                                                       absl::Span<const Tensor> input_list,
                                                       const Group& group = nullptr);
absl::StatusOr<std::shared_ptr<Work>> barrier_async(const Group& group = nullptr);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_DISTRIBUTED_H_
