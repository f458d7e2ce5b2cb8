#include "distributed/gloo/staging.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::gloo {

// Note [gloo on device tensors]
// gloo moves host memory only. For an op on device (CUDA) tensors the gloo
// backend does what PyTorch's ProcessGroupGloo does for CUDA tensors, with
// the copies on a side stream of the device's pool, ordered after the work
// the caller had queued:
// - At the call, on the caller's thread: the op takes a stream from the
//   device's pool (get_stream_from_pool), which waits for everything queued
//   so far on the caller's current stream; that side stream is the op's
//   stream from then on, so the caller's own stream carries none of the
//   op's copies and goes on with its kernels. Each device tensor gets a
//   pinned host stand-in. One the op reads is filled by a non-blocking copy
//   queued on the op's stream, so it sees every kernel queued before the
//   call; an event recorded after the copies marks "inputs ready".
// - On the group's worker, in call order with the other collectives: the
//   job waits for "inputs ready" (polling the event, bounded by the op's
//   deadline, so a stuck device cannot hang the worker), runs the gloo
//   algorithm on the host stand-ins exactly as for CPU tensors, then queues
//   non-blocking copies of the written stand-ins back into the device
//   tensors on the op's stream and records "done" after them.
// - The op's Work finishes when the copies back are queued (the host part
//   is over). Its wait() then makes the waiting thread's current stream on
//   the device wait for "done" and returns without blocking the host, as the
//   nccl backend's wait() does; kernels queued on that stream afterwards see
//   the result. A host that reads the device tensors in other ways (another
//   stream, or directly) synchronizes first, as with any CUDA work.
// - Memory: each non-blocking copy records its pinned block against the
//   stream it runs on (Note [Non-blocking copies] in tensor/ops.h), so once
//   the Work drops a stand-in its block is not handed out again before the
//   copy has run; the device tensors are recorded on the op's stream too
//   (Tensor::record_stream), for callers that allocated them on another.
// Two ranks on one GPU (NCCL refuses that) work through this path, which is
// how a one-GPU machine runs DistributedDataParallel on CUDA with several
// ranks.

namespace {

// Tensor ops throw ember::Error; the stage reports a Status.
template <typename F>
absl::Status Catch(const char* what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const Error& e) {
    return absl::FailedPreconditionError(absl::StrCat("gloo backend: ", what, ": ", e.what()));
  }
}

// Records `t` on `stream`, for memory that is stream-ordered (the device's
// caching allocator); other memory (from_blob) is the caller's to keep.
void RecordOn(const Tensor& t, Stream stream) {
  try {
    t.record_stream(stream);
  } catch (const Error&) {
  }
}

}  // namespace

absl::StatusOr<Tensor> DeviceStaging::Stage(const Tensor& t, bool read, bool write) {
  if (t.device().is_cpu()) return t;
  if (!device_) {
    device_ = t.device();
    ready_ = Event(t.device().type());
    {
      absl::MutexLock lock(&mu_);
      done_ = Event(t.device().type());
    }
    // The op's stream: a side stream that first waits for the caller's.
    const Stream caller = current_stream(t.device());
    EMBER_ASSIGN_OR_RETURN(stream_, get_stream_from_pool(t.device()));
    if (stream_ != caller) {
      Event queued(t.device().type());
      EMBER_RETURN_IF_ERROR(queued.record(caller));
      EMBER_RETURN_IF_ERROR(queued.block(stream_));
    }
  } else if (*device_ != t.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: the op's tensors are on ", device_->str(), " and ",
                     t.device().str(), "; put every tensor of one op on one device"));
  }
  Tensor host;
  EMBER_RETURN_IF_ERROR(Catch("staging a device tensor in pinned host memory", [&] {
    host = empty(t.sizes(), TensorOptions(t.dtype()).pinned_memory(true));
    StreamGuard on(stream_);
    if (read) host.copy_(t, /*non_blocking=*/true);
  }));
  if (read) EMBER_RETURN_IF_ERROR(ready_.record(stream_));
  RecordOn(t, stream_);
  if (write) back_.emplace_back(t, host);
  return host;
}

absl::StatusOr<std::vector<Tensor>> DeviceStaging::Inputs(absl::Span<const Tensor> ts) {
  std::vector<Tensor> hosts;
  for (const Tensor& t : ts) {
    EMBER_ASSIGN_OR_RETURN(Tensor host, Input(t));
    hosts.push_back(std::move(host));
  }
  return hosts;
}

absl::StatusOr<std::vector<Tensor>> DeviceStaging::Outputs(absl::Span<const Tensor> ts) {
  std::vector<Tensor> hosts;
  for (const Tensor& t : ts) {
    EMBER_ASSIGN_OR_RETURN(Tensor host, Output(t));
    hosts.push_back(std::move(host));
  }
  return hosts;
}

absl::Status DeviceStaging::WaitForInputs(absl::Time deadline, std::string_view what) const {
  absl::Duration pause = absl::Microseconds(20);
  while (!ready_.query()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          std::string(what), ": the copy of its ", device_->str(),
          " tensors to the host did not finish before the op's timeout (the device is busy "
          "with, or stuck in, work queued before the op)"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

absl::Status DeviceStaging::CopyBack() {
  if (!device_) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  StreamGuard guard(stream_);
  EMBER_RETURN_IF_ERROR(Catch("copying the result back to the device", [&] {
    for (const auto& [device_tensor, host] : back_) device_tensor.copy_(host, /*non_blocking=*/true);
  }));
  return done_.record(stream_);
}

absl::Status DeviceStaging::BlockCurrentStream() {
  if (!device_) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (!done_.was_recorded()) return absl::OkStatus();
  return done_.block(current_stream(*device_));
}

}  // namespace ember::distributed::gloo
