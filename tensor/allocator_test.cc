#include "tensor/allocator.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "tensor/storage.h"

namespace ember {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class CpuCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_cpu_cache_limit(kCpuCacheDefaultLimitBytes);
    empty_cpu_cache();
  }
  void TearDown() override { set_cpu_cache_limit(kCpuCacheDefaultLimitBytes); }
};

TEST_F(CpuCacheTest, FreedLargeBlockIsReusedBySameSizeClass) {
  void* first;
  {
    DataPtr p = GetCpuAllocator()->Allocate(kMiB);
    first = p.get();
    std::memset(first, 1, kMiB);
    EXPECT_TRUE(IsCachedCpuBlock(p));
  }
  CpuCacheStats after_free = get_cpu_cache_stats();
  EXPECT_EQ(after_free.cached_blocks, 1u);
  EXPECT_GE(after_free.cached_bytes, kMiB);

  // 1 MiB - 1000 bytes falls in the same class as 1 MiB.
  DataPtr again = GetCpuAllocator()->Allocate(kMiB - 1000);
  EXPECT_EQ(again.get(), first);
  CpuCacheStats after_reuse = get_cpu_cache_stats();
  EXPECT_EQ(after_reuse.hits, after_free.hits + 1);
  EXPECT_EQ(after_reuse.cached_blocks, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again.get()) % kCpuAlignment, 0u);
}

TEST_F(CpuCacheTest, LargerRequestDoesNotGetSmallerBlock) {
  { DataPtr p = GetCpuAllocator()->Allocate(kMiB); }
  DataPtr bigger = GetCpuAllocator()->Allocate(2 * kMiB);
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 1u);  // The 1 MiB block stays cached.
  std::memset(bigger.get(), 2, 2 * kMiB);           // All of it is writable.
}

TEST_F(CpuCacheTest, SmallAndMediumBlocksBypassTheCache) {
  { DataPtr p = GetCpuAllocator()->Allocate(kCpuCacheMinBytes - 1); }
  { DataPtr p = GetCpuAllocator()->Allocate(512); }
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 0u);
}

TEST_F(CpuCacheTest, HugeBlocksAreHugePageAligned) {
  DataPtr p = GetCpuAllocator()->Allocate(3 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % (2 * kMiB), 0u);
}

TEST_F(CpuCacheTest, EmptyCacheReleasesEverything) {
  { DataPtr a = GetCpuAllocator()->Allocate(kMiB), b = GetCpuAllocator()->Allocate(kMiB); }
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 2u);
  empty_cpu_cache();
  CpuCacheStats s = get_cpu_cache_stats();
  EXPECT_EQ(s.cached_blocks, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
}

TEST_F(CpuCacheTest, LimitBoundsTheCache) {
  set_cpu_cache_limit(kMiB + kMiB / 2);
  { DataPtr a = GetCpuAllocator()->Allocate(kMiB), b = GetCpuAllocator()->Allocate(kMiB); }
  CpuCacheStats s = get_cpu_cache_stats();
  EXPECT_EQ(s.cached_blocks, 1u);
  EXPECT_LE(s.cached_bytes, s.limit_bytes);

  set_cpu_cache_limit(0);  // Off: the cached block is freed, and none is kept.
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 0u);
  { DataPtr a = GetCpuAllocator()->Allocate(kMiB); }
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 0u);
}

void FreeWithStdFree(void* p) { std::free(p); }

TEST_F(CpuCacheTest, SwappedOutAllocationNeverReachesTheCache) {
  // As share_memory_() does: the storage's cpu block is replaced by a foreign
  // allocation of the same size.
  Storage s = Storage::Allocate(kMiB, GetCpuAllocator());
  void* foreign = std::aligned_alloc(kCpuAlignment, kMiB);
  DataPtr old = s.set_data_ptr(DataPtr(foreign, foreign, &FreeWithStdFree, kCPU), nullptr);
  EXPECT_TRUE(IsCachedCpuBlock(old));
  EXPECT_FALSE(IsCachedCpuBlock(s.data_ptr()));
  old.Reset();  // Ours: cached.
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 1u);
  s = Storage();  // Foreign: freed by its own deleter, not cached.
  EXPECT_EQ(get_cpu_cache_stats().cached_blocks, 1u);
  DataPtr next = GetCpuAllocator()->Allocate(kMiB);
  EXPECT_NE(next.get(), foreign);
}

TEST_F(CpuCacheTest, ConcurrentAllocateAndFreeKeepsCountsConsistent) {
  auto work = [] {
    for (int i = 0; i < 200; ++i) {
      DataPtr p = GetCpuAllocator()->Allocate(kMiB / 4 + static_cast<size_t>(i % 3) * kMiB);
      static_cast<char*>(p.get())[0] = 1;
    }
  };
  std::thread t1(work), t2(work), t3(work);
  t1.join();
  t2.join();
  t3.join();
  CpuCacheStats s = get_cpu_cache_stats();
  EXPECT_LE(s.cached_blocks, 9u);  // At most 3 threads x 3 classes outstanding.
  EXPECT_LE(s.cached_bytes, s.limit_bytes);
}

TEST_F(CpuCacheTest, ForkedChildUsesItsOwnConsistentCache) {
  { DataPtr p = GetCpuAllocator()->Allocate(kMiB); }
  // Another thread keeps the cache busy while we fork; the child must not
  // inherit its mutex held.
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) DataPtr p = GetCpuAllocator()->Allocate(kMiB / 2);
  });
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    CpuCacheStats before = get_cpu_cache_stats();
    void* q;
    {
      DataPtr p = GetCpuAllocator()->Allocate(kMiB);
      std::memset(p.get(), 3, kMiB);
      q = p.get();
    }
    DataPtr again = GetCpuAllocator()->Allocate(kMiB);
    bool ok = again.get() == q && get_cpu_cache_stats().hits >= before.hits + 1;
    empty_cpu_cache();
    _exit(ok && get_cpu_cache_stats().cached_blocks == 0 ? 0 : 1);
  }
  stop = true;
  churn.join();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_GE(get_cpu_cache_stats().cached_blocks, 1u);  // The parent's cache is intact.
}

}  // namespace
}  // namespace ember
