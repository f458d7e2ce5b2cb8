#include "cuda/caching_allocator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "cuda/host_allocator.h"
#include "cuda/stream.h"
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
  p = caching_allocator_alloc(16, -1, ember::Stream(kCPU, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
}

// Holds a stream's queue until released (or 30 s passed), like a long kernel.
struct Gate {
  std::atomic<bool> open{false};
  static void CUDART_CB Wait(void* arg) {
    auto* gate = static_cast<Gate*>(arg);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gate->open.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

TEST(CachingAllocatorTest, RecordedStreamKeepsPinnedBlockUntilItsWorkFinishes) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DataPtr a = pinned_allocator()->Allocate(4096);
  void* a_ptr = a.get();
  ASSERT_TRUE(host_record_stream(a, kDefaultStream).ok());
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, &Gate::Wait, &gate), cudaSuccess);
  a.Reset();  // The default stream has not reached the event recorded now.
  DataPtr b = pinned_allocator()->Allocate(4096);
  EXPECT_NE(b.get(), a_ptr) << "reused while the default stream may still copy from it";
  gate.open = true;
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
  EXPECT_FALSE(Contains(message, "PYTORCH_CUDA_ALLOC_CONF")) << "Ember does not read it";
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
