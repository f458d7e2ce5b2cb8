#include "tensor/device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, ParsesTorchForms) {
  absl::StatusOr<Device> cpu = Device::parse("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->is_cpu());
  EXPECT_FALSE(cpu->has_index());
  absl::StatusOr<Device> cuda1 = Device::parse("cuda:1");
  ASSERT_TRUE(cuda1.ok());
  EXPECT_TRUE(cuda1->is_cuda());
  EXPECT_EQ(cuda1->index(), 1);
  EXPECT_EQ(cuda1->str(), "cuda:1");
  absl::StatusOr<Device> cuda = Device::parse("cuda");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->index(), -1);
  EXPECT_EQ(cuda->str(), "cuda");
  EXPECT_EQ(Device::parse("cpu:0")->index(), 0);
  EXPECT_EQ(*Device::parse("cuda:12"), Device(DeviceType::kCUDA, 12));
}

TEST(DeviceTest, RejectsBadStringsNamingThem) {
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", "", "CUDA:0", "cpu:1",
                          "cuda:0:1", " cuda"}) {
    absl::StatusOr<Device> d = Device::parse(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(std::string("'") + bad + "'"));
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("expected 'cpu', 'cuda' or 'cuda:N'"));
  }
}

}  // namespace
}  // namespace ember
