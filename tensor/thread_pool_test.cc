#include "tensor/thread_pool.h"

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "cblas.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  set_num_threads(4);
  std::vector<std::atomic<int>> hits(100003);
  parallel_for(0, hits.size(), 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

// OpenBLAS stays on the calling thread whatever set_num_threads says: its
// own pool would spin against the intra-op team (Note [BLAS on the team]).
TEST(ThreadPoolTest, BlasRunsOnTheCallingThread) {
  set_num_threads(2);
  EXPECT_EQ(get_num_threads(), 2);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  set_num_threads(1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

// parallel_for's chunks and oneDNN's primitives share OpenMP's team (Note
// [One team for every op]); inside a body an OpenMP library gets one thread.
TEST(ThreadPoolTest, ChunksRunOnTheOpenMpTeam) {
  set_num_threads(3);
  EXPECT_EQ(internal::openmp_threads(), 3);
  std::atomic<int> chunks{0}, on_team{0}, nested{0};
  parallel_for(0, 3000, 1000, [&](int64_t, int64_t) {
    ++chunks;
    if (omp_in_parallel() && omp_get_num_threads() == 3) ++on_team;
    if (internal::openmp_threads() == 1) ++nested;
  });
  EXPECT_EQ(chunks.load(), 3);
  EXPECT_EQ(on_team.load(), 3);
  EXPECT_EQ(nested.load(), 3);
  set_num_threads(1);
  EXPECT_EQ(internal::openmp_threads(), 1);
}

// A forked child inherits none of its parent's workers; its parallel_for must
// still cover the range (with fresh workers) instead of waiting forever on
// tasks that no thread will run.
TEST(ThreadPoolTest, ForkedChildGetsAFreshPool) {
  set_num_threads(4);
  std::atomic<int64_t> warm{0};
  parallel_for(0, 1 << 20, 1024, [&](int64_t b, int64_t e) { warm += e - b; });
  ASSERT_EQ(warm.load(), 1 << 20);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // A hang fails the test instead of stalling it.
    std::atomic<int64_t> covered{0};
    std::atomic<int> chunks{0}, on_team{0};
    parallel_for(0, 1 << 20, 1024, [&](int64_t b, int64_t e) {
      covered += e - b;
      ++chunks;
      if (omp_in_parallel()) ++on_team;
    });
    // The parent's OpenMP team is gone: the chunks ran on fresh workers of
    // Ember's own, and OpenMP libraries get one thread.
    bool ok = covered.load() == (1 << 20) && chunks.load() == 4 && on_team.load() == 0 &&
              internal::openmp_threads() == 1;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ThreadPoolTest, SmallRangesAndNestingRunInline) {
  set_num_threads(4);
  int calls = 0;
  parallel_for(0, 10, 1000, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    EXPECT_TRUE(in_parallel_region());
    int inner = 0;
    parallel_for(0, 100000, 1, [&](int64_t, int64_t) { ++inner; });  // Inline.
    EXPECT_EQ(inner, 1);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(in_parallel_region());
  parallel_for(5, 5, 1, [&](int64_t, int64_t) { FAIL(); });
}

TEST(ThreadPoolTest, RethrowsBodyErrorsAfterAllChunks) {
  set_num_threads(3);
  std::atomic<int> chunks{0};
  EXPECT_THROW(parallel_for(0, 300, 1,
                            [&](int64_t b, int64_t) {
                              chunks++;
                              if (b == 0) throw std::runtime_error("boom");
                            }),
               std::runtime_error);
  EXPECT_EQ(chunks.load(), 3);
  EXPECT_FALSE(in_parallel_region());
}

TEST(ThreadPoolTest, ThreadCountIsConfigurable) {
  set_num_threads(2);
  EXPECT_EQ(get_num_threads(), 2);
  EXPECT_ANY_THROW(set_num_threads(0));
  EXPECT_EQ(get_num_threads(), 2);
}

}  // namespace
}  // namespace ember
