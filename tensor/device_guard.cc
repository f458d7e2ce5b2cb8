#include "tensor/device_guard.h"

#include <array>
#include <atomic>

#include "absl/strings/str_cat.h"

namespace ember {
namespace {

std::array<std::atomic<DeviceGuardImpl*>, kNumDeviceTypes>& Registry() {
  static std::array<std::atomic<DeviceGuardImpl*>, kNumDeviceTypes> registry{};
  return registry;
}

absl::Status NoEvents(std::string_view what, Device device) {
  return absl::UnimplementedError(absl::StrCat(std::string(what), ": ", device.str(),
                                               " runs its work synchronously and has no events"));
}

}  // namespace

absl::StatusOr<void*> DeviceGuardImpl::CreateEvent(Device device, bool enable_timing) {
  return NoEvents("CreateEvent", device);
}
absl::Status DeviceGuardImpl::RecordEvent(void* event, Stream stream) {
  return NoEvents("RecordEvent", stream.device());
}
absl::Status DeviceGuardImpl::BlockOnEvent(void* event, Stream stream) {
  return NoEvents("BlockOnEvent", stream.device());
}
absl::StatusOr<double> DeviceGuardImpl::ElapsedTime(void* start, void* end) const {
  return absl::UnimplementedError("ElapsedTime: this device type has no events");
}

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
  if (impl_ != nullptr) impl_->RestoreDevice(previous_);
}

}  // namespace ember
