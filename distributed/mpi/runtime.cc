#include "distributed/mpi/runtime.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/reduce.h"

namespace ember::distributed::mpi {
namespace {

struct Runtime {
  bool tried = false;
  absl::Status status;
  bool finalized = false;
  WorldPlace world;
  int max_tag = 32767;
  // Ember's 2-byte float types and the user ops that reduce them.
  MPI_Datatype half = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  MPI_Op ops16[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

Runtime& GetRuntime() {
  static Runtime* runtime = new Runtime;
  return *runtime;
}

const char* LevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

template <ReduceOp kOp>
void Reduce16(void* in, void* inout, int* len, MPI_Datatype* type) {
  // inout[i] = op(inout[i], in[i]), in float and rounded once (distributed/reduce.h).
  ReduceInto(kOp, *type == GetRuntime().half ? kFloat16 : kBFloat16, inout, in, *len);
}

// Called at exit: finalises MPI unless a collective is stuck inside it
// (Note [MPI threads]).
void FinalizeAtExit() {
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (!MpiLock().TryLock()) {
    if (absl::Now() > until) return;
    absl::SleepFor(absl::Milliseconds(5));
  }
  Runtime& r = GetRuntime();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  r.finalized = true;
  MpiLock().Unlock();
}

absl::Status Start(Runtime& r) {
  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    return absl::FailedPreconditionError(
        "mpi backend: MPI was already finalized (MPI_Finalize) in this process and cannot be "
        "started again");
  }
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, "mpi backend: starting MPI", "MPI_Init_thread");
    std::atexit(FinalizeAtExit);
    if (provided < MPI_THREAD_SERIALIZED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mpi backend: the MPI library provides only ", LevelName(provided),
          " but the backend needs MPI_THREAD_SERIALIZED (its ops run on a worker thread); use an "
          "MPI library built with thread support (Debian's Open MPI provides it)"));
    }
  } else {
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mpi backend: this program started MPI with ", LevelName(provided),
          " but the backend needs MPI_THREAD_SERIALIZED (its ops run on a worker thread); start "
          "MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...), or let the backend start "
          "it"));
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &r.world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r.world.size);
  int* tag_ub = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag) == MPI_SUCCESS && flag) {
    r.max_tag = *tag_ub;
  }
  MPI_Type_contiguous(2, MPI_BYTE, &r.half);
  MPI_Type_commit(&r.half);
  MPI_Type_contiguous(2, MPI_BYTE, &r.bfloat16);
  MPI_Type_commit(&r.bfloat16);
  MPI_Op_create(&Reduce16<ReduceOp::kSum>, /*commute=*/1, &r.ops16[0]);
  MPI_Op_create(&Reduce16<ReduceOp::kProduct>, 1, &r.ops16[1]);
  MPI_Op_create(&Reduce16<ReduceOp::kMin>, 1, &r.ops16[2]);
  MPI_Op_create(&Reduce16<ReduceOp::kMax>, 1, &r.ops16[3]);
  return absl::OkStatus();
}

}  // namespace

absl::Mutex& MpiLock() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

absl::Status EnsureMpi() {
  absl::MutexLock lock(&MpiLock());
  Runtime& r = GetRuntime();
  if (r.finalized) {
    return absl::FailedPreconditionError(
        "mpi backend: MPI was finalized as the process exits; no new mpi group can start");
  }
  if (!r.tried) {
    r.tried = true;
    r.status = Start(r);
  }
  return r.status;
}

bool MpiFinalized() { return GetRuntime().finalized; }

WorldPlace World() {
  absl::MutexLock lock(&MpiLock());
  return GetRuntime().world;
}

int MaxTag() {
  absl::MutexLock lock(&MpiLock());
  return GetRuntime().max_tag;
}

absl::Status MpiStatus(int code, absl::string_view what, absl::string_view function) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  int error_class = MPI_ERR_OTHER;
  MPI_Error_class(code, &error_class);
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  absl::StatusCode status_code = absl::StatusCode::kUnavailable;
  switch (error_class) {
    case MPI_ERR_TRUNCATE:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_OP:
    case MPI_ERR_ROOT:
    case MPI_ERR_RANK:
    case MPI_ERR_TAG:
    case MPI_ERR_ARG:
    case MPI_ERR_BUFFER:
      status_code = absl::StatusCode::kFailedPrecondition;
      break;
    default:
      break;
  }
  return absl::Status(
      status_code, absl::StrCat(what, ": ", function,
                                " failed: ", absl::string_view(text, static_cast<size_t>(length)),
                                " (MPI error class ", error_class, ")"));
}

absl::Status CallMpi(absl::string_view what, absl::string_view function,
                     absl::FunctionRef<int()> call) {
  absl::MutexLock lock(&MpiLock());
  if (GetRuntime().finalized) {
    return absl::AbortedError(absl::StrCat(what, ": MPI was finalized as the process exits"));
  }
  return MpiStatus(call(), what, function);
}

MPI_Datatype MpiType(Dtype dtype) {
  switch (dtype) {
    case kFloat32:
      return MPI_FLOAT;
    case kFloat64:
      return MPI_DOUBLE;
    case kFloat16:
      return GetRuntime().half;
    case kBFloat16:
      return GetRuntime().bfloat16;
    case kInt64:
      return MPI_INT64_T;
    case kInt32:
      return MPI_INT32_T;
    case kInt16:
      return MPI_INT16_T;
    case kInt8:
      return MPI_INT8_T;
    case kUInt8:
      return MPI_UINT8_T;
    case kBool:
      return MPI_C_BOOL;
  }
  return MPI_BYTE;
}

MPI_Op MpiOp(ReduceOp op, Dtype dtype) {
  if (dtype == kBool) {
    return op == ReduceOp::kSum || op == ReduceOp::kMax ? MPI_LOR : MPI_LAND;
  }
  if (dtype == kFloat16 || dtype == kBFloat16) {
    switch (op) {
      case ReduceOp::kSum:
        return GetRuntime().ops16[0];
      case ReduceOp::kProduct:
        return GetRuntime().ops16[1];
      case ReduceOp::kMin:
        return GetRuntime().ops16[2];
      case ReduceOp::kMax:
        return GetRuntime().ops16[3];
      case ReduceOp::kAvg:
        return MPI_OP_NULL;
    }
  }
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kProduct:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kAvg:
      return MPI_OP_NULL;
  }
  return MPI_OP_NULL;
}

}  // namespace ember::distributed::mpi
