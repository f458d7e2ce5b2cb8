// DeviceGuard: makes a device the calling thread's current device for a
// scope, as c10::DeviceGuard / torch.cuda.device; and the per-device-type
// seam behind it, which also answers how many devices of a type there are
// and what they are like.
//
//   {
//     ember::DeviceGuard guard(device);   // cuda:1 current on this thread
//     ...                                 // kernels launch on cuda:1
//   }                                     // the previous device is current again
//   int n = ember::device_count(ember::DeviceType::kCUDA);   // 0 without CUDA
//
// A device type has a current device only when a backend registered a
// DeviceGuardImpl for it (the cuda library will, at load time). The CPU has
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

#include "tensor/device.h"

namespace ember {

// What torch.cuda.get_device_properties reports that Ember uses.
struct DeviceProperties {
  std::string name;
  int64_t total_memory = 0;  // bytes
  int64_t multi_processor_count = 0;
};

// What a backend implements for its device type. Implementations are
// thread-safe; the current device they keep is per thread.
class DeviceGuardImpl {
 public:
  virtual ~DeviceGuardImpl() = default;
  // Makes `device` current on the calling thread; returns the device that was.
  virtual Device ExchangeDevice(Device device) = 0;
  // How many devices of this type the process can use.
  virtual int DeviceCount() const = 0;
  // The properties of device `index` (0 <= index < DeviceCount()).
  virtual DeviceProperties Properties(int index) const = 0;
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
