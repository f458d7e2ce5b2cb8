// Proves Google Benchmark links and runs a registered benchmark to completion.
#include <atomic>

#include "benchmark/benchmark.h"
#include "gtest/gtest.h"

namespace {

std::atomic<long> g_iterations{0};

void BM_Count(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(g_iterations.fetch_add(1));
  }
}

TEST(BenchmarkTest, RunsRegisteredBenchmark) {
  benchmark::RegisterBenchmark("BM_Count", BM_Count)->Iterations(1000);
  int argc = 1;
  char arg0[] = "benchmark_test";
  char* argv[] = {arg0, nullptr};
  benchmark::Initialize(&argc, argv);
  size_t ran = benchmark::RunSpecifiedBenchmarks();
  EXPECT_EQ(ran, 1u);
  EXPECT_GE(g_iterations.load(), 1000);
}

}  // namespace
