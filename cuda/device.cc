#include "cuda/device.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/status.h"
#include "cuda/stream.h"
#include "tensor/status_macros.h"

namespace ember::cuda {
namespace {

// What the runtime said the first time it was asked for the device count.
struct Probe {
  int count = 0;
  std::string reason;  // empty when count > 0
};

const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    const cudaError_t error = cudaGetDeviceCount(&p.count);
    if (error != cudaSuccess) {
      cudaGetLastError();  // not sticky; later calls start clean
      p.count = 0;
      p.reason = absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
    } else if (p.count == 0) {
      p.reason = "the CUDA runtime reports 0 devices";
    }
    if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
        visible != nullptr && p.count == 0) {
      absl::StrAppend(&p.reason, " (CUDA_VISIBLE_DEVICES=\"", visible, "\")");
    }
    return p;
  }();
  return probe;
}

// An event handle of the kCUDA DeviceGuardImpl: the event and its device,
// so that every call on it runs with that device current.
struct EventHandle {
  cudaEvent_t event;
  int device;
};

absl::Status OutOfRange(absl::string_view call, int device) {
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": device index ", device, " is out of range; this process sees ",
                   device_count(), " CUDA device", device_count() == 1 ? "" : "s", " (0 to ",
                   device_count() - 1, "); CUDA_VISIBLE_DEVICES chooses which"));
}

EventHandle* AsEvent(void* event) { return static_cast<EventHandle*>(event); }

// The kCUDA DeviceGuardImpl. Current devices are the runtime's own (per
// thread); current streams are kept here, per thread and device (Note [CUDA
// stream ids] in stream.h).
class CudaGuardImpl final : public DeviceGuardImpl {
 public:
  // Leaves the device alone (and returns the current one) for a device
  // without an index or out of range: DeviceGuard cannot report errors, and
  // the calls made under it check their own devices.
  Device ExchangeDevice(Device device) override {
    const Device previous = GetDevice();
    if (!device.has_index() || device.index() >= device_count()) return previous;
    (void)internal::ExchangeCurrentDevice(device.index());
    return previous;
  }

  Device GetDevice() const override { return Device(DeviceType::kCUDA, current_device()); }

  int DeviceCount() const override { return device_count(); }

  DeviceProperties Properties(int index) const override {
    return get_device_properties(index).value_or(DeviceProperties{});
  }

  ember::Stream GetStream(Device device) const override {
    if (!InRange(device)) return ember::Stream(device, 0);
    return ember::Stream(device, CurrentStreamIds()[device.index()]);
  }

  ember::Stream ExchangeStream(ember::Stream stream) override {
    const Device device = stream.device();
    if (!InRange(device)) return ember::Stream(device, 0);
    int64_t& current = CurrentStreamIds()[device.index()];
    return ember::Stream(device, std::exchange(current, stream.id()));
  }

  absl::Status SynchronizeStream(ember::Stream stream) override {
    EMBER_ASSIGN_OR_RETURN(const internal::ResolvedStream s,
                           internal::ResolveStream("synchronize", stream));
    return internal::OnDevice(s.device, [&] {
      return runtime_status(
          cudaStreamSynchronize(s.handle),
          absl::StrCat("cudaStreamSynchronize(", internal::DescribeStream(stream), ")"));
    });
  }

  // A stream that cannot be resolved or queried has nothing to wait for.
  bool QueryStream(ember::Stream stream) const override {
    absl::StatusOr<internal::ResolvedStream> s = internal::ResolveStream("query", stream);
    if (!s.ok()) return true;
    absl::StatusOr<bool> done = internal::OnDevice(s->device, [&]() -> absl::StatusOr<bool> {
      const cudaError_t error = cudaStreamQuery(s->handle);
      if (error == cudaErrorNotReady) return false;
      if (error != cudaSuccess) cudaGetLastError();
      return true;
    });
    return done.value_or(true);
  }

  absl::StatusOr<void*> CreateEvent(Device device, bool enable_timing) override {
    EMBER_ASSIGN_OR_RETURN(const int index, internal::CheckDevice("Event::record", device.index()));
    auto handle = std::make_unique<EventHandle>(EventHandle{nullptr, index});
    EMBER_RETURN_IF_ERROR(internal::OnDevice(index, [&] {
      return runtime_status(
          cudaEventCreateWithFlags(&handle->event,
                                   enable_timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags(&event, ...)");
    }));
    return handle.release();
  }

  void DestroyEvent(void* event, Device device) noexcept override {
    std::unique_ptr<EventHandle> handle(AsEvent(event));
    // Fails only when the runtime is already shutting down at exit, when
    // the event goes with its context anyway.
    (void)internal::OnDevice(handle->device, [&] {
      return runtime_status(cudaEventDestroy(handle->event), "cudaEventDestroy(event)");
    });
  }

  absl::Status RecordEvent(void* event, ember::Stream stream) override {
    EMBER_ASSIGN_OR_RETURN(const internal::ResolvedStream s,
                           internal::ResolveStream("Event::record", stream));
    const EventHandle* e = AsEvent(event);
    if (e->device != s.device) {
      return absl::InvalidArgumentError(
          absl::StrCat("Event::record: an event of cuda:", e->device, " cannot be recorded on ",
                       internal::DescribeStream(stream), "; use one event per device"));
    }
    return internal::OnDevice(s.device, [&] {
      return runtime_status(
          cudaEventRecord(e->event, s.handle),
          absl::StrCat("cudaEventRecord(event, ", internal::DescribeStream(stream), ")"));
    });
  }

  absl::Status BlockOnEvent(void* event, ember::Stream stream) override {
    EMBER_ASSIGN_OR_RETURN(const internal::ResolvedStream s,
                           internal::ResolveStream("Event::block", stream));
    return internal::OnDevice(s.device, [&] {
      return runtime_status(
          cudaStreamWaitEvent(s.handle, AsEvent(event)->event, 0),
          absl::StrCat("cudaStreamWaitEvent(", internal::DescribeStream(stream), ", event)"));
    });
  }

  // An event whose query fails has nothing to wait for; SynchronizeEvent
  // reports the error.
  bool QueryEvent(void* event) const override {
    const EventHandle* e = AsEvent(event);
    absl::StatusOr<bool> done = internal::OnDevice(e->device, [&]() -> absl::StatusOr<bool> {
      const cudaError_t error = cudaEventQuery(e->event);
      if (error == cudaErrorNotReady) return false;
      if (error != cudaSuccess) cudaGetLastError();
      return true;
    });
    return done.value_or(true);
  }

  absl::Status SynchronizeEvent(void* event) override {
    const EventHandle* e = AsEvent(event);
    return internal::OnDevice(e->device, [&] {
      return runtime_status(cudaEventSynchronize(e->event), "cudaEventSynchronize(event)");
    });
  }

  absl::StatusOr<double> ElapsedTime(void* start, void* end) const override {
    const EventHandle* s = AsEvent(start);
    const EventHandle* e = AsEvent(end);
    return internal::OnDevice(s->device, [&]() -> absl::StatusOr<double> {
      float ms = 0;
      const cudaError_t error = cudaEventElapsedTime(&ms, s->event, e->event);
      if (error == cudaErrorNotReady) {
        cudaGetLastError();
        return absl::FailedPreconditionError(
            absl::StrCat("Event::elapsed_time: the events on cuda:", s->device,
                         " have not both completed; synchronize() the end event before timing"));
      }
      EMBER_RETURN_IF_ERROR(runtime_status(error, "cudaEventElapsedTime(&ms, start, end)"));
      return static_cast<double>(ms);
    });
  }

 private:
  static bool InRange(Device device) {
    return device.has_index() && device.index() < device_count();
  }

  // The calling thread's current stream id per device; 0 (the default
  // stream) until ExchangeStream sets another.
  static std::vector<int64_t>& CurrentStreamIds() {
    thread_local std::vector<int64_t> ids(device_count(), 0);
    return ids;
  }
};

// Registered when the library is loaded (the target is alwayslink); the
// runtime is not asked anything until a call needs it.
[[maybe_unused]] const bool registered = [] {
  static CudaGuardImpl* const impl = new CudaGuardImpl();
  SetDeviceGuardImpl(DeviceType::kCUDA, impl);
  return true;
}();

}  // namespace

bool is_available() { return GetProbe().count > 0; }

const std::string& unavailable_reason() { return GetProbe().reason; }

int device_count() { return GetProbe().count; }

int current_device() {
  if (!is_available()) return -1;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

absl::Status set_device(int device) {
  EMBER_RETURN_IF_ERROR(internal::CheckAvailable("cuda::set_device"));
  // -1 is no "current device" here: torch.cuda.set_device(-1) sets nothing.
  if (device < 0) return OutOfRange("cuda::set_device", device);
  EMBER_ASSIGN_OR_RETURN(const int index, internal::CheckDevice("cuda::set_device", device));
  return internal::ExchangeCurrentDevice(index).status();
}

absl::StatusOr<DeviceProperties> get_device_properties(int device) {
  EMBER_ASSIGN_OR_RETURN(const int index,
                         internal::CheckDevice("cuda::get_device_properties", device));
  static std::mutex mu;
  static std::vector<std::optional<DeviceProperties>>* const cache =
      new std::vector<std::optional<DeviceProperties>>(device_count());
  std::lock_guard<std::mutex> lock(mu);
  std::optional<DeviceProperties>& cached = (*cache)[index];
  if (!cached.has_value()) {
    cudaDeviceProp prop;
    EMBER_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));
    cached = DeviceProperties{.name = prop.name,
                              .total_memory = static_cast<int64_t>(prop.totalGlobalMem),
                              .multi_processor_count = prop.multiProcessorCount,
                              .major = prop.major,
                              .minor = prop.minor};
  }
  return *cached;
}

absl::Status synchronize(int device) {
  EMBER_ASSIGN_OR_RETURN(const int index, internal::CheckDevice("cuda::synchronize", device));
  return internal::OnDevice(
      index, [] { return runtime_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize()"); });
}

namespace internal {

absl::Status CheckAvailable(absl::string_view call) {
  if (is_available()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": CUDA is not available in this process: ", unavailable_reason()));
}

absl::StatusOr<int> CheckDevice(absl::string_view call, int device) {
  EMBER_RETURN_IF_ERROR(CheckAvailable(call));
  if (device == -1) device = current_device();
  if (device < 0 || device >= device_count()) return OutOfRange(call, device);
  return device;
}

absl::StatusOr<int> ExchangeCurrentDevice(int device) {
  int current = -1;
  EMBER_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  if (current != device) {
    EMBER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  }
  return current;
}

}  // namespace internal

}  // namespace ember::cuda
