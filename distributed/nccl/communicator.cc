#include "distributed/nccl/communicator.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "cuda/nccl_dtype.h"
#include "cuda/status.h"
#include "tensor/status_macros.h"

namespace ember::distributed::nccl {

// Note [NCCL deadlines]
// NCCL has no timeout of its own: a blocking ncclCommInitRank waits forever
// for a member that never comes, and a collective whose peer died spins on
// the GPU forever. Ember therefore creates every communicator non-blocking
// (ncclConfig_t.blocking = 0), so that NCCL calls return ncclInProgress at
// once, and polls ncclCommGetAsyncError until the call has finished or the
// caller's deadline passes; then it aborts the communicator, which makes
// NCCL give up and frees its resources. Kernels already queued are watched by
// the process group's watchdog (Note [NCCL watchdog] in
// process_group_nccl.cc), which aborts the communicator in the same way.

namespace {

constexpr absl::Duration kPollInterval = absl::Microseconds(200);
// How long a destructor waits for a communicator to finalize before aborting it.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);

ncclConfig_t MakeConfig(const CommConfig& c) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (c.cga_cluster_size >= 0) config.cgaClusterSize = c.cga_cluster_size;
  if (c.min_ctas >= 0) config.minCTAs = c.min_ctas;
  if (c.max_ctas >= 0) config.maxCTAs = c.max_ctas;
  if (!c.net_name.empty()) config.netName = c.net_name.c_str();
  return config;
}

absl::Status CheckSpec(const CommSpec& spec) {
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL communicator: rank ", spec.rank,
                                                   " is out of range for size ", spec.size));
  }
  EMBER_ASSIGN_OR_RETURN(int device, cuda::internal::CheckDevice("NCCL communicator", spec.device));
  (void)device;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::create(const CommSpec& spec) {
  EMBER_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<NcclComm>> comms, create_many({spec}));
  return std::move(comms[0]);
}

absl::StatusOr<std::vector<std::unique_ptr<NcclComm>>> NcclComm::create_many(
    const std::vector<CommSpec>& specs) {
  if (specs.empty()) return absl::InvalidArgumentError("NCCL communicator: no devices given");
  for (const CommSpec& spec : specs) EMBER_RETURN_IF_ERROR(CheckSpec(spec));
  std::vector<ncclConfig_t> configs;
  configs.reserve(specs.size());
  for (const CommSpec& spec : specs) configs.push_back(MakeConfig(spec.config));
  std::vector<ncclComm_t> raw(specs.size(), nullptr);
  absl::Status init = [&]() -> absl::Status {
    // Several communicators of one process must be joined inside one group
    // call, or the first would wait for the others forever.
    if (specs.size() > 1) EMBER_RETURN_IF_ERROR(cuda::nccl_status(ncclGroupStart(), "ncclGroupStart"));
    for (size_t i = 0; i < specs.size(); ++i) {
      const CommSpec& s = specs[i];
      EMBER_RETURN_IF_ERROR(cuda::internal::OnDevice(s.device, [&]() -> absl::Status {
        ncclUniqueId id = s.id;
        ncclResult_t r = ncclCommInitRankConfig(&raw[i], s.size, id, s.rank, &configs[i]);
        if (r == ncclInProgress) return absl::OkStatus();
        return cuda::nccl_status(r, "ncclCommInitRankConfig");
      }));
    }
    if (specs.size() > 1) {
      ncclResult_t r = ncclGroupEnd();
      if (r != ncclInProgress) EMBER_RETURN_IF_ERROR(cuda::nccl_status(r, "ncclGroupEnd"));
    }
    return absl::OkStatus();
  }();
  std::vector<std::unique_ptr<NcclComm>> comms;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (raw[i] == nullptr) continue;
    comms.push_back(std::unique_ptr<NcclComm>(
        new NcclComm(raw[i], specs[i].device, specs[i].size, specs[i].rank)));
  }
  if (init.ok() && comms.size() != specs.size()) {
    init = absl::InternalError("NCCL communicator: ncclCommInitRankConfig returned no communicator");
  }
  for (size_t i = 0; init.ok() && i < comms.size(); ++i) {
    absl::Status ready = comms[i]->WaitReady("ncclCommInitRankConfig", specs[i].deadline);
    if (!ready.ok()) {
      init = absl::Status(ready.code(),
                          absl::StrCat(ready.message(), " while joining an NCCL communicator of ",
                                       specs[i].size, " ranks as rank ", specs[i].rank,
                                       " on cuda:", specs[i].device,
                                       "; every member must create it (same collective order on "
                                       "every rank), and each must be on a distinct GPU"));
    }
  }
  if (!init.ok()) {
    for (auto& c : comms) c->abort();
    return init;
  }
  return comms;
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::split(int color, int key,
                                                          const CommConfig& config,
                                                          absl::Time deadline) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  static_assert(kNoColor == NCCL_SPLIT_NOCOLOR);
  if (aborted_.load()) return absl::AbortedError("ncclCommSplit: the parent communicator was aborted");
  ncclConfig_t nccl_config = MakeConfig(config);
  ncclComm_t raw = nullptr;
  EMBER_RETURN_IF_ERROR(cuda::internal::OnDevice(device_, [&]() -> absl::Status {
    ncclResult_t r = ncclCommSplit(comm_, color, key, &raw, &nccl_config);
    if (r == ncclInProgress) return absl::OkStatus();
    return cuda::nccl_status(r, "ncclCommSplit");
  }));
  std::unique_ptr<NcclComm> child;
  int child_size = 0, child_rank = 0;
  absl::Status ready = WaitReady("ncclCommSplit", deadline);
  if (ready.ok() && raw != nullptr) {
    child.reset(new NcclComm(raw, device_, 0, 0));
    ready = child->WaitReady("ncclCommSplit", deadline);
    if (ready.ok()) {
      ready = cuda::nccl_status(ncclCommCount(raw, &child_size), "ncclCommCount");
    }
    if (ready.ok()) {
      ready = cuda::nccl_status(ncclCommUserRank(raw, &child_rank), "ncclCommUserRank");
    }
  }
  if (!ready.ok()) {
    if (child != nullptr) child->abort();
    return absl::Status(ready.code(),
                        absl::StrCat(ready.message(), " while splitting an NCCL communicator of ",
                                     size_, " ranks on cuda:", device_,
                                     "; every rank of it must split it (new_group on every rank, "
                                     "in the same order)"));
  }
  if (child == nullptr) return child;
  child->comm_ = nullptr;  // handed to the one that knows its size and rank
  return std::unique_ptr<NcclComm>(new NcclComm(raw, device_, child_size, child_rank));
#else
  return absl::UnimplementedError(
      absl::StrCat("ncclCommSplit needs NCCL 2.18 or later; this build has ", NCCL_MAJOR, ".",
                   NCCL_MINOR, "; make a new communicator instead"));
#endif
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::shrink(absl::Span<const int> excluded,
                                                           const CommConfig& config,
                                                           bool abort_first, absl::Time deadline) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (aborted_.load()) {
    return absl::AbortedError("ncclCommShrink: the parent communicator was aborted");
  }
  ncclConfig_t nccl_config = MakeConfig(config);
  std::vector<int> ranks(excluded.begin(), excluded.end());
  ncclComm_t raw = nullptr;
  EMBER_RETURN_IF_ERROR(cuda::internal::OnDevice(device_, [&]() -> absl::Status {
    ncclResult_t r = ncclCommShrink(comm_, ranks.data(), static_cast<int>(ranks.size()), &raw,
                                    &nccl_config,
                                    abort_first ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
    if (r == ncclInProgress) return absl::OkStatus();
    return cuda::nccl_status(r, "ncclCommShrink");
  }));
  absl::Status ready = raw == nullptr
                           ? absl::InternalError("ncclCommShrink returned no communicator")
                           : absl::OkStatus();
  std::unique_ptr<NcclComm> child;
  int child_size = 0, child_rank = 0;
  if (ready.ok()) {
    child.reset(new NcclComm(raw, device_, 0, 0));
    ready = child->WaitReady("ncclCommShrink", deadline);
  }
  if (ready.ok()) ready = cuda::nccl_status(ncclCommCount(raw, &child_size), "ncclCommCount");
  if (ready.ok()) ready = cuda::nccl_status(ncclCommUserRank(raw, &child_rank), "ncclCommUserRank");
  if (!ready.ok()) {
    if (child != nullptr) child->abort();
    return absl::Status(ready.code(),
                        absl::StrCat(ready.message(), " while shrinking an NCCL communicator of ",
                                     size_, " ranks on cuda:", device_, " by ", ranks.size(),
                                     " ranks; every surviving rank must shrink it with the same "
                                     "ranks_to_exclude"));
  }
  child->comm_ = nullptr;  // handed to the one that knows its size and rank
  return std::unique_ptr<NcclComm>(new NcclComm(raw, device_, child_size, child_rank));
#else
  return absl::UnimplementedError(
      absl::StrCat("ncclCommShrink needs NCCL 2.27 or later; this build has ", NCCL_MAJOR, ".",
                   NCCL_MINOR, "; the shrunken group makes a new communicator instead"));
#endif
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  if (aborted_.load()) return;  // ncclCommAbort freed it
  // A non-blocking communicator finalizes in the background: wait for it (a
  // bounded time: a dead peer must not hang the destructor), then destroy;
  // abort when it does not finish.
  cuda::internal::OnDevice(device_, [&] {
    ncclResult_t r = ncclCommFinalize(comm_);
    absl::Status done = r == ncclSuccess || r == ncclInProgress
                            ? WaitReady("ncclCommFinalize", absl::Now() + kFinalizeTimeout)
                            : cuda::nccl_status(r, "ncclCommFinalize");
    if (done.ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    return absl::OkStatus();
  }).IgnoreError();
}

void NcclComm::abort() {
  if (aborted_.exchange(true)) return;
  cuda::internal::OnDevice(device_, [&] {
    ncclCommAbort(comm_);
    return absl::OkStatus();
  }).IgnoreError();
}

absl::Status NcclComm::async_error() const {
  if (aborted_.load()) return absl::AbortedError("the NCCL communicator was aborted");
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
  if (r != ncclSuccess) return cuda::nccl_status(r, "ncclCommGetAsyncError");
  if (async == ncclInProgress) return absl::OkStatus();
  return cuda::nccl_status(async, "NCCL (asynchronous error)");
}

absl::Status NcclComm::WaitReady(std::string_view call, absl::Time deadline) const {
  while (true) {
    if (aborted_.load()) return absl::AbortedError(absl::StrCat(std::string(call), ": communicator aborted"));
    ncclResult_t async = ncclSuccess;
    EMBER_RETURN_IF_ERROR(
        cuda::nccl_status(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
    if (async == ncclSuccess) return absl::OkStatus();
    if (async != ncclInProgress) return cuda::nccl_status(async, call);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(std::string(call), " did not finish by its deadline (", absl::FormatTime(deadline), ")"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::StatusOr<ncclUniqueId> exchange_unique_id(Store& store, const std::string& key,
                                                bool is_root, absl::Duration timeout) {
  ncclUniqueId id;
  if (is_root) {
    EMBER_RETURN_IF_ERROR(cuda::nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    EMBER_RETURN_IF_ERROR(
        store.set(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
    return id;
  }
  absl::StatusOr<std::string> bytes = store.get(key, timeout);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("waiting for the NCCL unique id under '", key,
                                     "' from the communicator's first rank: ",
                                     bytes.status().message()));
  }
  if (bytes->size() != sizeof(id)) {
    return absl::DataLossError(absl::StrCat("the NCCL unique id under '", key, "' has ",
                                            bytes->size(), " bytes, expected ", sizeof(id),
                                            "; is another job using this store?"));
  }
  std::memcpy(&id, bytes->data(), sizeof(id));
  return id;
}

absl::StatusOr<ncclDataType_t> nccl_dtype(Dtype dtype) {
  if (std::optional<ncclDataType_t> type = cuda::nccl_type(dtype)) return *type;
  return absl::InvalidArgumentError(
      absl::StrCat("NCCL has no ", std::string(dtype_name(dtype)),
                   " type, so the nccl backend cannot reduce it; convert the tensor to int32 "
                   "first (data movement ops carry it as bytes)"));
}

absl::StatusOr<ncclRedOp_t> nccl_reduce_op(ReduceOp op, Dtype dtype) {
  if (dtype == Dtype::kBool) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
        return ncclMax;
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
        return ncclMin;
      case ReduceOp::kAvg:
        break;
    }
    return absl::InvalidArgumentError("AVG is not defined on bool tensors");
  }
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  return absl::InvalidArgumentError("unknown reduce op");
}

}  // namespace ember::distributed::nccl
