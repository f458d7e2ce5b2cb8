#include "tensor/allocator.h"

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdlib>

#include "tensor/error.h"

namespace ember {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

class CpuAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, kCPU);
    // Large blocks are fresh mmap'ed pages every time; backing them with huge
    // pages (where the kernel allows it) cuts the page faults of their first
    // touch, which otherwise dominate ops that allocate big outputs.
    const size_t alignment = nbytes >= kHugePage ? kHugePage : kCpuAlignment;
    // aligned_alloc wants a size that is a multiple of the alignment.
    size_t rounded = (nbytes + alignment - 1) / alignment * alignment;
    void* p = rounded < nbytes ? nullptr : std::aligned_alloc(alignment, rounded);
    EMBER_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes,
                " bytes (", static_cast<double>(nbytes) / (1 << 30), " GiB)");
    if (alignment == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // Advice only.
    return DataPtr(p, p, &std::free, kCPU);
  }
  std::string_view name() const override { return "cpu"; }
};

std::array<std::atomic<Allocator*>, kNumDeviceTypes>& Registry() {
  static std::array<std::atomic<Allocator*>, kNumDeviceTypes> registry{
      GetCpuAllocator(), nullptr};
  return registry;
}

}  // namespace

Allocator* GetCpuAllocator() {
  static CpuAllocator allocator;
  return &allocator;
}

Allocator* GetAllocator(DeviceType type) {
  return Registry()[static_cast<int>(type)].load(std::memory_order_acquire);
}

void SetAllocator(DeviceType type, Allocator* allocator) {
  Registry()[static_cast<int>(type)].store(allocator, std::memory_order_release);
}

}  // namespace ember
