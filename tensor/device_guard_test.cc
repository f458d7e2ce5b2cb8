#include "tensor/device_guard.h"

#include <thread>

#include "gtest/gtest.h"

namespace ember {
namespace {

TEST(DeviceGuardTest, CpuHasNoCurrentDeviceAndOneDevice) {
  EXPECT_EQ(GetDeviceGuardImpl(DeviceType::kCPU), nullptr);
  EXPECT_EQ(device_count(DeviceType::kCPU), 1);
  EXPECT_EQ(device_count(DeviceType::kCUDA), 0);
  EXPECT_FALSE(get_device_properties(Device(DeviceType::kCPU, 0)).has_value());
  DeviceGuard guard(kCPU);  // nothing to set; must not fail
}

// A backend's implementation in its simplest real form: one current device
// per thread, fixed properties.
class PerThreadDevices final : public DeviceGuardImpl {
 public:
  Device ExchangeDevice(Device device) override {
    Device previous = current_;
    current_ = device;
    return previous;
  }
  int DeviceCount() const override { return 2; }
  DeviceProperties Properties(int index) const override {
    return {.name = "device", .total_memory = (index + 1) << 20, .multi_processor_count = 4};
  }
  static Device current() { return current_; }

 private:
  static thread_local Device current_;
};
thread_local Device PerThreadDevices::current_{DeviceType::kCUDA, 0};

TEST(DeviceGuardTest, RegisteredTypeSetsAndRestoresTheThreadsDevice) {
  PerThreadDevices impl;
  SetDeviceGuardImpl(DeviceType::kCUDA, &impl);
  EXPECT_EQ(device_count(DeviceType::kCUDA), 2);
  EXPECT_EQ(get_device_properties(Device(DeviceType::kCUDA, 1))->total_memory, 2 << 20);
  EXPECT_FALSE(get_device_properties(Device(DeviceType::kCUDA, 2)).has_value());
  {
    DeviceGuard guard(Device(DeviceType::kCUDA, 1));
    EXPECT_EQ(PerThreadDevices::current(), Device(DeviceType::kCUDA, 1));
    std::thread([] {
      EXPECT_EQ(PerThreadDevices::current(), Device(DeviceType::kCUDA, 0));
    }).join();
    {
      DeviceGuard inner(Device(DeviceType::kCUDA));  // no index: leaves the device alone
      EXPECT_EQ(PerThreadDevices::current(), Device(DeviceType::kCUDA, 1));
    }
  }
  EXPECT_EQ(PerThreadDevices::current(), Device(DeviceType::kCUDA, 0));
  SetDeviceGuardImpl(DeviceType::kCUDA, nullptr);
  EXPECT_EQ(device_count(DeviceType::kCUDA), 0);
}

}  // namespace
}  // namespace ember
