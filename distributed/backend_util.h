// Helpers the backends share below ProcessGroup's checks (Note [ProcessGroup
// layers]): the creation checks of a backend's options, the reduce op a
// backend refuses (AVG), the contiguous buffers an op works on and the copy
// of a result back into the caller's tensor, and monitored_barrier's error.
// The tcp, gloo and mpi backends use them, so the same case reads the same
// on each. A seam for backends (README.md "API rules"): not API.
//
//   // In a backend's DoAllReduce, on the caller's thread:
//   EMBER_RETURN_IF_ERROR(RefuseAvg(OpType::kAllReduce, options.op, "gloo"));
//   // On the worker:
//   Tensor data = ContiguousStaging(tensor);
//   // ... the transport writes data ...
//   CopyBackFromStaging(tensor, data);  // a no-op when data is tensor
//
// Errors: absl::Status, kInvalidArgument for options no backend can use and
// kUnimplemented for a reduce op the backend lacks, each naming the backend
// and what to do instead.
//
// Thread-safe (the tensor helpers as the tensors they are given).
#ifndef EMBER_DISTRIBUTED_BACKEND_UTIL_H_
#define EMBER_DISTRIBUTED_BACKEND_UTIL_H_

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "distributed/backend_registry.h"
#include "distributed/process_group.h"
#include "tensor/tensor.h"

namespace ember::distributed {

// kInvalidArgument ("<backend> backend: no store was given", "... rank R is
// invalid for world size N ...") unless `options` has a store and a rank in
// [0, size).
absl::Status CheckBackendOptions(std::string_view backend, const BackendOptions& options);

// kUnimplemented naming `op` and `backend` when `reduce` is AVG, which the
// backend lacks (as PyTorch's gloo and mpi backends do); OK otherwise.
absl::Status RefuseAvg(OpType op, ReduceOp reduce, std::string_view backend);

// The contiguous tensor an op reads or writes for `t`: `t` itself when it is
// contiguous (the op then works in the caller's memory), else a contiguous
// copy.
Tensor ContiguousStaging(const Tensor& t);
// After the op: copies `staging` (from ContiguousStaging(user)) into `user`,
// unless it is `user` itself.
void CopyBackFromStaging(const Tensor& user, const Tensor& staging);

// monitored_barrier's failure on rank 0 (torch's wording): kDeadlineExceeded,
// "monitored_barrier: ranks 1, 3 failed to pass monitoredBarrier in 500 ms".
// `missing` is not empty.
absl::Status MonitoredBarrierTimeout(const std::vector<int>& missing, absl::Duration timeout);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_BACKEND_UTIL_H_
