// Run with EMBER_CPU_ALLOC_CACHE_MB=0 (see BUILD.bazel): the cache is off.
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"
#include "tensor/allocator.h"

namespace ember {
namespace {

TEST(CpuCacheEnvironmentTest, ZeroMegabytesTurnsTheCacheOff) {
  ASSERT_STREQ(std::getenv("EMBER_CPU_ALLOC_CACHE_MB"), "0");
  { DataPtr p = GetCpuAllocator()->Allocate(size_t{1} << 20); }
  CpuCacheStats s = get_cpu_cache_stats();
  EXPECT_EQ(s.limit_bytes, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
}

}  // namespace
}  // namespace ember
