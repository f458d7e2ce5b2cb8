// DataParallel forward+backward of the 4x512 ReLU MLP with a 10-way head
// (cross-entropy) on a batch of 64, over 1 and 2 CPU replicas, beside its
// in-binary baseline: the plain module on the same batch. One intra-op
// thread; run with OPENBLAS_NUM_THREADS=1 so that each replica's thread is
// the only one doing its work.
//
//   OPENBLAS_NUM_THREADS=1 bazel run -c opt //parallel:data_parallel_benchmark --
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true  (one line)
//
// The ratio DataParallelStep/N : PlainStep is the figure (BENCHMARKS.md).
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "nn/activation.h"
#include "nn/benchmark_mlp.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "parallel/data_parallel.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::parallel {
namespace {

constexpr int64_t kBatch = 64;
constexpr int kWidth = 512;
constexpr int kHidden = 4;
constexpr int kClasses = 10;

std::shared_ptr<nn::Module> Mlp() { return nn::benchmark_mlp(kWidth, kHidden, kClasses); }

void Step(nn::Module& model, const Tensor& x, const Tensor& y) {
  model.zero_grad(/*set_to_none=*/false);
  nn::functional::cross_entropy(model(x), y).backward();
}

void BM_PlainStep(benchmark::State& state) {
  auto model = Mlp();
  Tensor x = randn({kBatch, kWidth});
  Tensor y = randint(0, kClasses, {kBatch});
  for (auto _ : state) Step(*model, x, y);
}
BENCHMARK(BM_PlainStep)->Unit(benchmark::kMillisecond)->UseRealTime();

// Argument: the number of CPU replicas.
void BM_DataParallelStep(benchmark::State& state) {
  DataParallel dp(Mlp(), {.device_ids = std::vector<Device>(state.range(0), kCPU)});
  Tensor x = randn({kBatch, kWidth});
  Tensor y = randint(0, kClasses, {kBatch});
  for (auto _ : state) Step(dp, x, y);
}
BENCHMARK(BM_DataParallelStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ember::parallel

int main(int argc, char** argv) {
  ember::set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
