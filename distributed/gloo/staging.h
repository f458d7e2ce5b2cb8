// DeviceStaging: how the gloo backend runs an op whose tensors live on a
// device (CUDA): through page-locked host memory, ordered on the tensors'
// stream, as PyTorch's ProcessGroupGloo does for CUDA tensors (Note [gloo on
// device tensors] in staging.cc). It uses tensor/'s device-generic API only
// (pinned_memory factories, non-blocking copy_, streams and events), so the
// gloo backend builds and runs without the CUDA toolkit; device tensors exist
// only where a device backend (//cuda) is linked.
//
//   auto stage = std::make_shared<DeviceStaging>();
//   // At the call, on the caller's thread (cuda_tensor on cuda:0):
//   EMBER_ASSIGN_OR_RETURN(ember::Tensor host, stage->InOut(cuda_tensor));
//   // On the group's worker: wait for the copy in, run gloo on `host`, copy back.
//   EMBER_RETURN_IF_ERROR(stage->WaitForInputs(deadline, "all_reduce"));
//   // ... gloo::allreduce on host ...
//   EMBER_RETURN_IF_ERROR(stage->CopyBack());
//   // Work::wait(), on the waiter's thread: its current stream waits for the copy back.
//   EMBER_RETURN_IF_ERROR(stage->BlockCurrentStream());
//
// CPU tensors pass through untouched (Input/Output/InOut return them), and a
// stage that saw none other is inactive: every other call is then a no-op.
//
// Errors: absl::Status. kInvalidArgument when an op's device tensors are on
// two devices; kFailedPrecondition when pinned memory cannot be had (no
// usable device); kDeadlineExceeded when the copy to the host has not
// finished by the op's deadline.
//
// Thread-safety: the staging calls (Input, Output, InOut) belong to the
// caller's thread; the other methods may be called from any thread.
#ifndef EMBER_DISTRIBUTED_GLOO_STAGING_H_
#define EMBER_DISTRIBUTED_GLOO_STAGING_H_

#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distributed/process_group.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace ember::distributed::gloo {

class DeviceStaging {
 public:
  DeviceStaging() = default;
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // The host tensor the op uses for `t`: `t` itself on the CPU; for a device
  // tensor, a contiguous pinned host tensor of its shape and dtype.
  // Input: the op reads it; filled by a copy queued now on the op's side
  // stream, which first waits for the device's current stream (of the
  // calling thread), so it sees every write queued before the call.
  absl::StatusOr<Tensor> Input(const Tensor& t) { return Stage(t, true, false); }
  // Output: the op writes it; copied back into `t` by CopyBack.
  absl::StatusOr<Tensor> Output(const Tensor& t) { return Stage(t, false, true); }
  // InOut: both.
  absl::StatusOr<Tensor> InOut(const Tensor& t) { return Stage(t, true, true); }
  // The same for each tensor of a list.
  absl::StatusOr<std::vector<Tensor>> Inputs(absl::Span<const Tensor> ts);
  absl::StatusOr<std::vector<Tensor>> Outputs(absl::Span<const Tensor> ts);

  // Whether a device tensor was staged (the op's Work then waits on the
  // device's stream).
  bool active() const { return device_.has_value(); }

  // Blocks until the copies to the host have finished; kDeadlineExceeded
  // naming `what` when they have not by `deadline`.
  absl::Status WaitForInputs(absl::Time deadline, std::string_view what) const;
  // After the op: queues the copies of the Output/InOut host tensors back to
  // their device tensors on the op's side stream, without waiting, and
  // marks the end of them for BlockCurrentStream.
  absl::Status CopyBack() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the calling thread's current stream on the device wait for the
  // copies back (the host does not wait). OK with nothing copied back.
  absl::Status BlockCurrentStream() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<Tensor> Stage(const Tensor& t, bool read, bool write);

  // Set by the first device tensor (caller's thread, before the op is
  // queued); constant afterwards.
  std::optional<Device> device_;
  Stream stream_{Device(DeviceType::kCPU), 0};
  Event ready_{DeviceType::kCPU};  // after the copies in
  std::vector<std::pair<Tensor, Tensor>> back_;  // (device tensor, host tensor)

  absl::Mutex mu_;
  Event done_ ABSL_GUARDED_BY(mu_){DeviceType::kCPU};  // after the copies back
};

// A Work whose op may have staged device tensors: wait() first waits for the
// host side as Base does, then makes the caller's current stream wait for the
// copies back (Note [gloo on device tensors]). Base: Work or RecvWork.
template <typename Base>
class StagedWork : public Base {
 public:
  using Base::Base;
  using Base::wait;

  // Set by the backend before the Work is handed out.
  void set_staging(std::shared_ptr<DeviceStaging> staging) { staging_ = std::move(staging); }

  absl::Status wait(absl::Duration timeout) override {
    absl::Status s = Base::wait(timeout);
    if (!s.ok() || staging_ == nullptr) return s;
    return staging_->BlockCurrentStream();
  }

 private:
  std::shared_ptr<DeviceStaging> staging_;
};

}  // namespace ember::distributed::gloo

#endif  // EMBER_DISTRIBUTED_GLOO_STAGING_H_
