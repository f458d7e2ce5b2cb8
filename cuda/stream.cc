#include "cuda/stream.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "cuda/status.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::cuda {
namespace {

enum PoolKind : int { kNormalPriority = 0, kHighPriority = 1 };

int64_t PoolStreamId(PoolKind kind, int index) { return 1 + kind * kStreamsPerPool + index; }

// One device's two pools (Note [CUDA stream ids]). A pool's streams are
// written once, under `mu`, before `ready` is set; readers check `ready`.
struct DevicePools {
  std::mutex mu;
  std::array<std::atomic<bool>, 2> ready{};
  std::array<std::array<cudaStream_t, kStreamsPerPool>, 2> streams{};
  std::array<int, 2> priority{};
  std::array<std::atomic<uint32_t>, 2> next{};
};

// Every device's pools. Never destroyed, like the streams in them: the
// runtime tears its contexts down at exit, and destroying streams after
// that fails.
DevicePools* Pools() {
  static DevicePools* const pools = new DevicePools[device_count()];
  return pools;
}

absl::Status CreatePool(int device, PoolKind kind) {
  DevicePools& pools = Pools()[device];
  std::lock_guard<std::mutex> lock(pools.mu);
  if (pools.ready[kind].load(std::memory_order_relaxed)) return absl::OkStatus();
  return internal::OnDevice(device, [&]() -> absl::Status {
    int least = 0, greatest = 0;
    EMBER_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    // torch's pools: priority 0 (the runtime's default) and the greatest.
    const int priority = kind == kHighPriority ? greatest : 0;
    std::array<cudaStream_t, kStreamsPerPool> made{};
    for (int i = 0; i < kStreamsPerPool; ++i) {
      const cudaError_t error =
          cudaStreamCreateWithPriority(&made[i], cudaStreamNonBlocking, priority);
      if (error != cudaSuccess) {
        for (int j = 0; j < i; ++j) cudaStreamDestroy(made[j]);
        return runtime_status(
            error, absl::StrCat("cudaStreamCreateWithPriority(priority ", priority, ") for the ",
                                kind == kHighPriority ? "high" : "normal",
                                "-priority stream pool of cuda:", device));
      }
    }
    pools.streams[kind] = made;
    pools.priority[kind] = priority;
    pools.ready[kind].store(true, std::memory_order_release);
    return absl::OkStatus();
  });
}

}  // namespace

namespace internal {

std::string DescribeStream(ember::Stream stream) {
  if (stream.id() == 0) return absl::StrCat(stream.device().str(), " default stream");
  return absl::StrCat(stream.device().str(), " stream ", stream.id());
}

absl::StatusOr<ResolvedStream> ResolveStream(absl::string_view call, ember::Stream stream) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": ", DescribeStream(stream),
                                                   " is not a CUDA stream; pass a stream of a "
                                                   "cuda device"));
  }
  EMBER_ASSIGN_OR_RETURN(const int device, CheckDevice(call, stream.device().index()));
  const int64_t id = stream.id();
  if (id == 0) return ResolvedStream{.device = device, .handle = nullptr, .priority = 0};
  if (id < 0 || id > 2 * kStreamsPerPool) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": cuda:", device, " has no stream ", id, "; its stream ids are 0 (the default ",
        "stream) and 1 to ", 2 * kStreamsPerPool,
        " (its stream pools); get streams from cuda::get_stream_from_pool"));
  }
  const PoolKind kind = (id - 1) < kStreamsPerPool ? kNormalPriority : kHighPriority;
  DevicePools& pools = Pools()[device];
  if (!pools.ready[kind].load(std::memory_order_acquire)) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": cuda:", device, " stream ", id,
                     " does not exist yet: its pool is made by the first "
                     "cuda::get_stream_from_pool(",
                     kind == kHighPriority ? "true" : "false", ", ", device, ") call"));
  }
  return ResolvedStream{.device = device,
                        .handle = pools.streams[kind][(id - 1) % kStreamsPerPool],
                        .priority = pools.priority[kind]};
}

}  // namespace internal

absl::StatusOr<Stream> Stream::wrap(ember::Stream stream) {
  EMBER_ASSIGN_OR_RETURN(internal::ResolvedStream resolved,
                         internal::ResolveStream("cuda::Stream::wrap", stream));
  return Stream(ember::Stream(Device(DeviceType::kCUDA, resolved.device), stream.id()),
                resolved.handle, resolved.priority);
}

bool Stream::query() const { return GetDeviceGuardImpl(DeviceType::kCUDA)->QueryStream(stream_); }

absl::Status Stream::synchronize() const { return ember::synchronize(stream_); }

absl::Status Stream::wait_event(ember::Event& event) const { return event.block(stream_); }

absl::Status Stream::wait_stream(const Stream& other) const {
  ember::Event reached(DeviceType::kCUDA);
  EMBER_RETURN_IF_ERROR(reached.record(other));
  // Destroying `reached` before the wait has run is fine: the runtime keeps a
  // pending event until it completes.
  return reached.block(stream_);
}

absl::Status Stream::record_event(ember::Event& event) const { return event.record(stream_); }

absl::StatusOr<Stream> get_stream_from_pool(bool is_high_priority, int device) {
  EMBER_ASSIGN_OR_RETURN(const int index,
                         internal::CheckDevice("cuda::get_stream_from_pool", device));
  const PoolKind kind = is_high_priority ? kHighPriority : kNormalPriority;
  DevicePools& pools = Pools()[index];
  if (!pools.ready[kind].load(std::memory_order_acquire)) {
    EMBER_RETURN_IF_ERROR(CreatePool(index, kind));
  }
  const int next =
      static_cast<int>(pools.next[kind].fetch_add(1, std::memory_order_relaxed) % kStreamsPerPool);
  return Stream::wrap(ember::Stream(Device(DeviceType::kCUDA, index), PoolStreamId(kind, next)));
}

absl::StatusOr<Stream> default_stream(int device) {
  EMBER_ASSIGN_OR_RETURN(const int index, internal::CheckDevice("cuda::default_stream", device));
  return Stream::wrap(ember::Stream(Device(DeviceType::kCUDA, index), 0));
}

absl::StatusOr<Stream> current_stream(int device) {
  EMBER_ASSIGN_OR_RETURN(const int index, internal::CheckDevice("cuda::current_stream", device));
  return Stream::wrap(ember::current_stream(Device(DeviceType::kCUDA, index)));
}

bool is_current_stream_capturing(int device) {
  if (!is_available()) return false;
  absl::StatusOr<Stream> s = current_stream(device);
  if (!s.ok()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s->stream(), &status) != cudaSuccess) return false;
  return status == cudaStreamCaptureStatusActive;
}

namespace internal {

std::optional<unsigned long long> CaptureIdOf(ember::Stream stream) {
  absl::StatusOr<ResolvedStream> resolved = ResolveStream("capture query", stream);
  if (!resolved.ok()) return std::nullopt;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(resolved->handle, &status, &id) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive) {
    return std::nullopt;
  }
  return id;
}

void CheckNotCapturing(Device device, const char* what) {
  const int index = device.has_index() ? device.index() : -1;
  if (!is_current_stream_capturing(index)) return;
  EMBER_FAIL(what, " cannot run while ", DescribeStream(ember::current_stream(device)),
             " is capturing a CUDA graph: it waits for the device, which a captured graph cannot "
             "do; move it out of the captured region (read the graph's outputs after replay())");
}

}  // namespace internal

}  // namespace ember::cuda
