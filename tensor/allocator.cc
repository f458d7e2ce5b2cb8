#include "tensor/allocator.h"

#include <pthread.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
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

// Note [Large block cache]
// A training step frees and re-allocates the same activation and gradient
// blocks every iteration. Blocks of that size come from mmap in glibc, so each
// step unmaps them on free and page-faults them in again on first touch, which
// costs as much as the math for memory-bound ops. Blocks of at least
// kCpuCacheMinBytes are therefore rounded up to a size class (four classes
// per power of two, at most 25% slack) and, when freed, kept in a
// process-wide cache of free lists per class, guarded by one mutex, up to a
// byte limit (EMBER_CPU_ALLOC_CACHE_MB, default kCpuCacheDefaultLimitBytes; 0
// disables it). The next allocation of that class takes the most recently
// freed block, its pages already mapped.
//
// Only blocks this allocator made reach the cache: they are the only
// DataPtrs whose deleter is FreeLarge, and Storage::set_data_ptr swaps the
// deleter together with the data, so shared-memory allocations keep their own.
// fork() happens with the mutex held (pthread_atfork), so a child never
// inherits it locked mid-update; the child keeps the cached blocks, which are
// its own copy-on-write pages.
constexpr int kClassesPerDoubling = 4;

// The size class of a large request: the smallest of 2^k * {4,5,6,7}/4 that
// holds `nbytes`; 0 when none fits in size_t.
size_t LargeClassBytes(size_t nbytes) {
  size_t pow = kCpuCacheMinBytes;
  while (pow * 2 <= nbytes && pow * 2 > pow) pow *= 2;
  for (int step = 0; step <= kClassesPerDoubling; ++step) {
    size_t size = pow + pow / kClassesPerDoubling * step;
    if (size >= nbytes && size >= pow) return size;
  }
  return 0;
}

int LargeClassIndex(size_t class_bytes) {
  int doublings = 0;
  size_t pow = kCpuCacheMinBytes;
  while (pow * 2 <= class_bytes) {
    pow *= 2;
    ++doublings;
  }
  return doublings * kClassesPerDoubling +
         static_cast<int>((class_bytes - pow) / (pow / kClassesPerDoubling));
}

// One large block: the context of its DataPtr, and a free-list node while
// cached.
struct LargeBlock {
  void* data;
  size_t bytes;  // Its size class.
  LargeBlock* next;
};

constexpr int kNumLargeClasses = 48 * kClassesPerDoubling;  // Up to 2^64 bytes.

size_t LimitFromEnvironment() {
  const char* env = std::getenv("EMBER_CPU_ALLOC_CACHE_MB");
  if (env == nullptr || *env == '\0') return kCpuCacheDefaultLimitBytes;
  char* end = nullptr;
  errno = 0;
  unsigned long long mb = std::strtoull(env, &end, 10);
  if (*end != '\0' || errno != 0 || env[0] == '-') {
    std::fprintf(stderr,
                 "ember: ignoring EMBER_CPU_ALLOC_CACHE_MB=\"%s\": expected a whole number of "
                 "MiB (0 disables the CPU block cache); using the default of %zu MiB\n",
                 env, kCpuCacheDefaultLimitBytes >> 20);
    return kCpuCacheDefaultLimitBytes;
  }
  return static_cast<size_t>(mb) << 20;
}

class LargeCache {
 public:
  static LargeCache& Get() {
    static LargeCache* cache = new LargeCache();  // Never destroyed: frees may run at exit.
    return *cache;
  }

  // A cached block of `class_bytes`, or null.
  LargeBlock* Take(size_t class_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    LargeBlock*& head = heads_[LargeClassIndex(class_bytes)];
    if (head == nullptr) {
      ++stats_.misses;
      return nullptr;
    }
    ++stats_.hits;
    stats_.cached_bytes -= class_bytes;
    --stats_.cached_blocks;
    return std::exchange(head, head->next);
  }

  // Keeps `block` if it fits under the limit; otherwise frees it.
  void Give(LargeBlock* block) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stats_.cached_bytes + block->bytes <= stats_.limit_bytes) {
        LargeBlock*& head = heads_[LargeClassIndex(block->bytes)];
        block->next = head;
        head = block;
        stats_.cached_bytes += block->bytes;
        ++stats_.cached_blocks;
        return;
      }
    }
    std::free(block->data);
    delete block;
  }

  void Empty() { Release(TakeAll()); }

  void SetLimit(size_t bytes) {
    LargeBlock* evicted = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.limit_bytes = bytes;
      if (stats_.cached_bytes > bytes) evicted = TakeAllLocked();
    }
    Release(evicted);
  }

  CpuCacheStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  LargeCache() {
    stats_.limit_bytes = LimitFromEnvironment();
    pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); },
                   [] { Get().mu_.unlock(); });
  }

  LargeBlock* TakeAll() {
    std::lock_guard<std::mutex> lock(mu_);
    return TakeAllLocked();
  }

  // Unlinks every cached block into one list.
  LargeBlock* TakeAllLocked() {
    LargeBlock* all = nullptr;
    for (LargeBlock*& head : heads_) {
      while (head != nullptr) {
        LargeBlock* b = std::exchange(head, head->next);
        b->next = all;
        all = b;
      }
    }
    stats_.cached_bytes = 0;
    stats_.cached_blocks = 0;
    return all;
  }

  static void Release(LargeBlock* list) {
    while (list != nullptr) {
      LargeBlock* b = std::exchange(list, list->next);
      std::free(b->data);
      delete b;
    }
  }

  std::mutex mu_;
  LargeBlock* heads_[kNumLargeClasses] = {};
  CpuCacheStats stats_;
};

void FreeLarge(void* context) { LargeCache::Get().Give(static_cast<LargeBlock*>(context)); }

DataPtr AllocateLarge(size_t nbytes) {
  LargeCache& cache = LargeCache::Get();
  const size_t class_bytes = LargeClassBytes(nbytes);
  EMBER_CHECK(class_bytes != 0, "cpu allocator: out of memory allocating ", nbytes, " bytes");
  if (LargeBlock* block = cache.Take(class_bytes)) {
    return DataPtr(block->data, block, &FreeLarge, kCPU);
  }
  // Blocks of 2 MiB and more are aligned to huge pages and advised to use them
  // (where the kernel allows it), cutting the page faults of their first touch.
  const size_t alignment = class_bytes >= kHugePage ? kHugePage : kCpuAlignment;
  // aligned_alloc wants a size that is a multiple of the alignment.
  size_t rounded = (class_bytes + alignment - 1) / alignment * alignment;
  void* p = rounded < class_bytes ? nullptr : std::aligned_alloc(alignment, rounded);
  if (p == nullptr && cache.Stats().cached_bytes > 0) {
    cache.Empty();  // Cached blocks of other sizes may be what stands in the way.
    p = std::aligned_alloc(alignment, rounded);
  }
  EMBER_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes (",
              static_cast<double>(nbytes) / (1 << 30), " GiB)");
  if (alignment == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // Advice only.
  // The block is filed under its class; alignment slack beyond it is unused.
  return DataPtr(p, new LargeBlock{p, class_bytes, nullptr}, &FreeLarge, kCPU);
}

class CpuAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, kCPU);
    if (nbytes <= kSmallLimit) return AllocateSmall(nbytes);
    if (nbytes >= kCpuCacheMinBytes) return AllocateLarge(nbytes);
    void* p = std::aligned_alloc(kCpuAlignment,
                                 (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment);
    EMBER_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
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

void empty_cpu_cache() { LargeCache::Get().Empty(); }

void set_cpu_cache_limit(size_t bytes) { LargeCache::Get().SetLimit(bytes); }

CpuCacheStats get_cpu_cache_stats() { return LargeCache::Get().Stats(); }

bool IsCachedCpuBlock(const DataPtr& p) { return p.deleter() == &FreeLarge; }

void Allocator::RecordStream(const DataPtr& ptr, Stream stream) {
  EMBER_FAIL("record_stream: memory from the ", name(), " allocator (on ", ptr.device().str(),
             ") is not ordered by streams, so there is nothing to record on ",
             stream.device().str(), " stream ", stream.id(),
             "; record_stream applies to CUDA tensors and pinned host memory");
}

Allocator* GetAllocator(DeviceType type) {
  return Registry()[static_cast<int>(type)].load(std::memory_order_acquire);
}

void SetAllocator(DeviceType type, Allocator* allocator) {
  Registry()[static_cast<int>(type)].store(allocator, std::memory_order_release);
}

namespace {
std::atomic<Allocator*> pinned_memory_allocator{nullptr};
}  // namespace

Allocator* GetPinnedMemoryAllocator() {
  return pinned_memory_allocator.load(std::memory_order_acquire);
}

void SetPinnedMemoryAllocator(Allocator* allocator) {
  pinned_memory_allocator.store(allocator, std::memory_order_release);
}

}  // namespace ember
