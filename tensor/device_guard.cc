#include "tensor/device_guard.h"

#include <array>
#include <atomic>

namespace ember {
namespace {

std::array<std::atomic<DeviceGuardImpl*>, kNumDeviceTypes>& Registry() {
  static std::array<std::atomic<DeviceGuardImpl*>, kNumDeviceTypes> registry{};
  return registry;
}

}  // namespace

DeviceGuardImpl* GetDeviceGuardImpl(DeviceType type) {
  return Registry()[static_cast<int>(type)].load(std::memory_order_acquire);
}

void SetDeviceGuardImpl(DeviceType type, DeviceGuardImpl* impl) {
  Registry()[static_cast<int>(type)].store(impl, std::memory_order_release);
}

int device_count(DeviceType type) {
  if (DeviceGuardImpl* impl = GetDeviceGuardImpl(type)) return impl->DeviceCount();
  return type == DeviceType::kCPU ? 1 : 0;
}

std::optional<DeviceProperties> get_device_properties(Device device) {
  DeviceGuardImpl* impl = GetDeviceGuardImpl(device.type());
  if (impl == nullptr || !device.has_index() || device.index() >= impl->DeviceCount()) {
    return std::nullopt;
  }
  return impl->Properties(device.index());
}

DeviceGuard::DeviceGuard(Device device) : previous_(device) {
  if (!device.has_index()) return;
  impl_ = GetDeviceGuardImpl(device.type());
  if (impl_ != nullptr) previous_ = impl_->ExchangeDevice(device);
}

DeviceGuard::~DeviceGuard() {
  if (impl_ != nullptr) impl_->ExchangeDevice(previous_);
}

}  // namespace ember
