#include "distributed/backend_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::distributed {

absl::Status CheckBackendOptions(std::string_view backend, const BackendOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(backend), " backend: no store was given"));
  }
  const int rank = options.rank, n = options.size;
  if (n < 1 || rank < 0 || rank >= n) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(backend), " backend: rank ", rank,
                                                   " is invalid for world size ", n,
                                                   " (need 0 <= rank < world_size)"));
  }
  return absl::OkStatus();
}

absl::Status RefuseAvg(OpType op, ReduceOp reduce, std::string_view backend) {
  if (reduce != ReduceOp::kAvg) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      op_type_name(op), ": ReduceOp.AVG is not supported by the '", std::string(backend),
      "' backend (as in PyTorch); use SUM and divide by the group size, or the 'tcp' backend"));
}

Tensor ContiguousStaging(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void CopyBackFromStaging(const Tensor& user, const Tensor& staging) {
  if (!staging.is_same(user)) user.copy_(staging);
}

absl::Status MonitoredBarrierTimeout(const std::vector<int>& missing, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "monitored_barrier: rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
      " failed to pass monitoredBarrier in ", absl::ToInt64Milliseconds(timeout), " ms"));
}

}  // namespace ember::distributed
