#include "cuda/device.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "third_party/cuda/device_check.h"

namespace ember::cuda {
namespace {

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Skips a case about the state without a device where one is usable.
#define SKIP_WITH_CUDA()                                                \
  if (is_available())                                                   \
  GTEST_SKIP() << "a CUDA device is usable here; this case checks the " \
                  "state without one"

// First in the file, so that its threads race the process's first probe.
TEST(CudaDeviceTest, ConcurrentFirstCallsAgree) {
  std::vector<int> counts(8, -2);
  std::vector<std::string> reasons(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      counts[i] = device_count();
      reasons[i] = unavailable_reason();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(counts[i], device_count()) << i;
    EXPECT_EQ(reasons[i], unavailable_reason()) << i;
  }
  EXPECT_EQ(is_available(), device_count() > 0);
  EXPECT_EQ(unavailable_reason().empty(), is_available());
}

TEST(CudaDeviceTest, RegistersTheCudaDeviceGuardImplAtLoadTime) {
  DeviceGuardImpl* impl = GetDeviceGuardImpl(DeviceType::kCUDA);
  ASSERT_NE(impl, nullptr);
  EXPECT_EQ(impl->DeviceCount(), device_count());
  EXPECT_EQ(ember::device_count(DeviceType::kCUDA), device_count());
}

TEST(CudaDeviceTest, WithoutADeviceTheReasonIsTheRuntimesError) {
  SKIP_WITH_CUDA();
  int count = -1;
  const cudaError_t error = cudaGetDeviceCount(&count);
  cudaGetLastError();
  EXPECT_FALSE(is_available());
  EXPECT_EQ(device_count(), 0);
  EXPECT_EQ(ember::device_count(DeviceType::kCUDA), 0);
  EXPECT_EQ(current_device(), -1);
  ASSERT_NE(error, cudaSuccess) << "the runtime reports " << count << " devices";
  // This machine has no driver: "cudaErrorInsufficientDriver: CUDA driver
  // version is insufficient for CUDA runtime version".
  EXPECT_TRUE(Contains(unavailable_reason(), cudaGetErrorName(error))) << unavailable_reason();
  EXPECT_TRUE(Contains(unavailable_reason(), cudaGetErrorString(error))) << unavailable_reason();
}

TEST(CudaDeviceTest, WithoutADeviceCallsFailWithTheReason) {
  SKIP_WITH_CUDA();
  const std::vector<std::pair<std::string, absl::Status>> calls = {
      {"cuda::set_device", set_device(0)},
      {"cuda::get_device_properties", get_device_properties(0).status()},
      {"cuda::synchronize", synchronize(0)},
      {"cuda::synchronize", synchronize()},
  };
  for (const auto& [call, status] : calls) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_TRUE(Contains(status.message(), call)) << status;
    EXPECT_TRUE(Contains(status.message(), unavailable_reason())) << status;
  }
  EXPECT_FALSE(ember::get_device_properties(Device(DeviceType::kCUDA, 0)).has_value());
  {
    DeviceGuard guard(Device(DeviceType::kCUDA, 0));  // nothing to set; must not fail
    EXPECT_EQ(current_device(), -1);
  }
}

TEST(CudaDeviceTest, PropertiesOfEachDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (int i = 0; i < device_count(); ++i) {
    absl::StatusOr<DeviceProperties> p = get_device_properties(i);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE(p->name.empty()) << i;
    EXPECT_GT(p->total_memory, int64_t{1} << 30) << p->name;
    EXPECT_GT(p->multi_processor_count, 0) << p->name;
    EXPECT_GE(p->major, 5) << p->name;
    std::optional<DeviceProperties> via_tensor =
        ember::get_device_properties(Device(DeviceType::kCUDA, i));
    ASSERT_TRUE(via_tensor.has_value());
    EXPECT_EQ(via_tensor->name, p->name);
    EXPECT_EQ(via_tensor->total_memory, p->total_memory);
  }
}

TEST(CudaDeviceTest, IndicesOutOfRangeNameTheIndexAndTheCount) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int n = device_count();
  for (const absl::Status& s :
       {set_device(n), set_device(-1), get_device_properties(n).status(), synchronize(n + 3)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Contains(s.message(), "device index")) << s;
    EXPECT_TRUE(Contains(s.message(), absl::StrCat("sees ", n, " CUDA device"))) << s;
  }
  EXPECT_EQ(current_device(), 0);  // the failed calls changed nothing
}

TEST(CudaDeviceTest, CurrentDeviceIsPerThread) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(set_device(0).ok());
  EXPECT_EQ(current_device(), 0);
  EXPECT_TRUE(synchronize().ok());
  EXPECT_TRUE(synchronize(0).ok());
  if (device_count() < 2) GTEST_SKIP() << "telling threads' devices apart needs 2 devices; 1 here";
  ASSERT_TRUE(set_device(1).ok());
  std::thread([] {
    EXPECT_EQ(current_device(), 0);  // a new thread starts on device 0
    {
      DeviceGuard guard(Device(DeviceType::kCUDA, 1));
      EXPECT_EQ(current_device(), 1);
    }
    EXPECT_EQ(current_device(), 0);
  }).join();
  EXPECT_EQ(current_device(), 1);
  {
    DeviceGuard guard(Device(DeviceType::kCUDA, 0));
    EXPECT_EQ(GetDeviceGuardImpl(DeviceType::kCUDA)->GetDevice(), Device(DeviceType::kCUDA, 0));
  }
  EXPECT_EQ(current_device(), 1);
  ASSERT_TRUE(set_device(0).ok());
}

// CUDA_VISIBLE_DEVICES is read by the runtime when the process starts using
// it, so it is checked in a child process: this binary, running only the
// case below with CUDA_VISIBLE_DEVICES="".
TEST(CudaVisibleDevicesChildTest, SeesNoDevice) {
  const char* expected = std::getenv("EMBER_CUDA_CHILD_EXPECT");
  if (expected == nullptr) GTEST_SKIP() << "runs only as the child of CudaVisibleDevicesTest";
  EXPECT_FALSE(is_available());
  EXPECT_EQ(device_count(), 0);
  EXPECT_TRUE(Contains(unavailable_reason(), expected)) << unavailable_reason();
  EXPECT_TRUE(Contains(unavailable_reason(), "CUDA_VISIBLE_DEVICES=\"\"")) << unavailable_reason();
  absl::Status s = set_device(0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(CudaVisibleDevicesTest, EmptyHidesEveryDevice) {
  // With a device, hiding it is the runtime's "no device" error; without a
  // driver the driver error stays.
  const std::string expected = is_available() ? "cudaErrorNoDevice" : unavailable_reason();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    // The child is a test run of its own: keep it off this run's outputs.
    for (const char* name : {"XML_OUTPUT_FILE", "TEST_PREMATURE_EXIT_FILE", "GTEST_OUTPUT"}) {
      unsetenv(name);
    }
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    setenv("EMBER_CUDA_CHILD_EXPECT", expected.substr(0, expected.find(" (")).c_str(), 1);
    execl("/proc/self/exe", "device_test", "--gtest_filter=CudaVisibleDevicesChildTest.*", nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string output;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool timed_out = false;
  for (;;) {
    pollfd p{.fd = out[0], .events = POLLIN};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0 || poll(&p, 1, ms) == 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    output.append(buf, n);
  }
  close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(timed_out) << "the child did not finish within 60 s:\n" << output;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_TRUE(Contains(output, "[  PASSED  ] 1 test.")) << output;
  EXPECT_FALSE(Contains(output, "SKIPPED")) << output;
}

}  // namespace
}  // namespace ember::cuda
