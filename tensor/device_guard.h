// DeviceGuard: makes a device the calling thread's current device for a
// scope, as c10::DeviceGuard / torch.cuda.device; and the per-device-type
// seam behind it, which also answers how many devices of a type there are,
// what they are like, and runs their streams and events (tensor/stream.h).
//
//   {
//     ember::DeviceGuard guard(device);   // cuda:1 current on this thread
//     ...                                 // kernels launch on cuda:1
//   }                                     // the previous device is current again
//   int n = ember::device_count(ember::DeviceType::kCUDA);   // 0 without CUDA
//
// A device type has a current device only when a backend registered a
// DeviceGuardImpl for it (//cuda:device does, at load time). The CPU has
// none: a guard on a CPU device does nothing, so code written for a list of
// devices (parallel/parallel_apply.h) runs unchanged on CPU "devices".
//
// Thread-safety: the registry is thread-safe; a guard belongs to the thread
// that made it (the current device is per thread).
#ifndef EMBER_TENSOR_DEVICE_GUARD_H_
#define EMBER_TENSOR_DEVICE_GUARD_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/device.h"

namespace ember {

// What torch.cuda.get_device_properties reports that Ember uses.
struct DeviceProperties {
  std::string name;
  int64_t total_memory = 0;  // bytes
  int64_t multi_processor_count = 0;
  int major = 0;  // compute capability
  int minor = 0;
};

// What a backend implements for its device type. Implementations are
// thread-safe; the current device and current streams they keep are per
// thread. The stream and event members have defaults for a type that runs
// its work synchronously (one stream, id 0, always idle; no events): a
// backend with asynchronous queues overrides all of them. Event handles are
// the backend's, created by CreateEvent and released by DestroyEvent;
// tensor/stream.h's Event owns one.
class DeviceGuardImpl {
 public:
  virtual ~DeviceGuardImpl() = default;
  // Makes `device` current on the calling thread; returns the device that was.
  virtual Device ExchangeDevice(Device device) = 0;
  // Makes `device` current again at the end of a guard (DeviceGuard,
  // StreamGuard). A backend may defer it while nothing runs there (CUDA does
  // for a device without a context yet); by default, ExchangeDevice.
  virtual void RestoreDevice(Device device) { ExchangeDevice(device); }
  // The calling thread's current device: with its index, or without one when
  // the type has no usable device.
  virtual Device GetDevice() const = 0;
  // How many devices of this type the process can use.
  virtual int DeviceCount() const = 0;
  // The properties of device `index` (0 <= index < DeviceCount()).
  virtual DeviceProperties Properties(int index) const = 0;

  // The calling thread's current stream on `device` (which has an index).
  virtual Stream GetStream(Device device) const { return Stream(device, 0); }
  // Makes `stream` current on its device for the calling thread; returns the
  // stream that was.
  virtual Stream ExchangeStream(Stream stream) { return Stream(stream.device(), 0); }
  // Blocks until the work queued on `stream` has finished.
  virtual absl::Status SynchronizeStream(Stream stream) { return absl::OkStatus(); }
  // True when the work queued on `stream` has finished.
  virtual bool QueryStream(Stream stream) const { return true; }
  // A stream of `device` (which has an index) for work beside the caller's
  // streams (c10's getStreamFromGlobalPool): the next of the backend's pool
  // of that priority. By default the one stream.
  virtual absl::StatusOr<Stream> GetStreamFromPool(Device device, bool high_priority) {
    return Stream(device, 0);
  }

  // A new event on `device`; `enable_timing` allows ElapsedTime on it.
  virtual absl::StatusOr<void*> CreateEvent(Device device, bool enable_timing);
  virtual void DestroyEvent(void* event, Device device) noexcept {}
  // Marks the point `stream` has reached; the event completes when the work
  // queued before it does.
  virtual absl::Status RecordEvent(void* event, Stream stream);
  // Makes work queued on `stream` from now on wait for `event` (the calling
  // thread does not wait).
  virtual absl::Status BlockOnEvent(void* event, Stream stream);
  // True when the work before the event's last record has finished.
  virtual bool QueryEvent(void* event) const { return true; }
  // Blocks the calling thread until the event completes.
  virtual absl::Status SynchronizeEvent(void* event) { return absl::OkStatus(); }
  // Milliseconds between two completed events recorded with timing.
  virtual absl::StatusOr<double> ElapsedTime(void* start, void* end) const;
};

// The implementation registered for `type`, or null (always for the CPU
// unless one was registered).
DeviceGuardImpl* GetDeviceGuardImpl(DeviceType type);
// Registers `impl` (not owned; must outlive its use; null unregisters) for `type`.
void SetDeviceGuardImpl(DeviceType type, DeviceGuardImpl* impl);

// The number of devices of `type`: the registered implementation's count, 1
// for the CPU without one, 0 for any other type without one.
int device_count(DeviceType type);
// The properties of `device` (which needs an index), or nullopt when its
// type has no implementation registered (the CPU) or the index is out of range.
std::optional<DeviceProperties> get_device_properties(Device device);

// Scoped: `device` is current on this thread until the guard ends, then the
// previous one is again. A no-op for a type with no implementation (the
// CPU) and for a device without an index.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  DeviceGuardImpl* impl_ = nullptr;
  Device previous_;
};

}  // namespace ember

#endif  // EMBER_TENSOR_DEVICE_GUARD_H_
