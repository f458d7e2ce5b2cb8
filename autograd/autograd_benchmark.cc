// Autograd per-op overhead: a chain of 10,000 scalar steps
// `y = y * 1.0001 + 0.5` (20,000 ops) on a one-element float32 tensor,
// forward plus backward, as the peer script measures it
// (../shared/peers/libtorch_autograd.cc prints LibTorch's figure).
//
// Counter `per_op_us`: wall time of one repetition / 20,000.
//   BM_ChainForwardBackward  x requires grad; the chain, then y.backward()
//   BM_ChainForwardRecorded  the same chain, recorded, without backward
//   BM_ChainNoGrad           the baseline: the same chain on a tensor that
//                            does not require grad (plain tensor ops)
//   BM_ViewChainNoGrad       10,000 steps `y = y.unsqueeze(0).squeeze(0)`
//                            (20,000 view ops) on a tensor that does not
//                            require grad: what a view op costs, base
//                            tracking included (Note [View tracking])
//   BM_ViewChainRecorded     the same views, recorded (x requires grad)
// The autograd overhead per op is BM_ChainForwardBackward - BM_ChainNoGrad;
// the target is BM_ChainForwardBackward <= 1 us per op.
//
//   bazel run //autograd:autograd_benchmark -- --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
// (one command line).
#include "autograd/grad_mode.h"
#include "benchmark/benchmark.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tensor/thread_pool.h"

namespace ember::autograd {
namespace {

constexpr int kSteps = 10000;
constexpr double kOpsPerRun = 2.0 * kSteps;

Tensor Chain(const Tensor& x) {
  Tensor y = x;
  for (int i = 0; i < kSteps; ++i) y = y * 1.0001 + 0.5;
  return y;
}

void Report(benchmark::State& state) {
  state.counters["per_op_us"] =
      benchmark::Counter(kOpsPerRun * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                benchmark::Counter::kInvert);
}

void BM_ChainForwardBackward(benchmark::State& state) {
  set_num_threads(1);
  for (auto _ : state) {
    Tensor x = ones({1}).requires_grad_();
    Tensor y = Chain(x);
    y.backward();
    benchmark::DoNotOptimize(x.grad().raw_data());
  }
  Report(state);
}
BENCHMARK(BM_ChainForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ChainForwardRecorded(benchmark::State& state) {
  set_num_threads(1);
  for (auto _ : state) {
    Tensor x = ones({1}).requires_grad_();
    Tensor y = Chain(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  Report(state);
}
BENCHMARK(BM_ChainForwardRecorded)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ChainNoGrad(benchmark::State& state) {
  set_num_threads(1);
  for (auto _ : state) {
    Tensor x = ones({1});
    Tensor y = Chain(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  Report(state);
}
BENCHMARK(BM_ChainNoGrad)->Unit(benchmark::kMillisecond)->UseRealTime();

Tensor ViewChain(const Tensor& x) {
  Tensor y = x;
  for (int i = 0; i < kSteps; ++i) y = y.unsqueeze(0).squeeze(0);
  return y;
}

void BM_ViewChainNoGrad(benchmark::State& state) {
  set_num_threads(1);
  for (auto _ : state) {
    Tensor x = ones({1});
    Tensor y = ViewChain(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  Report(state);
}
BENCHMARK(BM_ViewChainNoGrad)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ViewChainRecorded(benchmark::State& state) {
  set_num_threads(1);
  for (auto _ : state) {
    Tensor x = ones({1}).requires_grad_();
    Tensor y = ViewChain(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  Report(state);
}
BENCHMARK(BM_ViewChainRecorded)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ember::autograd
