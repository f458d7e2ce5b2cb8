// NCCL communicators for the "nccl" backend (process_group_nccl.h): the owned
// ncclComm_t, the exchange of its ncclUniqueId through the group's Store,
// and the mapping of Ember's dtypes and reduce ops onto NCCL's.
//
//   ```cpp compile-only
//   #include "distributed/nccl/communicator.h"
//   namespace nccl = ember::distributed::nccl;
//   // Every rank of a 2-rank group, each on its own GPU:
//   EMBER_ASSIGN_OR_RETURN(ncclUniqueId id, nccl::exchange_unique_id(
//       store, "default_pg/0", /*is_root=*/rank == 0, absl::Minutes(10)));
//   EMBER_ASSIGN_OR_RETURN(std::unique_ptr<nccl::NcclComm> comm, nccl::NcclComm::create(
//       {.device = rank, .size = 2, .rank = rank, .id = id,
//        .deadline = absl::Now() + absl::Minutes(10)}));
//   ```
//
// Communicators are created non-blocking (ncclConfig_t.blocking = 0) and
// polled, so that joining one, which waits for every member, has a deadline
// instead of hanging when a member never arrives (Note [NCCL deadlines]).
//
// Errors: absl::Status; NCCL's return codes through cuda::nccl_status, so
// messages carry NCCL's own text ("unhandled system error", ...).
//
// Thread-safety: NcclComm's methods may be called from any thread; abort()
// may run while another thread is inside an NCCL call on the communicator
// (that call then returns an error), as NCCL allows.
#ifndef EMBER_DISTRIBUTED_NCCL_COMMUNICATOR_H_
#define EMBER_DISTRIBUTED_NCCL_COMMUNICATOR_H_

#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "tensor/dtype.h"

namespace ember::distributed::nccl {

// NCCL's ncclConfig_t fields a user may set (torch's ProcessGroupNCCL.Options
// .config); -1 / empty leave NCCL's default.
struct CommConfig {
  int cga_cluster_size = -1;
  int min_ctas = -1;
  int max_ctas = -1;
  std::string net_name;
};

struct CommSpec {
  int device = 0;  // the CUDA device the communicator's rank runs on
  int size = 1;    // ranks in the communicator
  int rank = 0;    // this process's rank in it
  ncclUniqueId id{};
  absl::Time deadline = absl::InfiniteFuture();  // for joining
  CommConfig config;
};

class NcclComm {
 public:
  // Joins the communicator `spec.id` names; every member must call this with
  // the same id and size. kDeadlineExceeded (after aborting the half-made
  // communicator) when the members have not all joined by `spec.deadline`.
  static absl::StatusOr<std::unique_ptr<NcclComm>> create(const CommSpec& spec);
  // Several communicators of one id in this process, one per entry of
  // `specs` (the multi-GPU ops: one rank per local device), joined together
  // inside one NCCL group call.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclComm>>> create_many(
      const std::vector<CommSpec>& specs);

  // Whether this NCCL has ncclCommSplit (2.18 and later).
  static constexpr bool kCanSplit = NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0);
  // ncclCommSplit: every rank of this communicator must call it, in the same
  // order as the communicator's other calls. Ranks passing the same `color`
  // (>= 0) get a new communicator of them, ordered by `key`, on this one's
  // device; a rank passing kNoColor takes part and gets null. Non-blocking
  // like create: kDeadlineExceeded (after aborting what was made) when the
  // ranks have not all joined by `deadline`; kUnimplemented without kCanSplit.
  static constexpr int kNoColor = -1;  // NCCL_SPLIT_NOCOLOR
  absl::StatusOr<std::unique_ptr<NcclComm>> split(int color, int key, const CommConfig& config,
                                                  absl::Time deadline);

  // Whether this NCCL has ncclCommShrink (2.27 and later).
  static constexpr bool kCanShrink = NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0);
  // ncclCommShrink: every surviving rank of this communicator calls it with
  // the same `excluded` ranks (of this communicator, sorted); the excluded
  // ranks do not take part. Returns the survivors' communicator, ranks
  // renumbered in order, on this one's device. `abort_first`
  // (NCCL_SHRINK_ABORT) stops the ops still running on this one first;
  // without it none may be pending. Non-blocking like create:
  // kDeadlineExceeded (after aborting what was made) past `deadline`;
  // kUnimplemented without kCanShrink.
  absl::StatusOr<std::unique_ptr<NcclComm>> shrink(absl::Span<const int> excluded,
                                                   const CommConfig& config, bool abort_first,
                                                   absl::Time deadline);

  // Destroys the communicator (ncclCommDestroy), or frees what is left of an
  // aborted one.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }
  int size() const { return size_; }
  int rank() const { return rank_; }

  // Aborts the communicator (ncclCommAbort): NCCL kernels queued on it stop
  // and every later call on it fails. Idempotent.
  void abort();
  bool aborted() const { return aborted_.load(); }
  // OK, or the asynchronous error NCCL recorded for the communicator (a
  // peer's network failure, a remote abort) — ncclCommGetAsyncError.
  absl::Status async_error() const;
  // Waits until a non-blocking call on the communicator has finished
  // (ncclInProgress no longer reported) or `deadline` passes.
  absl::Status WaitReady(std::string_view call, absl::Time deadline) const;

 private:
  NcclComm(ncclComm_t comm, int device, int size, int rank)
      : comm_(comm), device_(device), size_(size), rank_(rank) {}

  ncclComm_t comm_;
  const int device_;
  const int size_;
  const int rank_;
  std::atomic<bool> aborted_{false};
};

// Rank `is_root` creates a ncclUniqueId and publishes it under `key` in
// `store`; the others read it there, waiting at most `timeout`. This is how
// every communicator of a group learns its id (PyTorch's broadcastUniqueNCCLID
// through the group's store).
absl::StatusOr<ncclUniqueId> exchange_unique_id(Store& store, const std::string& key,
                                                bool is_root, absl::Duration timeout);

// NCCL's type for `dtype` (bool travels as uint8; the table is
// cuda::nccl_type, cuda/nccl_dtype.h). kInvalidArgument for a dtype NCCL has
// no type for (int16), naming it and what to use instead.
absl::StatusOr<ncclDataType_t> nccl_dtype(Dtype dtype);
// NCCL's reduction for `op` on `dtype`: on bool SUM and MAX are "or" (max),
// PRODUCT and MIN "and" (min), as in PyTorch; AVG is ncclAvg.
absl::StatusOr<ncclRedOp_t> nccl_reduce_op(ReduceOp op, Dtype dtype);

}  // namespace ember::distributed::nccl

#endif  // EMBER_DISTRIBUTED_NCCL_COMMUNICATOR_H_
