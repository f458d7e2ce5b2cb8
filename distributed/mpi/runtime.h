// The process-wide MPI runtime under the "mpi" backend: starting MPI once,
// the one lock every MPI call is made under, MPI's error codes as Status, and
// Ember's dtypes and reduce ops as MPI datatypes and MPI_Ops.
//
//   EMBER_RETURN_IF_ERROR(ember::distributed::mpi::EnsureMpi());
//   absl::MutexLock lock(&ember::distributed::mpi::MpiLock());
//   EMBER_RETURN_IF_ERROR(MpiStatus(MPI_Barrier(comm), "barrier", "MPI_Barrier"));
//
// Note [MPI threads]: MPI is started with MPI_Init_thread asking for
// MPI_THREAD_SERIALIZED, as PyTorch's ProcessGroupMPI does: any thread may call
// MPI, but never two at once. So every MPI call in Ember is made holding
// MpiLock(), and a blocking collective holds it for as long as it runs: the
// process's other MPI calls (another group's op, posting a send) wait for it.
// MPI is finalised when the process exits (an atexit handler that takes the
// lock); a process that exits while a collective is stuck inside MPI skips
// MPI_Finalize, and mpirun reports that rank as having exited uncleanly.
//
// Thread-safety: every function is thread-safe.
#ifndef EMBER_DISTRIBUTED_MPI_RUNTIME_H_
#define EMBER_DISTRIBUTED_MPI_RUNTIME_H_

#include <mpi.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "distributed/process_group.h"
#include "tensor/dtype.h"

namespace ember::distributed::mpi {

// Starts MPI the first time (MPI_Init_thread, MPI_THREAD_SERIALIZED) and
// registers MPI_Finalize at exit; later calls return the first result. A
// program that started MPI itself is accepted when its thread level is at
// least MPI_THREAD_SERIALIZED. kFailedPrecondition when the library provides
// less, naming the level it provides, or when MPI was already finalised.
absl::Status EnsureMpi();

// The lock every MPI call is made under (Note [MPI threads]).
absl::Mutex& MpiLock();

// Whether MPI has been finalised (the process is exiting); no MPI call may
// be made after it. Call holding MpiLock().
bool MpiFinalized();

// This process's rank in MPI_COMM_WORLD and its size (after EnsureMpi).
struct WorldPlace {
  int rank = 0;
  int size = 1;
};
WorldPlace World();

// OK for MPI_SUCCESS; otherwise the error, naming `what` (the op, e.g.
// "all_reduce (collective #3)") and the MPI function, with MPI's own text.
// Size and argument errors (MPI_ERR_TRUNCATE, MPI_ERR_COUNT, ...) are
// kFailedPrecondition; the rest kUnavailable.
absl::Status MpiStatus(int code, absl::string_view what, absl::string_view function);

// Makes one MPI call holding MpiLock() (refused once MPI is finalised) and
// returns MpiStatus of its result:
//   CallMpi(what, "MPI_Bcast", [&] { return MPI_Bcast(data, n, type, root, comm); });
absl::Status CallMpi(absl::string_view what, absl::string_view function,
                     absl::FunctionRef<int()> call);

// The MPI datatype that carries `dtype`. float16 and bfloat16, which MPI
// lacks, are 2-byte types of Ember's own that the reductions below know.
MPI_Datatype MpiType(Dtype dtype);

// The MPI_Op for `op` on `dtype`: MPI's own (on bool, SUM and MAX are
// MPI_LOR, PRODUCT and MIN MPI_LAND), or for the 16-bit floats a user
// op that computes in float and rounds once per step, as the other backends
// do. ReduceOp::kAvg has none (the backend refuses it).
MPI_Op MpiOp(ReduceOp op, Dtype dtype);

// MPI's upper bound for message tags (MPI_TAG_UB, at least 32767).
int MaxTag();

}  // namespace ember::distributed::mpi

#endif  // EMBER_DISTRIBUTED_MPI_RUNTIME_H_
