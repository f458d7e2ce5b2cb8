#include "tensor/allocator.h"

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdlib>

#include "tensor/error.h"

namespace ember {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Note [Small block cache]
// Scalars and tiny tensors (autograd's per-op chains, wrapped numbers) make
// the allocator's cost dominate their ops: aligned_alloc of a few bytes splits
// and merges heap chunks on every call. Blocks of up to 1 KiB are therefore
// kept, per size class (64, 128, ..., 1024 bytes), in a small free list of
// the thread that frees them, and reused by the next allocation of that class
// on that thread. The lists are plain arrays (no destructor, so a block freed
// during thread or program exit is still safe to cache); what a thread holds
// when it exits stays allocated (at most kCachedPerClass blocks per class).
constexpr int kNumSmallClasses = 5;      // 64 << 0 .. 64 << 4 bytes.
constexpr int kCachedPerClass = 256;
constexpr size_t kSmallLimit = kCpuAlignment << (kNumSmallClasses - 1);

struct SmallCache {
  void* blocks[kNumSmallClasses][kCachedPerClass];
  int count[kNumSmallClasses];
};
thread_local constinit SmallCache t_small_cache{};

int SmallClass(size_t nbytes) {
  int c = 0;
  while ((kCpuAlignment << c) < nbytes) ++c;
  return c;
}

template <int kClass>
void FreeSmall(void* p) {
  SmallCache& cache = t_small_cache;
  if (cache.count[kClass] < kCachedPerClass) {
    cache.blocks[kClass][cache.count[kClass]++] = p;
  } else {
    std::free(p);
  }
}

constexpr DeleterFn kSmallDeleters[kNumSmallClasses] = {&FreeSmall<0>, &FreeSmall<1>,
                                                        &FreeSmall<2>, &FreeSmall<3>,
                                                        &FreeSmall<4>};

DataPtr AllocateSmall(size_t nbytes) {
  const int c = SmallClass(nbytes);
  SmallCache& cache = t_small_cache;
  void* p = cache.count[c] > 0 ? cache.blocks[c][--cache.count[c]]
                               : std::aligned_alloc(kCpuAlignment, kCpuAlignment << c);
  EMBER_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
  return DataPtr(p, p, kSmallDeleters[c], kCPU);
}

class CpuAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, kCPU);
    if (nbytes <= kSmallLimit) return AllocateSmall(nbytes);
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
