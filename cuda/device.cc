#include "cuda/device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
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

// Note [Fork after CUDA initialisation]
// The CUDA driver does not survive fork(): a child of a process that has
// initialised it gets errors from every call (or hangs). torch marks CUDA
// initialised and, in a pthread_atfork child handler, records that the
// child is a "bad fork"; its calls then fail with a message that says what
// to do. Ember does the same: the first successful device count initialises
// the driver (cuInit) and sets `initialized`; the handler, registered when
// the library loads, sets `bad_fork` in children forked after that. A bad
// fork sees no devices (device_count() is 0, is_available() false) and
// unavailable_reason() is torch's message, so every call reports it through
// the usual no-device path.
std::atomic<bool> initialized{false};
std::atomic<bool> bad_fork{false};

void OnForkChild() {
  if (initialized.load(std::memory_order_relaxed)) bad_fork.store(true, std::memory_order_relaxed);
}

bool InBadFork() { return bad_fork.load(std::memory_order_relaxed); }

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
    } else {
      internal::MarkCudaInitialized();
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
  return internal::InvalidDeviceOrdinal(call, device, device_count());
}

// Note [Restoring the current device]
// cudaSetDevice initialises the device's primary context (since CUDA 12),
// which costs hundreds of MB of device memory; cudaGetDevice does not. A
// guard that restores "the previous device" of a thread that never used it
// (a new thread starts on device 0) would create a context there, so a
// process that only uses cuda:3 would hold one on cuda:0 too. As torch
// (c10::cuda::MaybeSetDevice), Ember restores at once only a device that has
// a primary context (or is the runtime's current one already); otherwise it
// remembers the device as the thread's target: current_device() reports it,
// and the next ExchangeCurrentDevice (every call that works on a device goes
// through one) starts from it. The runtime's own current device then stays
// on the last device the thread worked on; code that calls the runtime
// directly on "the current device" should name its device with a guard.
// Whether a device has a primary context: Ember knows the devices it made
// current, and asks the driver (cuDevicePrimaryCtxGetState) about the others.
thread_local int target_device = -1;
std::atomic<uint64_t> devices_with_context{0};

void NoteContext(int device) {
  if (device >= 0 && device < 64) {
    devices_with_context.fetch_or(uint64_t{1} << device, std::memory_order_relaxed);
  }
}

bool HasPrimaryContext(int device) {
  if (device >= 0 && device < 64 &&
      (devices_with_context.load(std::memory_order_relaxed) >> device & 1) != 0) {
    return true;
  }
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  using Get = CUresult (*)(CUdevice*, int);
  static const std::pair<GetState, Get> driver = [] {
    void* get_state = nullptr;
    void* get = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &get_state, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return std::pair<GetState, Get>(nullptr, nullptr);
    }
    return std::pair<GetState, Get>(reinterpret_cast<GetState>(get_state),
                                    reinterpret_cast<Get>(get));
  }();
  if (driver.first == nullptr) return false;
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (driver.second(&handle, device) != CUDA_SUCCESS) return false;
  if (driver.first(handle, &flags, &active) != CUDA_SUCCESS) return false;
  if (active != 0) NoteContext(device);
  return active != 0;
}

EventHandle* AsEvent(void* event) { return static_cast<EventHandle*>(event); }

// The kCUDA DeviceGuardImpl. Current devices are the runtime's own (per
// thread); current streams are kept here, per thread and device (Note [CUDA
// stream ids] in stream.h).
class CudaGuardImpl final : public DeviceGuardImpl {
 public:
  // Leaves the device alone (and returns the current one) for a device
  // without an index, or when CUDA is unavailable (the calls made under the
  // guard report why). A device that does not exist throws ember::Error
  // with torch's "invalid device ordinal": never the current device instead.
  Device ExchangeDevice(Device device) override {
    const Device previous = GetDevice();
    if (!device.has_index() || !is_available()) return previous;
    CheckIndex("DeviceGuard", device);
    absl::StatusOr<int> was = internal::ExchangeCurrentDevice(device.index());
    if (!was.ok()) internal::ThrowStatus(was.status());
    return Device(DeviceType::kCUDA, *was);
  }

  // The end of a guard: deferred when the device has no context yet (Note
  // [Restoring the current device]).
  void RestoreDevice(Device device) override {
    if (!device.has_index() || !is_available() || device.index() >= device_count()) return;
    internal::RestoreCurrentDevice(device.index());
  }

  Device GetDevice() const override { return Device(DeviceType::kCUDA, current_device()); }

  int DeviceCount() const override { return device_count(); }

  DeviceProperties Properties(int index) const override {
    return get_device_properties(index).value_or(DeviceProperties{});
  }

  ember::Stream GetStream(Device device) const override {
    CheckIndex("current_stream", device);
    if (!InRange(device)) return ember::Stream(device, 0);
    return ember::Stream(device, CurrentStreamIds()[device.index()]);
  }

  absl::StatusOr<ember::Stream> GetStreamFromPool(Device device, bool high_priority) override {
    EMBER_ASSIGN_OR_RETURN(const Stream s, get_stream_from_pool(high_priority, device.index()));
    return s.unwrap();
  }

  ember::Stream ExchangeStream(ember::Stream stream) override {
    const Device device = stream.device();
    CheckIndex("StreamGuard", device);
    if (!InRange(device)) return ember::Stream(device, 0);
    int64_t& current = CurrentStreamIds()[device.index()];
    return ember::Stream(device, std::exchange(current, stream.id()));
  }

  absl::Status SynchronizeStream(ember::Stream stream) override {
    if (is_current_stream_capturing(stream.device().has_index() ? stream.device().index() : -1)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "synchronize(", internal::DescribeStream(stream),
          ") cannot run while the current stream is capturing a CUDA graph: it waits for the "
          "device; synchronize after the capture ends"));
    }
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

  // Throws torch's "invalid device ordinal" for an index that does not
  // exist while CUDA is usable (without it, the calls report why not).
  static void CheckIndex(absl::string_view call, Device device) {
    if (device.has_index() && is_available() && device.index() >= device_count()) {
      internal::ThrowStatus(OutOfRange(call, device.index()));
    }
  }

  // The calling thread's current stream id per device; 0 (the default
  // stream) until ExchangeStream sets another.
  static std::vector<int64_t>& CurrentStreamIds() {
    thread_local std::vector<int64_t> ids(device_count(), 0);
    return ids;
  }
};

// Registered when the library is loaded (the target is alwayslink); the
// runtime is not asked anything until a call needs it. So is the fork
// handler (Note [Fork after CUDA initialisation]).
[[maybe_unused]] const bool registered = [] {
  static CudaGuardImpl* const impl = new CudaGuardImpl();
  SetDeviceGuardImpl(DeviceType::kCUDA, impl);
  pthread_atfork(nullptr, nullptr, &OnForkChild);
  return true;
}();

}  // namespace

bool is_available() { return !InBadFork() && GetProbe().count > 0; }

const std::string& unavailable_reason() {
  return InBadFork() ? internal::ForkedChildReason() : GetProbe().reason;
}

int device_count() { return InBadFork() ? 0 : GetProbe().count; }

int current_device() {
  if (!is_available()) return -1;
  if (target_device >= 0) return target_device;
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
  if (is_current_stream_capturing(index)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda::synchronize(", index, ") cannot run while the current stream is capturing a CUDA "
        "graph: it waits for the device; synchronize after the capture ends"));
  }
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

absl::Status InvalidDeviceOrdinal(absl::string_view call, int device, int count) {
  std::string seen = count == 0 ? "no CUDA devices"
                     : count == 1
                         ? "1 CUDA device (cuda:0)"
                         : absl::StrCat(count, " CUDA devices (cuda:0 to cuda:", count - 1, ")");
  return absl::InvalidArgumentError(absl::StrCat(
      call, ": CUDA error: invalid device ordinal: device index ", device,
      " does not exist; this process sees ", seen, ". Use an index from that range, or set ",
      "CUDA_VISIBLE_DEVICES before the process starts to choose which devices it sees"));
}

absl::StatusOr<int> ExchangeCurrentDevice(int device) {
  int runtime = -1;
  EMBER_CUDA_RETURN_IF_ERROR(cudaGetDevice(&runtime));
  const int previous = target_device >= 0 ? target_device : runtime;
  if (runtime != device) {
    EMBER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  }
  target_device = -1;
  NoteContext(device);  // Work is about to run here: its context exists or will.
  return previous;
}

RestoreAction PlanRestore(int device, int runtime_device, bool device_has_context) {
  if (device == runtime_device) return RestoreAction::kNothing;
  return device_has_context ? RestoreAction::kSetDevice : RestoreAction::kDefer;
}

void RestoreCurrentDevice(int device) {
  int runtime = -1;
  if (cudaGetDevice(&runtime) != cudaSuccess) {
    cudaGetLastError();
    target_device = device;
    return;
  }
  const RestoreAction action =
      PlanRestore(device, runtime, device != runtime && HasPrimaryContext(device));
  target_device = -1;
  if (action == RestoreAction::kSetDevice && cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    target_device = device;
  } else if (action == RestoreAction::kDefer) {
    target_device = device;
  }
}

void MarkCudaInitialized() { initialized.store(true, std::memory_order_relaxed); }

const std::string& ForkedChildReason() {
  static const std::string* const reason = new std::string(
      "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
      "must use the 'spawn' start method (this process was forked after its parent had "
      "initialised CUDA, and the CUDA driver does not survive fork)");
  return *reason;
}

}  // namespace internal

}  // namespace ember::cuda
