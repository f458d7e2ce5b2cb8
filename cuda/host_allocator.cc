#include "cuda/host_allocator.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/status.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::cuda {
namespace {

// Pinned blocks belong to no stream: all share this key.
constexpr Stream kHostStream(Device(DeviceType::kCPU), 0);

BlockPool& HostPool() {
  static BlockPool* pool = [] {
    BlockPoolBacking backing;
    backing.allocate = [](size_t size) -> absl::StatusOr<void*> {
      void* ptr = nullptr;
      EMBER_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, size, cudaHostAllocDefault));
      return ptr;
    };
    backing.free = [](void* ptr, size_t) {
      absl::Status st = runtime_status(cudaFreeHost(ptr), "cudaFreeHost");
      if (!st.ok()) std::fprintf(stderr, "ember: %s\n", std::string(st.message()).c_str());
    };
    internal::AddStreamEvents(backing);
    return new BlockPool(std::move(backing));  // Never destroyed: frees may run at exit.
  }();
  return *pool;
}

void FreePinnedBlock(void* context) { HostPool().free(static_cast<Block*>(context)); }

class PinnedAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    if (absl::Status available = internal::CheckAvailable("pinned_allocator"); !available.ok()) {
      EMBER_FAIL("CUDA pinned host allocator: cannot allocate ", nbytes,
                 " bytes: ", available.message());
    }
    absl::StatusOr<Block*> block = HostPool().allocate(nbytes, kHostStream);
    if (!block.ok()) {
      const MemoryStats stats = HostPool().memory_stats();
      EMBER_FAIL("CUDA pinned host allocator: cannot allocate ", internal::FormatSize(nbytes),
                 " of page-locked memory (", internal::FormatSize(stats.allocated_bytes),
                 " pinned in use, ", internal::FormatSize(stats.reserved_bytes),
                 " reserved; the cache was released and the allocation retried): ",
                 block.status().message());
    }
    if (*block == nullptr) return DataPtr(nullptr, nullptr, nullptr, kCPU);
    return DataPtr((*block)->ptr, *block, &FreePinnedBlock, kCPU);
  }
  std::string_view name() const override { return "cuda_pinned"; }
  void RecordStream(const DataPtr& ptr, ember::Stream stream) override;
};

}  // namespace

Allocator* pinned_allocator() {
  static PinnedAllocator allocator;
  return &allocator;
}

bool is_pinned(const DataPtr& ptr) { return ptr.deleter() == &FreePinnedBlock; }

void PinnedAllocator::RecordStream(const DataPtr& ptr, ember::Stream stream) {
  if (absl::Status st = host_record_stream(ptr, stream); !st.ok()) internal::ThrowStatus(st);
}

namespace {
// Tensor::pin_memory and the factories' pinned_memory(true) allocate here.
[[maybe_unused]] const bool kRegistered = [] {
  SetPinnedMemoryAllocator(pinned_allocator());
  return true;
}();
}  // namespace

absl::Status host_record_stream(const DataPtr& ptr, Stream stream) {
  if (!ptr) return absl::OkStatus();
  if (!is_pinned(ptr)) {
    return absl::InvalidArgumentError(
        "host_record_stream: the pointer was not allocated by the pinned host allocator "
        "(pinned_allocator()); device blocks take record_stream");
  }
  absl::StatusOr<Stream> s = internal::CheckCudaStream(stream);
  if (!s.ok()) {
    return absl::Status(s.status().code(),
                        absl::StrCat("host_record_stream: ", s.status().message()));
  }
  HostPool().record_stream(static_cast<Block*>(ptr.context()), *s);
  return absl::OkStatus();
}

MemoryStats host_memory_stats() {
  if (!internal::CheckAvailable("pinned_allocator").ok()) return MemoryStats{};
  return HostPool().memory_stats();
}

void host_empty_cache() {
  if (internal::CheckAvailable("pinned_allocator").ok()) HostPool().empty_cache();
}

}  // namespace ember::cuda
