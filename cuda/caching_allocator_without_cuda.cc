// cuda/caching_allocator.h in a build without CUDA support (Note [Builds
// with and without CUDA] in tools/cuda_configure.bzl): the no-device state of
// caching_allocator.cc. Every allocation fails with kFailedPrecondition
// carrying cuda::unavailable_reason() ("Ember was built without CUDA
// support"); Allocator::Allocate, used by tensor factories, throws
// ember::Error with the same message; the queries report zeros and an empty
// snapshot. Linking it registers the kCUDA allocator, so `empty(..., cuda)`
// says why it cannot work.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "tensor/error.h"

namespace ember::cuda {
namespace {

absl::Status CannotAllocate(size_t nbytes) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA caching allocator: cannot allocate ", nbytes,
                   " bytes: ", internal::CheckAvailable("caching_allocator_alloc").message()));
}

class NoCudaAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    EMBER_FAIL(CannotAllocate(nbytes).message());
  }
  std::string_view name() const override { return "cuda_caching"; }
  void RecordStream(const DataPtr& ptr, Stream stream) override {
    EMBER_FAIL(record_stream(ptr, stream).message());
  }
};

[[maybe_unused]] const bool kRegistered = [] {
  SetAllocator(DeviceType::kCUDA, caching_allocator());
  return true;
}();

}  // namespace

Allocator* caching_allocator() {
  static NoCudaAllocator allocator;
  return &allocator;
}

absl::StatusOr<DataPtr> caching_allocator_alloc(size_t nbytes, int device,
                                                std::optional<Stream> stream) {
  return CannotAllocate(nbytes);
}

absl::Status record_stream(const DataPtr& ptr, Stream stream) {
  if (!ptr) return absl::OkStatus();  // Zero bytes: nothing to keep, as with CUDA.
  // No block of this allocator exists, so `ptr` is another allocator's.
  return absl::InvalidArgumentError(
      absl::StrCat("record_stream: the pointer on ", ptr.device().str(),
                   " was not allocated by the CUDA caching allocator (",
                   unavailable_reason(), ", so it allocates nothing)"));
}

int64_t memory_allocated(int device) { return 0; }
int64_t max_memory_allocated(int device) { return 0; }
int64_t memory_reserved(int device) { return 0; }
int64_t max_memory_reserved(int device) { return 0; }
void reset_peak_memory_stats(int device) {}
absl::Status set_per_process_memory_fraction(double fraction, int device) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("set_per_process_memory_fraction: invalid fraction value: ", fraction,
                     ". Allowed range: 0~1 (a share of the device's total memory)"));
  }
  return internal::CheckAvailable("set_per_process_memory_fraction");
}
MemoryStats memory_stats(int device) { return MemoryStats{}; }
void empty_cache() {}
std::vector<SegmentInfo> memory_snapshot() { return {}; }

namespace internal {

// No stream has events without CUDA: the backing keeps none.
void AddStreamEvents(BlockPoolBacking& backing) {}

// No capture can begin without CUDA (cuda/graphs.h says why first).
absl::Status BeginAllocateToPool(int device, MempoolId pool, unsigned long long capture_id) {
  return CheckAvailable("CUDA graph capture");
}
void EndAllocateToPool(int device, MempoolId pool) {}
void RetainPool(int device, MempoolId pool) {}
void ReleasePool(int device, MempoolId pool) {}
MemoryStats private_pool_stats(int device, MempoolId pool) { return {}; }

absl::StatusOr<Stream> CheckCudaStream(Stream stream) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("the stream is on ", stream.device().str(),
                                                   "; pass a stream of a CUDA device"));
  }
  return CheckAvailable("the stream's device");
}

std::string FormatSize(uint64_t bytes) {
  char text[64];
  if (bytes <= 1024) {
    std::snprintf(text, sizeof(text), "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes < (uint64_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.2f KiB", bytes / 1024.0);
  } else if (bytes < (uint64_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(text, sizeof(text), "%.2f GiB", bytes / 1073741824.0);
  }
  return text;
}

}  // namespace internal

}  // namespace ember::cuda
