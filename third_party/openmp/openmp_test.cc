// Proves a `#pragma omp parallel` region links to libgomp and runs a team of
// the size asked for, each thread with its own number.
#include <omp.h>

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace {

TEST(OpenMpTest, RegionRunsTheTeamAskedFor) {
  std::vector<std::atomic<int>> seen(3);
  int team = 0;
#pragma omp parallel num_threads(3)
  {
    seen[omp_get_thread_num()]++;
#pragma omp single
    team = omp_get_num_threads();
  }
  EXPECT_EQ(team, 3);
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
  EXPECT_FALSE(omp_in_parallel());
}

}  // namespace
