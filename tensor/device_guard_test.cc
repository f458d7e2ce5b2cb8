#include "tensor/device_guard.h"

#include <thread>

#include "gtest/gtest.h"
#include "tensor/stream.h"

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
  Device GetDevice() const override { return current_; }
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

TEST(StreamTest, CpuHasOneStreamAndNoEvents) {
  EXPECT_EQ(current_stream(kCPU), Stream(kCPU, 0));
  EXPECT_EQ(get_stream_from_pool(kCPU).value(), Stream(kCPU, 0));
  EXPECT_TRUE(synchronize(current_stream(kCPU)).ok());
  { StreamGuard guard(Stream(kCPU, 0)); }
  Event event(DeviceType::kCPU, /*enable_timing=*/true);
  EXPECT_TRUE(event.query());  // never recorded: complete
  EXPECT_TRUE(event.block(Stream(kCPU, 0)).ok());
  EXPECT_TRUE(event.synchronize().ok());
  absl::Status recorded = event.record(Stream(kCPU, 0));
  EXPECT_EQ(recorded.code(), absl::StatusCode::kUnimplemented) << recorded;
  EXPECT_NE(recorded.message().find("cpu"), std::string::npos) << recorded;
  EXPECT_FALSE(event.was_recorded());
  absl::StatusOr<double> ms = event.elapsed_time(event);
  EXPECT_EQ(ms.status().code(), absl::StatusCode::kFailedPrecondition) << ms.status();
}

TEST(StreamTest, EventRefusesAStreamOfAnotherDeviceType) {
  Event event(DeviceType::kCUDA);
  absl::Status s = event.record(Stream(kCPU, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s;
  EXPECT_NE(s.message().find("cpu"), std::string::npos) << s;
  Event untimed(DeviceType::kCUDA);
  EXPECT_EQ(untimed.elapsed_time(event).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A type registered without stream support gets the synchronous defaults:
// one stream per device, the guard still switches the device, no events.
TEST(StreamTest, SynchronousDefaultsOfARegisteredType) {
  PerThreadDevices impl;
  SetDeviceGuardImpl(DeviceType::kCUDA, &impl);
  EXPECT_EQ(current_stream(Device(DeviceType::kCUDA)), Stream(Device(DeviceType::kCUDA, 0), 0));
  {
    StreamGuard guard(Stream(Device(DeviceType::kCUDA, 1), 0));
    EXPECT_EQ(PerThreadDevices::current(), Device(DeviceType::kCUDA, 1));
    EXPECT_EQ(current_stream(Device(DeviceType::kCUDA)), Stream(Device(DeviceType::kCUDA, 1), 0));
  }
  EXPECT_EQ(PerThreadDevices::current(), Device(DeviceType::kCUDA, 0));
  // The pool is the one stream; a device without an index is the current one.
  EXPECT_EQ(get_stream_from_pool(Device(DeviceType::kCUDA), /*high_priority=*/true).value(),
            Stream(Device(DeviceType::kCUDA, 0), 0));
  EXPECT_EQ(get_stream_from_pool(Device(DeviceType::kCUDA, 1)).value(),
            Stream(Device(DeviceType::kCUDA, 1), 0));
  Event event(DeviceType::kCUDA);
  EXPECT_EQ(event.record(Stream(Device(DeviceType::kCUDA, 1), 0)).code(),
            absl::StatusCode::kUnimplemented);
  SetDeviceGuardImpl(DeviceType::kCUDA, nullptr);
}

}  // namespace
}  // namespace ember
