#include "cuda/device.h"

#include <cuda.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cuda/stream.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/stream.h"
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

TEST(CudaDeviceTest, InvalidDeviceOrdinalIsTorchsErrorWithIndexCountAndRemedy) {
  absl::Status s = internal::InvalidDeviceOrdinal("empty", 1, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "empty: CUDA error: invalid device ordinal")) << s;
  EXPECT_TRUE(Contains(s.message(), "device index 1 does not exist")) << s;
  EXPECT_TRUE(Contains(s.message(), "sees 1 CUDA device (cuda:0)")) << s;
  EXPECT_TRUE(Contains(s.message(), "CUDA_VISIBLE_DEVICES")) << s;
  s = internal::InvalidDeviceOrdinal("DeviceGuard", 7, 4);
  EXPECT_TRUE(Contains(s.message(), "device index 7 does not exist")) << s;
  EXPECT_TRUE(Contains(s.message(), "sees 4 CUDA devices (cuda:0 to cuda:3)")) << s;
  s = internal::InvalidDeviceOrdinal("cuda::set_device", -2, 2);
  EXPECT_TRUE(Contains(s.message(), "device index -2 does not exist")) << s;
}

// A device that does not exist is an error wherever it is named, never the
// current device instead (torch: "CUDA error: invalid device ordinal").
TEST(CudaDeviceTest, NamingADeviceThatDoesNotExistThrowsInvalidDeviceOrdinal) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Device missing(DeviceType::kCUDA, device_count());
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  for (const std::string& e : {error_of([&] { DeviceGuard guard(missing); }),
                               error_of([&] { ember::current_stream(missing); }),
                               error_of([&] { StreamGuard guard(ember::Stream(missing, 0)); })}) {
    EXPECT_TRUE(Contains(e, "CUDA error: invalid device ordinal")) << e;
    EXPECT_TRUE(Contains(e, absl::StrCat("device index ", device_count()))) << e;
  }
  EXPECT_EQ(current_device(), 0) << "the failed guards changed nothing";
  absl::Status s = set_device(device_count());
  EXPECT_TRUE(Contains(s.message(), "CUDA error: invalid device ordinal")) << s;
}

TEST(CudaDeviceTest, RestoringADeviceWithoutAContextIsDeferred) {
  using internal::PlanRestore;
  using internal::RestoreAction;
  // The runtime is already there: nothing to do.
  EXPECT_EQ(PlanRestore(0, 0, false), RestoreAction::kNothing);
  EXPECT_EQ(PlanRestore(2, 2, true), RestoreAction::kNothing);
  // A device with a context is set at once (cheap, creates nothing).
  EXPECT_EQ(PlanRestore(0, 3, true), RestoreAction::kSetDevice);
  // A device without one (a new thread's device 0 in a process that works on
  // cuda:3) is only remembered: setting it would create a context there.
  EXPECT_EQ(PlanRestore(0, 3, false), RestoreAction::kDefer);
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

// Runs `body` in a forked child (no gtest there: it writes what went wrong
// to the fd it is given and returns its exit code) and waits for it, 60 s at
// most. Returns the child's report, or why it has none.
std::string ForkAndWait(const std::function<int(int fd)>& body) {
  int out[2];
  if (pipe(out) != 0) return "pipe failed";
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    close(out[0]);
    const int code = body(out[1]);
    _exit(code);
  }
  close(out[1]);
  std::string output;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    pollfd p{.fd = out[0], .events = POLLIN, .revents = 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0 || poll(&p, 1, ms) == 0) {
      kill(pid, SIGKILL);
      output += " [the child did not finish within 60 s]";
      break;
    }
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    output.append(buf, n);
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    output += absl::StrCat(" [the child exited with status ", status, "]");
  }
  return output;
}

// In the child: reports a failed expectation on `fd`.
void Expect(int fd, bool ok, const std::string& what) {
  if (!ok) dprintf(fd, "%s\n", what.c_str());
}

// Note [Fork after CUDA initialisation] in device.cc. With a GPU the first
// probe has initialised CUDA for real; without one the test takes the path
// the probe takes on success (MarkCudaInitialized), which is all a driver
// would add to the parent's state here.
TEST(CudaForkTest, ChildForkedAfterInitialisationGetsTorchsMessage) {
  const std::string parent_reason = unavailable_reason();
  const bool parent_available = is_available();
  if (!parent_available) {
    // Nothing initialised yet: a child sees exactly what its parent sees.
    const std::string report = ForkAndWait([&](int fd) {
      Expect(fd, unavailable_reason() == parent_reason, "reason changed: " + unavailable_reason());
      Expect(fd, !Contains(unavailable_reason(), "forked"), "a fork error before initialisation");
      return 0;
    });
    EXPECT_EQ(report, "");
  }
  internal::MarkCudaInitialized();
  const std::string report = ForkAndWait([](int fd) {
    const std::string torch =
        "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
        "must use the 'spawn' start method";
    Expect(fd, !is_available(), "is_available() in a bad fork");
    Expect(fd, device_count() == 0, absl::StrCat("device_count() ", device_count()));
    Expect(fd, current_device() == -1, absl::StrCat("current_device() ", current_device()));
    Expect(fd, Contains(unavailable_reason(), torch), "reason: " + unavailable_reason());
    for (const absl::Status& s : {set_device(0), synchronize(), get_device_properties(0).status(),
                                  get_stream_from_pool().status()}) {
      Expect(fd, s.code() == absl::StatusCode::kFailedPrecondition, s.ToString());
      Expect(fd, Contains(s.message(), torch), s.ToString());
    }
    DeviceGuard guard(Device(DeviceType::kCUDA, 0));  // does nothing; must not fail
    return 0;
  });
  EXPECT_EQ(report, "");
  // The parent is untouched.
  EXPECT_EQ(is_available(), parent_available);
  EXPECT_EQ(unavailable_reason(), parent_reason);
}

// Whether the driver holds a primary context for `device`, asked directly.
std::optional<bool> DriverHasContext(int device) {
  void* get_state = nullptr;
  void* get = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &get_state, 12000,
                                       cudaEnableDefault, &found) != cudaSuccess ||
      cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &found) !=
          cudaSuccess) {
    return std::nullopt;
  }
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (reinterpret_cast<CUresult (*)(CUdevice*, int)>(get)(&handle, device) != CUDA_SUCCESS ||
      reinterpret_cast<CUresult (*)(CUdevice, unsigned int*, int*)>(get_state)(
          handle, &flags, &active) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return active != 0;
}

// The child's side of the test below: a fresh process that works only on
// cuda:1, through the guard, a pool stream, an event and synchronize.
TEST(CudaContextChildTest, WorksOnlyOnDeviceOne) {
  if (std::getenv("EMBER_CUDA_CONTEXT_CHILD") == nullptr) {
    GTEST_SKIP() << "runs only as the child of CudaContextTest";
  }
  ASSERT_GE(device_count(), 2);
  {
    DeviceGuard guard(Device(DeviceType::kCUDA, 1));
    EXPECT_EQ(current_device(), 1);
  }
  absl::StatusOr<Stream> side = get_stream_from_pool(false, 1);
  ASSERT_TRUE(side.ok()) << side.status();
  ember::Event reached(DeviceType::kCUDA);
  ASSERT_TRUE(reached.record(*side).ok());
  ASSERT_TRUE(reached.synchronize().ok());
  ASSERT_TRUE(synchronize(1).ok());
  EXPECT_EQ(current_device(), 0) << "device 0 is this thread's current device, as reported";
  int runtime = -1;
  ASSERT_EQ(cudaGetDevice(&runtime), cudaSuccess);
  EXPECT_EQ(runtime, 1) << "restoring device 0 was deferred";
  EXPECT_EQ(DriverHasContext(1), std::optional<bool>(true));
  EXPECT_EQ(DriverHasContext(0), std::optional<bool>(false)) << "a context was created on cuda:0";
}

TEST(CudaContextTest, AProcessThatOnlyUsesDeviceOneCreatesNoContextOnDeviceZero) {
  EMBER_SKIP_WITHOUT_CUDA();
  if (device_count() < 2) GTEST_SKIP() << "needs 2 devices; " << device_count() << " here";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    for (const char* name : {"XML_OUTPUT_FILE", "TEST_PREMATURE_EXIT_FILE", "GTEST_OUTPUT"}) {
      unsetenv(name);
    }
    setenv("EMBER_CUDA_CONTEXT_CHILD", "1", 1);
    execl("/proc/self/exe", "device_test", "--gtest_filter=CudaContextChildTest.*", nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string output;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool timed_out = false;
  for (;;) {
    pollfd p{.fd = out[0], .events = POLLIN, .revents = 0};
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
  ASSERT_FALSE(timed_out) << output;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_TRUE(Contains(output, "[  PASSED  ] 1 test.")) << output;
  EXPECT_FALSE(Contains(output, "SKIPPED")) << output;
}

}  // namespace
}  // namespace ember::cuda
