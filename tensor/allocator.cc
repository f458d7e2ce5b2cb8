#include "tensor/allocator.h"

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <utility>

#include "tensor/error.h"

namespace ember {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Note [Small block cache]
// Scalars and tiny tensors (autograd's per-op chains, wrapped numbers) make
// the allocator's cost dominate their ops: aligned_alloc of a few bytes splits
// and merges heap chunks on every call. Data blocks of up to 1 KiB are
// therefore cached per size class (64, 128, ..., 1024 bytes) in free lists of
// the thread that frees them, like the object pool (Note [Object pool]), and
// reused by the next allocation of that class on that thread.
constexpr int kNumSmallClasses = 5;  // 64 << 0 .. 64 << 4 bytes.
constexpr size_t kSmallLimit = kCpuAlignment << (kNumSmallClasses - 1);
constexpr size_t kSmallCacheBytes = size_t{4} << 20;

struct FreeBlock {
  FreeBlock* next;
};

// Per-thread free lists (plain data, so usable during thread exit).
struct ThreadCaches {
  FreeBlock* data_head[kNumSmallClasses];  // Blocks from aligned_alloc.
  size_t data_bytes;
  FreeBlock* pool_head[kPoolMaxBytes / 16];  // Blocks from operator new.
  size_t pool_bytes;
  bool releaser_armed;
  bool thread_exiting;
};
thread_local constinit ThreadCaches t_caches{};

// Returns the thread's cached blocks to the heap when the thread exits.
struct CacheReleaser {
  ~CacheReleaser() {
    ThreadCaches& c = t_caches;
    c.thread_exiting = true;
    for (FreeBlock*& head : c.data_head) {
      while (head != nullptr) std::free(std::exchange(head, head->next));
    }
    for (FreeBlock*& head : c.pool_head) {
      while (head != nullptr) ::operator delete(std::exchange(head, head->next));
    }
    c.data_bytes = c.pool_bytes = 0;
  }
};
thread_local CacheReleaser t_cache_releaser;

// Whether a block of `size` may join this thread's cache of `cached` bytes.
bool MayCache(ThreadCaches& c, size_t cached, size_t size, size_t limit) {
  if (c.thread_exiting || cached + size > limit) return false;
  if (!c.releaser_armed) {
    c.releaser_armed = true;
    CacheReleaser* volatile releaser = &t_cache_releaser;  // Registers its destructor.
    (void)releaser;
  }
  return true;
}

int SmallClass(size_t nbytes) {
  int c = 0;
  while ((kCpuAlignment << c) < nbytes) ++c;
  return c;
}

template <int kClass>
void FreeSmall(void* p) {
  constexpr size_t kSize = kCpuAlignment << kClass;
  ThreadCaches& c = t_caches;
  if (!MayCache(c, c.data_bytes, kSize, kSmallCacheBytes)) {
    std::free(p);
    return;
  }
  auto* block = static_cast<FreeBlock*>(p);
  block->next = c.data_head[kClass];
  c.data_head[kClass] = block;
  c.data_bytes += kSize;
}

constexpr DeleterFn kSmallDeleters[kNumSmallClasses] = {&FreeSmall<0>, &FreeSmall<1>,
                                                        &FreeSmall<2>, &FreeSmall<3>,
                                                        &FreeSmall<4>};

DataPtr AllocateSmall(size_t nbytes) {
  const int k = SmallClass(nbytes);
  ThreadCaches& c = t_caches;
  void* p;
  if (c.data_head[k] != nullptr) {
    p = std::exchange(c.data_head[k], c.data_head[k]->next);
    c.data_bytes -= kCpuAlignment << k;
  } else {
    p = std::aligned_alloc(kCpuAlignment, kCpuAlignment << k);
  }
  EMBER_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
  return DataPtr(p, p, kSmallDeleters[k], kCPU);
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

namespace internal {

int PoolClass(size_t nbytes) {
  return nbytes == 0 ? 0 : static_cast<int>((nbytes + 15) / 16) - 1;
}

void* PoolAllocate(size_t nbytes) {
  const int k = PoolClass(nbytes);
  ThreadCaches& c = t_caches;
  if (c.pool_head[k] != nullptr) {
    c.pool_bytes -= static_cast<size_t>(k + 1) * 16;
    return std::exchange(c.pool_head[k], c.pool_head[k]->next);
  }
  return ::operator new(static_cast<size_t>(k + 1) * 16);
}

void PoolFree(void* p, size_t nbytes) noexcept {
  if (p == nullptr) return;
  const int k = PoolClass(nbytes);
  const size_t size = static_cast<size_t>(k + 1) * 16;
  ThreadCaches& c = t_caches;
  if (!MayCache(c, c.pool_bytes, size, kPoolCacheBytes)) {
    ::operator delete(p);
    return;
  }
  auto* block = static_cast<FreeBlock*>(p);
  block->next = c.pool_head[k];
  c.pool_head[k] = block;
  c.pool_bytes += size;
}

}  // namespace internal

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
