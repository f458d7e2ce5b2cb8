// Allocator: where storage bytes come from.
//
// A DataPtr owns one allocation: the data pointer, an opaque context and the
// function that frees it, and the device it lives on. Allocators for other
// memory (shared memory in multiprocessing/, device memory in cuda/) implement
// the same interface and register for their device type, so tensor code never
// changes to support them:
//
//   ```cpp
//   #include "tensor/allocator.h"
//   ember::DataPtr p = ember::GetAllocator(ember::DeviceType::kCPU)->Allocate(1024);
//   static_cast<char*>(p.get())[1023] = 1;  // freed when `p` goes out of scope
//   ```
//
// GetCpuAllocator() returns 64-byte aligned memory and keeps freed blocks of
// at least 64 KiB in a bounded process-wide cache for reuse (Note [Large block
// cache] in allocator.cc; EMBER_CPU_ALLOC_CACHE_MB sets its limit, 0 turns it
// off; empty_cpu_cache() hands the cached blocks back to the system, like
// torch.cuda.empty_cache() does for device memory). Registration is meant for
// program start-up; lookups and the CPU allocator are thread-safe, and the
// cache stays consistent across fork().
#ifndef EMBER_TENSOR_ALLOCATOR_H_
#define EMBER_TENSOR_ALLOCATOR_H_

#include <cstddef>
#include <string_view>
#include <utility>

#include "tensor/device.h"

namespace ember {

using DeleterFn = void (*)(void* context);

// Move-only owner of one allocation.
class DataPtr {
 public:
  DataPtr() = default;
  // Owns `context` through `deleter` (null deleter: nothing to free); `data`
  // is the first byte users see, often equal to `context`.
  DataPtr(void* data, void* context, DeleterFn deleter, Device device)
      : data_(data), context_(context), deleter_(deleter), device_(device) {}
  DataPtr(DataPtr&& other) noexcept { *this = std::move(other); }
  DataPtr& operator=(DataPtr&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      context_ = std::exchange(other.context_, nullptr);
      deleter_ = std::exchange(other.deleter_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  ~DataPtr() { Reset(); }

  void* get() const { return data_; }
  void* context() const { return context_; }
  DeleterFn deleter() const { return deleter_; }
  Device device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }

  // Frees the allocation now.
  void Reset() {
    if (deleter_ != nullptr) deleter_(context_);
    data_ = context_ = nullptr;
    deleter_ = nullptr;
  }

 private:
  void* data_ = nullptr;
  void* context_ = nullptr;
  DeleterFn deleter_ = nullptr;
  Device device_ = kCPU;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns `nbytes` of memory (a zero-size request may give a null data
  // pointer). Throws ember::Error naming the size when memory is exhausted.
  virtual DataPtr Allocate(size_t nbytes) = 0;
  // A short name for messages ("cpu", "cuda_caching", "shm_fd", ...).
  virtual std::string_view name() const = 0;
  // Marks `ptr` (from this allocator) as used by work queued on `stream`, so
  // that its memory is not reused before that work is done once it is freed
  // (torch's Tensor.record_stream). Allocators whose memory is not
  // stream-ordered throw, naming themselves.
  virtual void RecordStream(const DataPtr& ptr, Stream stream);
};

// Byte alignment of every CPU allocation (a cache line; wide enough for
// AVX-512 loads).
inline constexpr size_t kCpuAlignment = 64;

// Note [Object pool]
// Ops on small tensors (and the autograd graph they record) create and drop
// many small bookkeeping objects: TensorImpls, storages, version counters,
// graph nodes. PoolAllocate/PoolFree serve those from free lists kept per
// thread and per 16-byte size class (up to kPoolMaxBytes), so that a chain of
// scalar ops does not go through the general-purpose heap, whose cost
// dominates such ops. A block may be freed on any thread (it joins that
// thread's lists). Each thread caches at most kPoolCacheBytes; the rest goes
// back to the heap, and a thread's cache is released when it exits.
inline constexpr size_t kPoolMaxBytes = 1024;
inline constexpr size_t kPoolCacheBytes = size_t{16} << 20;

namespace internal {
// `nbytes` (<= kPoolMaxBytes) bytes, aligned for any fundamental type.
void* PoolAllocate(size_t nbytes);
// Returns a block from PoolAllocate(nbytes).
void PoolFree(void* p, size_t nbytes) noexcept;
}  // namespace internal

// A standard allocator over the object pool (for std::allocate_shared and
// containers of small objects). Falls back to operator new for requests
// larger than kPoolMaxBytes.
template <typename T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}  // NOLINT: rebinding is implicit.
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes > kPoolMaxBytes) return static_cast<T*>(::operator new(bytes));
    return static_cast<T*>(internal::PoolAllocate(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes > kPoolMaxBytes) {
      ::operator delete(p);
    } else {
      internal::PoolFree(p, bytes);
    }
  }
  template <typename U>
  bool operator==(const PoolAllocator<U>&) const {
    return true;
  }
};

// The process-wide CPU allocator (aligned_alloc, with the caches above).
Allocator* GetCpuAllocator();

// CPU blocks of at least this size go through the large block cache.
inline constexpr size_t kCpuCacheMinBytes = size_t{64} << 10;
// The cache's limit unless EMBER_CPU_ALLOC_CACHE_MB (whole MiB) says
// otherwise. A malformed value is reported on stderr and the default is used.
inline constexpr size_t kCpuCacheDefaultLimitBytes = size_t{1} << 30;

struct CpuCacheStats {
  size_t cached_bytes = 0;   // Free bytes held for reuse.
  size_t cached_blocks = 0;  // Free blocks held for reuse.
  size_t hits = 0;           // Large allocations served from the cache.
  size_t misses = 0;         // Large allocations that found no cached block.
  size_t limit_bytes = 0;    // Most bytes the cache holds (0: off).
};

// Frees every cached CPU block now (blocks in use are untouched). Blocks on
// the mutex of the cache; thread-safe.
void empty_cpu_cache();
// Sets the most bytes the cache may hold (0 turns it off), freeing the cache
// when it holds more. Thread-safe.
void set_cpu_cache_limit(size_t bytes);
// A snapshot of the cache's counters. Thread-safe.
CpuCacheStats get_cpu_cache_stats();
// Whether `p` was made by the CPU allocator's large block path, i.e. will go
// back to the cache when freed.
bool IsCachedCpuBlock(const DataPtr& p);

// The allocator that `empty()` uses for `type`; the CPU allocator unless one
// was registered. Returns null for a type with none (e.g. CUDA before the cuda
// library registered its allocator).
Allocator* GetAllocator(DeviceType type);
// Makes `allocator` (not owned; must outlive its use) the default for `type`.
void SetAllocator(DeviceType type, Allocator* allocator);

// Pinned (page-locked) host memory: CPU memory a device copies from and to
// asynchronously. A device backend registers the allocator that makes it
// (//cuda does, at load time); null until one has. Tensor::pin_memory,
// Tensor::is_pinned and the factories' pinned_memory(true) use it.
Allocator* GetPinnedMemoryAllocator();
void SetPinnedMemoryAllocator(Allocator* allocator);

}  // namespace ember

#endif  // EMBER_TENSOR_ALLOCATOR_H_
