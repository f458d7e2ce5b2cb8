#include "cuda/caching_allocator.h"

#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/device.h"
#include "cuda/host_allocator.h"
#include "cuda/stream.h"
#include "cuda/testing/stream_gate.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "third_party/cuda/device_check.h"

namespace ember::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
const ember::Stream kDefaultStream(Device(DeviceType::kCUDA, 0), 0);

// The no-device cases need a machine without a usable GPU.
#define SKIP_WITH_CUDA()                                                          \
  if (::ember::testing::CudaUnavailableReason().empty()) {                        \
    GTEST_SKIP() << "a CUDA device is usable here; this case covers having none"; \
  }

// The runtime's own words for why no device is usable.
std::string RuntimeReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  cudaGetLastError();
  return err == cudaSuccess ? "the runtime reports no devices" : cudaGetErrorString(err);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CachingAllocatorTest, IsTheCudaAllocatorFromLoadTime) {
  EXPECT_EQ(GetAllocator(DeviceType::kCUDA), caching_allocator());
  EXPECT_EQ(caching_allocator()->name(), "cuda_caching");
  EXPECT_EQ(pinned_allocator()->name(), "cuda_pinned");
}

TEST(CachingAllocatorTest, FormatsSizesAsTorch) {
  EXPECT_EQ(internal::FormatSize(512), "512 bytes");
  EXPECT_EQ(internal::FormatSize(1536), "1.50 KiB");
  EXPECT_EQ(internal::FormatSize(2 * kMiB), "2.00 MiB");
  EXPECT_EQ(internal::FormatSize(3 * kGiB + kGiB / 4), "3.25 GiB");
}

TEST(CachingAllocatorTest, RecordStreamRejectsPointersOfOtherAllocators) {
  DataPtr cpu = GetCpuAllocator()->Allocate(256);
  absl::Status st = record_stream(cpu, kDefaultStream);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(Contains(std::string(st.message()), "not allocated by the CUDA caching allocator"));
  st = host_record_stream(cpu, kDefaultStream);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_FALSE(is_pinned(cpu));
  EXPECT_TRUE(record_stream(DataPtr(), kDefaultStream).ok()) << "an empty pointer needs nothing";
}

TEST(CachingAllocatorTest, WithoutDeviceAllocateThrowsTheRuntimesReason) {
  SKIP_WITH_CUDA();
  try {
    caching_allocator()->Allocate(1024);
    FAIL() << "allocated CUDA memory without a device";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(Contains(what, "cannot allocate 1024 bytes")) << what;
    EXPECT_TRUE(Contains(what, "CUDA is not available")) << what;
    EXPECT_TRUE(Contains(what, RuntimeReason())) << what;
  }
  try {
    pinned_allocator()->Allocate(4096);
    FAIL() << "pinned host memory without a driver";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "CUDA pinned host allocator: cannot allocate 4096 bytes"))
        << e.what();
    EXPECT_TRUE(Contains(e.what(), RuntimeReason())) << e.what();
  }
}

TEST(CachingAllocatorTest, WithoutDeviceStatusApiFailsPrecondition) {
  SKIP_WITH_CUDA();
  for (int device : {-1, 0, 3}) {
    absl::StatusOr<DataPtr> p = caching_allocator_alloc(1024, device);
    ASSERT_FALSE(p.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
    EXPECT_TRUE(Contains(std::string(p.status().message()), RuntimeReason())) << p.status();
  }
  absl::StatusOr<DataPtr> zero = caching_allocator_alloc(0);
  EXPECT_TRUE(absl::IsFailedPrecondition(zero.status())) << "even zero bytes name no device";
}

TEST(CachingAllocatorTest, WithoutDeviceQueriesReportZeros) {
  SKIP_WITH_CUDA();
  EXPECT_EQ(memory_allocated(), 0);
  EXPECT_EQ(max_memory_allocated(0), 0);
  EXPECT_EQ(memory_reserved(), 0);
  EXPECT_EQ(max_memory_reserved(), 0);
  EXPECT_EQ(memory_stats().num_device_alloc, 0);
  EXPECT_TRUE(memory_snapshot().empty());
  EXPECT_EQ(host_memory_stats().num_device_alloc, 0);
  reset_peak_memory_stats();
  empty_cache();
  host_empty_cache();
}

// ---- GPU cases ----

TEST(CachingAllocatorTest, FreedBlockIsReusedWithoutNewCudaMalloc) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const int64_t mallocs = memory_stats(0).num_device_alloc;
  DataPtr a = caching_allocator()->Allocate(kMiB);
  ASSERT_TRUE(a);
  EXPECT_EQ(a.device(), Device(DeviceType::kCUDA, 0));
  ASSERT_EQ(cudaMemset(a.get(), 0x7f, kMiB), cudaSuccess);
  void* first = a.get();
  a.Reset();
  DataPtr b = caching_allocator()->Allocate(kMiB - 100);
  EXPECT_EQ(b.get(), first);
  EXPECT_LE(memory_stats(0).num_device_alloc, mallocs + 1);
  unsigned char byte = 0;
  ASSERT_EQ(cudaMemcpy(&byte, b.get(), 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(byte, 0x7f) << "the same device memory, handed out again";

  DataPtr zero = caching_allocator()->Allocate(0);
  EXPECT_FALSE(zero);
  EXPECT_EQ(zero.device(), Device(DeviceType::kCUDA, 0));
}

TEST(CachingAllocatorTest, StatsFollowAllocationsAndPeaksReset) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  empty_cache();
  const int64_t before = memory_allocated(0);
  absl::StatusOr<DataPtr> a = caching_allocator_alloc(3 * kMiB + 1, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(memory_allocated(0) - before, static_cast<int64_t>(3 * kMiB + 512));
  EXPECT_GE(memory_reserved(0) - before, static_cast<int64_t>(20 * kMiB));
  EXPECT_GE(max_memory_allocated(0), memory_allocated(0));
  bool found = false;
  for (const SegmentInfo& s : memory_snapshot()) {
    if (s.address != reinterpret_cast<uintptr_t>(a->get())) continue;
    found = true;
    EXPECT_EQ(s.stream.device(), Device(DeviceType::kCUDA, 0));
    EXPECT_TRUE(s.large_pool);
    EXPECT_EQ(s.blocks[0].requested_size, 3 * kMiB + 1);
  }
  EXPECT_TRUE(found) << "the new segment is in memory_snapshot()";
  a->Reset();
  EXPECT_EQ(memory_allocated(0), before);
  EXPECT_GT(max_memory_allocated(0), before);
  reset_peak_memory_stats(0);
  EXPECT_EQ(max_memory_allocated(0), before);
  empty_cache();
  EXPECT_GE(max_memory_reserved(0), memory_reserved(0));
}

TEST(CachingAllocatorTest, BadDeviceIndexOrStreamIsInvalidArgument) {
  EMBER_SKIP_WITHOUT_CUDA();
  absl::StatusOr<DataPtr> p = caching_allocator_alloc(16, 1000);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  EXPECT_TRUE(Contains(std::string(p.status().message()), "1000")) << p.status();
  EXPECT_TRUE(Contains(std::string(p.status().message()), "CUDA error: invalid device ordinal"))
      << p.status();
  // The throwing path, through a tensor factory naming a device that does
  // not exist: never the current device instead.
  try {
    empty({4}, TensorOptions().device(Device(DeviceType::kCUDA, device_count())));
    FAIL() << "made a tensor on cuda:" << device_count() << " of " << device_count();
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "CUDA error: invalid device ordinal")) << e.what();
  }
  p = caching_allocator_alloc(16, -1, ember::Stream(kCPU, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
}

TEST(CachingAllocatorTest, RecordedStreamKeepsPinnedBlockUntilItsWorkFinishes) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DataPtr a = pinned_allocator()->Allocate(4096);
  void* a_ptr = a.get();
  ASSERT_TRUE(host_record_stream(a, kDefaultStream).ok());
  ::ember::cuda::testing::StreamGate gate;
  ASSERT_TRUE(gate.Close(cudaStreamLegacy).ok());
  a.Reset();  // The default stream has not reached the event recorded now.
  DataPtr b = pinned_allocator()->Allocate(4096);
  EXPECT_NE(b.get(), a_ptr) << "reused while the default stream may still copy from it";
  EXPECT_FALSE(gate.gave_up());
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  DataPtr c = pinned_allocator()->Allocate(4096);
  EXPECT_EQ(c.get(), a_ptr);
}

TEST(CachingAllocatorTest, PinnedMemoryIsPageLockedAndCached) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int64_t mallocs = host_memory_stats().num_device_alloc;
  DataPtr a = pinned_allocator()->Allocate(8192);
  EXPECT_TRUE(is_pinned(a));
  EXPECT_EQ(a.device(), kCPU);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, a.get()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  void* first = a.get();
  a.Reset();
  DataPtr b = pinned_allocator()->Allocate(8000);
  EXPECT_EQ(b.get(), first);
  EXPECT_LE(host_memory_stats().num_device_alloc, mallocs + 1);
  b.Reset();
  host_empty_cache();
  EXPECT_EQ(host_memory_stats().reserved_bytes, 0);
}

TEST(CachingAllocatorTest, OutOfMemoryNamesSizesAndRecoversAfterFree) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  empty_cache();
  const int64_t ooms = memory_stats(0).num_ooms;
  std::vector<DataPtr> held;
  absl::Status oom;
  for (int i = 0; i < 1024; ++i) {  // At most 1 TiB: every device runs out first.
    absl::StatusOr<DataPtr> p = caching_allocator_alloc(kGiB, 0);
    if (!p.ok()) {
      oom = p.status();
      break;
    }
    held.push_back(std::move(*p));
  }
  ASSERT_TRUE(absl::IsResourceExhausted(oom)) << oom;
  ASSERT_FALSE(held.empty());
  const std::string message(oom.message());
  EXPECT_EQ(message.rfind("CUDA out of memory. Tried to allocate 1.00 GiB.", 0), 0u) << message;
  EXPECT_TRUE(Contains(message, "cuda:0 has a total capacity of")) << message;
  EXPECT_TRUE(Contains(message, "is free")) << message;
  EXPECT_TRUE(
      Contains(message, "Ember has " + internal::FormatSize(memory_allocated(0)) + " allocated"))
      << message;
  EXPECT_TRUE(Contains(message, "reserved but unallocated")) << message;
  EXPECT_TRUE(Contains(message, "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb")) << message;
  EXPECT_EQ(memory_stats(0).num_ooms, ooms + 1);

  try {
    caching_allocator()->Allocate(kGiB);
    FAIL() << "the throwing path allocated past the end of memory";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("CUDA out of memory.", 0), 0u) << e.what();
  }

  held.clear();  // Cached, still reserved.
  EXPECT_GE(memory_reserved(0), static_cast<int64_t>(kGiB));
  empty_cache();
  EXPECT_EQ(memory_reserved(0), 0);
  absl::StatusOr<DataPtr> again = caching_allocator_alloc(kGiB, 0);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(CachingAllocatorTest, MemoryFractionIsCheckedBeforeTheDevice) {
  for (double bad : {-0.5, 1.5}) {
    absl::Status st = set_per_process_memory_fraction(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(Contains(std::string(st.message()), "Allowed range: 0~1")) << st;
  }
  if (!is_available()) {
    absl::Status st = set_per_process_memory_fraction(0.5);
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_TRUE(Contains(std::string(st.message()), RuntimeReason())) << st;
  }
}

TEST(CachingAllocatorTest, MemoryFractionCapsWhatTheAllocatorReserves) {
  EMBER_SKIP_WITHOUT_CUDA();
  empty_cache();
  absl::StatusOr<DeviceProperties> props = get_device_properties(0);
  ASSERT_TRUE(props.ok()) << props.status();
  // A cap 64 MiB above what is reserved now.
  const double fraction = static_cast<double>(memory_reserved(0) + 64 * kMiB) /
                          static_cast<double>(props->total_memory);
  ASSERT_TRUE(set_per_process_memory_fraction(fraction, 0).ok());
  absl::StatusOr<DataPtr> fits = caching_allocator_alloc(40 * kMiB, 0);
  EXPECT_TRUE(fits.ok()) << fits.status();
  absl::StatusOr<DataPtr> past = caching_allocator_alloc(40 * kMiB, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(past.status())) << past.status();
  EXPECT_TRUE(Contains(std::string(past.status().message()), "CUDA out of memory"))
      << past.status();
  ASSERT_TRUE(set_per_process_memory_fraction(1.0, 0).ok());
  past = caching_allocator_alloc(40 * kMiB, 0);
  EXPECT_TRUE(past.ok()) << past.status();
}

// torch's last step before an out-of-memory error: wait for the streams a
// freed block was recorded on, then reuse its memory.
TEST(CachingAllocatorTest, OutOfMemoryWaitsForRecordedStreamsBeforeFailing) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  empty_cache();
  absl::StatusOr<DeviceProperties> props = get_device_properties(0);
  ASSERT_TRUE(props.ok()) << props.status();
  // Room for one 40 MiB segment above what is reserved now.
  const double fraction = static_cast<double>(memory_reserved(0) + 50 * kMiB) /
                          static_cast<double>(props->total_memory);
  ASSERT_TRUE(set_per_process_memory_fraction(fraction, 0).ok());
  absl::StatusOr<cuda::Stream> side = get_stream_from_pool(false, 0);
  ASSERT_TRUE(side.ok()) << side.status();
  const int64_t syncs = memory_stats(0).num_sync_all_streams;
  {
    absl::StatusOr<DataPtr> a = caching_allocator_alloc(40 * kMiB, 0);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(record_stream(*a, *side).ok());
    ::ember::cuda::testing::StreamGate gate;  // The side stream is busy with `a` until the gate opens.
    ASSERT_TRUE(gate.Close(side->stream()).ok());
    a->Reset();  // Pending on the side stream.
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      gate.Open();
    });
    absl::StatusOr<DataPtr> b = caching_allocator_alloc(40 * kMiB, 0, kDefaultStream);
    opener.join();
    EXPECT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(cudaStreamSynchronize(side->stream()), cudaSuccess);
  }
  EXPECT_EQ(memory_stats(0).num_sync_all_streams, syncs + 1);
  ASSERT_TRUE(set_per_process_memory_fraction(1.0, 0).ok());
}

// PYTORCH_CUDA_ALLOC_CONF is read once per process, so each value is checked
// in a child: this binary, running only AllocatorConfigChildTest with the
// variable set. Returns the child's output and whether it passed.
std::pair<bool, std::string> RunConfigChild(const char* conf, const char* expect) {
  int out[2];
  if (pipe(out) != 0) return {false, "pipe failed"};
  const pid_t pid = fork();
  if (pid < 0) return {false, "fork failed"};
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    for (const char* name : {"XML_OUTPUT_FILE", "TEST_PREMATURE_EXIT_FILE", "GTEST_OUTPUT"}) {
      unsetenv(name);
    }
    setenv("PYTORCH_CUDA_ALLOC_CONF", conf, 1);
    setenv("EMBER_ALLOC_CONF_CHILD_EXPECT", expect, 1);
    execl("/proc/self/exe", "caching_allocator_test", "--gtest_filter=AllocatorConfigChildTest.*",
          nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd p{.fd = out[0], .events = POLLIN, .revents = 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) == 0) {
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
  waitpid(pid, &status, 0);
  if (timed_out) return {false, "the child did not finish within 60 s:\n" + output};
  const bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                      Contains(output, "[  PASSED  ] 1 test.") && !Contains(output, "SKIPPED");
  return {passed, output};
}

// The child's side: the first allocation reads the variable.
TEST(AllocatorConfigChildTest, FirstAllocationReadsTheVariable) {
  const char* expect = std::getenv("EMBER_ALLOC_CONF_CHILD_EXPECT");
  if (expect == nullptr) GTEST_SKIP() << "runs only as the child of AllocatorConfigTest";
  absl::StatusOr<DataPtr> p = caching_allocator_alloc(1024, 0);
  if (std::string(expect) == "invalid") {
    ASSERT_FALSE(p.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
    EXPECT_TRUE(Contains(std::string(p.status().message()), "PYTORCH_CUDA_ALLOC_CONF"))
        << p.status();
    std::printf("child error: %s\n", std::string(p.status().message()).c_str());
  } else {
    // A valid value: the allocation fails only for want of a device.
    EXPECT_EQ(p.ok(), is_available()) << p.status();
  }
}

TEST(AllocatorConfigTest, UnknownKeysAndBadValuesFailEveryAllocationNamingThem) {
  auto [passed, output] = RunConfigChild("max_split_size_mb:64,no_such_key:1", "invalid");
  EXPECT_TRUE(passed) << output;
  EXPECT_TRUE(Contains(output, "unrecognized option 'no_such_key'")) << output;
  std::tie(passed, output) = RunConfigChild("garbage_collection_threshold:2", "invalid");
  EXPECT_TRUE(passed) << output;
  EXPECT_TRUE(Contains(output, "garbage_collection_threshold:2 is not valid")) << output;
}

TEST(AllocatorConfigTest, KeysEmberDoesNotActOnAreNamedOnStderr) {
  auto [passed, output] = RunConfigChild(
      "max_split_size_mb:256,expandable_segments:True,roundup_power2_divisions:4,"
      "pinned_num_register_threads:8",
      "valid");
  EXPECT_TRUE(passed) << output;
  EXPECT_TRUE(
      Contains(output, "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True is not supported"))
      << output;
  EXPECT_TRUE(
      Contains(output, "PYTORCH_CUDA_ALLOC_CONF: pinned_num_register_threads is not supported"))
      << output;
  EXPECT_FALSE(Contains(output, "max_split_size_mb is not")) << output;
  EXPECT_FALSE(Contains(output, "roundup_power2_divisions is not")) << output;
}

// //cuda registers the pinned allocator with tensor/, so the factories'
// pinned_memory(true) and Tensor::pin_memory reach it: without a device they
// throw its no-device reason; on a GPU the result is page-locked and equal.
TEST(CachingAllocatorTest, TensorsPinThroughThePinnedAllocator) {
  ASSERT_EQ(GetPinnedMemoryAllocator(), pinned_allocator());
  Tensor host = arange(6, kFloat32);
  if (!is_available()) {
    try {
      host.pin_memory();
      FAIL() << "pinned a tensor without a device";
    } catch (const Error& e) {
      EXPECT_TRUE(Contains(e.what(), "CUDA pinned host allocator: cannot allocate 24 bytes"))
          << e.what();
    }
    EXPECT_FALSE(host.is_pinned());
    return;
  }
  Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(host.is_pinned());
  EXPECT_TRUE(is_pinned(pinned.storage().data_ptr()));
  EXPECT_TRUE(pinned.equal(host));
  EXPECT_EQ(pinned.pin_memory().raw_data(), pinned.raw_data()) << "pinned already: no copy";
  Tensor z = zeros({4}, TensorOptions().pinned_memory(true));
  EXPECT_TRUE(z.is_pinned());
  EXPECT_EQ(z.sum().item<double>(), 0.0);
}

// Tensor::record_stream reaches the allocator that made the tensor's memory.
TEST(CachingAllocatorTest, TensorRecordStreamReachesTheCachingAllocator) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor t = empty({1024}, TensorOptions().device(Device(DeviceType::kCUDA, 0)));
  absl::StatusOr<cuda::Stream> side = get_stream_from_pool();
  ASSERT_TRUE(side.ok()) << side.status();
  t.record_stream(*side);  // no throw: a caching-allocator block
  Tensor pinned = ones({4}).pin_memory();
  pinned.record_stream(*side);  // pinned memory is stream-ordered too
  try {
    t.record_stream(ember::Stream(kCPU, 0));
    FAIL() << "recorded a CUDA block on a CPU stream";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "pass a stream of a CUDA device")) << e.what();
  }
}

}  // namespace
}  // namespace ember::cuda
