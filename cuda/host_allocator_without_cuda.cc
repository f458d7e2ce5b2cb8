// cuda/host_allocator.h in a build without CUDA support (Note [Builds with
// and without CUDA] in tools/cuda_configure.bzl): pinning needs CUDA, so
// every allocation throws ember::Error carrying cuda::unavailable_reason(),
// as host_allocator.cc does without a driver. Linking it registers the
// pinned-memory allocator, so Tensor::pin_memory() says why it cannot work.
#include "absl/strings/str_cat.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/host_allocator.h"
#include "tensor/error.h"

namespace ember::cuda {
namespace {

class NoCudaPinnedAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    EMBER_FAIL("CUDA pinned host allocator: cannot allocate ", nbytes,
               " bytes: ", internal::CheckAvailable("pinned_allocator").message());
  }
  std::string_view name() const override { return "cuda_pinned"; }
  void RecordStream(const DataPtr& ptr, ember::Stream stream) override {
    EMBER_FAIL(host_record_stream(ptr, stream).message());
  }
};

[[maybe_unused]] const bool kRegistered = [] {
  SetPinnedMemoryAllocator(pinned_allocator());
  return true;
}();

}  // namespace

Allocator* pinned_allocator() {
  static NoCudaPinnedAllocator allocator;
  return &allocator;
}

// Nothing is ever pinned without CUDA.
bool is_pinned(const DataPtr& ptr) { return false; }

absl::Status host_record_stream(const DataPtr& ptr, Stream stream) {
  if (!ptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "host_record_stream: the pointer was not allocated by the pinned host allocator "
      "(pinned_allocator()); device blocks take record_stream");
}

MemoryStats host_memory_stats() { return MemoryStats{}; }

void host_empty_cache() {}

}  // namespace ember::cuda
