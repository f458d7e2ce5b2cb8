#include "tensor/thread_pool.h"

#include <atomic>
#include <stdexcept>
#include <vector>

#include "gtest/gtest.h"

namespace ember {
namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  SetNumThreads(4);
  std::vector<std::atomic<int>> hits(100003);
  ParallelFor(0, hits.size(), 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, SmallRangesAndNestingRunInline) {
  SetNumThreads(4);
  int calls = 0;
  ParallelFor(0, 10, 1000, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    EXPECT_TRUE(InParallelRegion());
    int inner = 0;
    ParallelFor(0, 100000, 1, [&](int64_t, int64_t) { ++inner; });  // Inline.
    EXPECT_EQ(inner, 1);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(InParallelRegion());
  ParallelFor(5, 5, 1, [&](int64_t, int64_t) { FAIL(); });
}

TEST(ThreadPoolTest, RethrowsBodyErrorsAfterAllChunks) {
  SetNumThreads(3);
  std::atomic<int> chunks{0};
  EXPECT_THROW(ParallelFor(0, 300, 1,
                           [&](int64_t b, int64_t) {
                             chunks++;
                             if (b == 0) throw std::runtime_error("boom");
                           }),
               std::runtime_error);
  EXPECT_EQ(chunks.load(), 3);
  EXPECT_FALSE(InParallelRegion());
}

TEST(ThreadPoolTest, ThreadCountIsConfigurable) {
  SetNumThreads(2);
  EXPECT_EQ(GetNumThreads(), 2);
  EXPECT_ANY_THROW(SetNumThreads(0));
  EXPECT_EQ(GetNumThreads(), 2);
}

}  // namespace
}  // namespace ember
