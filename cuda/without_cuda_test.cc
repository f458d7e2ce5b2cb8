// The no-CUDA sources (device_without_cuda.cc and the allocators'), which a
// build without CUDA support links as //cuda:device, //cuda:caching_allocator
// and //cuda:host_allocator. They need no toolkit, so this test runs in
// builds with and without CUDA: the no-device state, fixed at build time.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/host_allocator.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace ember::cuda {
namespace {

constexpr char kReason[] = "Ember was built without CUDA support";

bool Contains(absl::string_view text, absl::string_view part) {
  return absl::StrContains(text, part);
}

// The message of the ember::Error `body` throws, or "" when it throws none.
template <typename F>
std::string ErrorOf(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WithoutCudaTest, NoDeviceAndTheReasonSaysWhy) {
  EXPECT_FALSE(is_available());
  EXPECT_EQ(unavailable_reason(), kReason);
  EXPECT_EQ(device_count(), 0);
  EXPECT_EQ(current_device(), -1);
}

TEST(WithoutCudaTest, EveryDeviceCallFailsWithTheReason) {
  const std::vector<std::pair<std::string, absl::Status>> calls = {
      {"cuda::set_device", set_device(0)},
      {"cuda::set_device", set_device(-1)},
      {"cuda::get_device_properties", get_device_properties(0).status()},
      {"cuda::synchronize", synchronize(0)},
      {"cuda::synchronize", synchronize()},
      {"caching_allocator_alloc", caching_allocator_alloc(1024).status()},
      {"caching_allocator_alloc", caching_allocator_alloc(0, 3).status()},
      {"set_per_process_memory_fraction", set_per_process_memory_fraction(0.5)},
  };
  for (const auto& [call, status] : calls) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_TRUE(Contains(status.message(), call)) << status;
    EXPECT_TRUE(Contains(status.message(), kReason)) << status;
  }
}

TEST(WithoutCudaTest, BadArgumentsAreStillNamed) {
  absl::Status fraction = set_per_process_memory_fraction(1.5);
  EXPECT_EQ(fraction.code(), absl::StatusCode::kInvalidArgument) << fraction;
  EXPECT_TRUE(Contains(fraction.message(), "invalid fraction value: 1.5")) << fraction;
  absl::Status ordinal = internal::InvalidDeviceOrdinal("empty", 2, 0);
  EXPECT_EQ(ordinal.code(), absl::StatusCode::kInvalidArgument) << ordinal;
  EXPECT_TRUE(Contains(ordinal.message(), "CUDA error: invalid device ordinal")) << ordinal;
  EXPECT_TRUE(Contains(ordinal.message(), "no CUDA devices")) << ordinal;
  EXPECT_TRUE(Contains(internal::ForkedChildReason(), "Cannot re-initialize CUDA")) << ordinal;
  // OnDevice needs a usable device: the body never runs.
  absl::Status on = internal::OnDevice(0, [] { return absl::InternalError("ran"); });
  EXPECT_EQ(on.code(), absl::StatusCode::kFailedPrecondition) << on;
}

TEST(WithoutCudaTest, TheGuardImplReportsNoDevices) {
  DeviceGuardImpl* impl = GetDeviceGuardImpl(DeviceType::kCUDA);
  ASSERT_NE(impl, nullptr) << "linking //cuda:device registers the kCUDA backend";
  EXPECT_EQ(ember::device_count(DeviceType::kCUDA), 0);
  EXPECT_FALSE(ember::get_device_properties(Device(DeviceType::kCUDA, 0)).has_value());
  {
    DeviceGuard guard(Device(DeviceType::kCUDA, 0));  // nothing to set; must not fail
    EXPECT_EQ(current_device(), -1);
  }
  const Stream stream(Device(DeviceType::kCUDA, 0), 0);
  EXPECT_EQ(ember::current_stream(Device(DeviceType::kCUDA, 0)), stream);
  Event event(DeviceType::kCUDA);
  absl::Status recorded = event.record(stream);
  EXPECT_EQ(recorded.code(), absl::StatusCode::kFailedPrecondition) << recorded;
  EXPECT_TRUE(Contains(recorded.message(), kReason)) << recorded;
}

TEST(WithoutCudaTest, TensorsOnCudaThrowTheReason) {
  EXPECT_EQ(GetAllocator(DeviceType::kCUDA), caching_allocator());
  const std::string empty = ErrorOf([] { (void)ember::empty({4}, Device(DeviceType::kCUDA, 0)); });
  EXPECT_TRUE(Contains(empty, "CUDA caching allocator: cannot allocate 16 bytes")) << empty;
  EXPECT_TRUE(Contains(empty, kReason)) << empty;
  const Tensor cpu = ember::ones({4});
  const std::string to = ErrorOf([&] { (void)cpu.to(Device(DeviceType::kCUDA, 0)); });
  EXPECT_TRUE(Contains(to, kReason)) << to;
  const std::string pinned = ErrorOf([&] { (void)cpu.pin_memory(); });
  EXPECT_TRUE(Contains(pinned, "CUDA pinned host allocator: cannot allocate 16 bytes")) << pinned;
  EXPECT_TRUE(Contains(pinned, kReason)) << pinned;
  EXPECT_FALSE(cpu.is_pinned());
}

TEST(WithoutCudaTest, MemoryQueriesReportZeros) {
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

TEST(WithoutCudaTest, RecordStreamRejectsPointersOfOtherAllocators) {
  const Stream stream(Device(DeviceType::kCUDA, 0), 0);
  DataPtr cpu = GetCpuAllocator()->Allocate(256);
  absl::Status st = record_stream(cpu, stream);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(Contains(st.message(), "not allocated by the CUDA caching allocator")) << st;
  st = host_record_stream(cpu, stream);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_FALSE(is_pinned(cpu));
  EXPECT_TRUE(record_stream(DataPtr(), stream).ok()) << "an empty pointer needs nothing";
  absl::StatusOr<Stream> checked = internal::CheckCudaStream(stream);
  EXPECT_TRUE(absl::IsFailedPrecondition(checked.status())) << checked.status();
  checked = internal::CheckCudaStream(Stream(kCPU, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(checked.status())) << checked.status();
}

TEST(WithoutCudaTest, FormatsSizesAsTorch) {
  EXPECT_EQ(internal::FormatSize(512), "512 bytes");
  EXPECT_EQ(internal::FormatSize(1536), "1.50 KiB");
  EXPECT_EQ(internal::FormatSize(size_t{2} << 20), "2.00 MiB");
  EXPECT_EQ(internal::FormatSize((size_t{13} << 30) / 4), "3.25 GiB");
}

}  // namespace
}  // namespace ember::cuda
