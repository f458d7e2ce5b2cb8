#include "nn/device_kernels.h"

#include <string>

#include "gtest/gtest.h"
#include "tensor/error.h"

namespace ember::nn::internal {
namespace {

using TwiceFn = int(int);

int TwiceOnCpu(int x) { return 2 * x; }

constinit DeviceKernel<TwiceFn> twice{"twice"};
EMBER_REGISTER_NN_KERNEL(twice, DeviceType::kCPU, &TwiceOnCpu);

TEST(DeviceKernelTest, CallsTheKernelRegisteredForTheDeviceType) {
  EXPECT_TRUE(twice.has(DeviceType::kCPU));
  EXPECT_EQ(twice(kCPU)(21), 42);
}

TEST(DeviceKernelTest, ADeviceWithoutAKernelIsAnErrorNamingTheOpAndTheDevice) {
  EXPECT_FALSE(twice.has(DeviceType::kCUDA));
  try {
    twice(Device(DeviceType::kCUDA, 1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("twice"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:1"), std::string::npos) << what;
  }
}

TEST(DeviceKernelTest, ASecondRegistrationForOneTypeIsRefused) {
  constinit static DeviceKernel<TwiceFn> once{"once"};
  EXPECT_TRUE(once.Register(DeviceType::kCPU, &TwiceOnCpu));
  EXPECT_THROW(once.Register(DeviceType::kCPU, &TwiceOnCpu), Error);
  EXPECT_EQ(once(kCPU)(4), 8);
}

}  // namespace
}  // namespace ember::nn::internal
