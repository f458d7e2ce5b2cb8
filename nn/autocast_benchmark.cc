// Training steps under CPU autocast (bfloat16; Note [Autocast] in
// tensor/autocast.h) against the same steps in float32, with
// nn/torch_autocast_step.py as PyTorch 2.x's side (torch.autocast("cpu")).
//
// BM_AutocastStep/<model>/<autocast>: model 0 is benchmark_mlp(1024, 4, 10)
// at batch 256, model 1 ResNet-18 with 10 classes on 3x32x32 images at batch
// 16; autocast 0 is the float32 step, 1 the forward under autocast with the
// backward after it. Each step is zero_grad, forward, cross-entropy,
// backward, SGD lr 0.01. One thread (Ember's pool, OpenMP for oneDNN), as the
// peer's torch.set_num_threads(1); run with OPENBLAS_NUM_THREADS=1. Counter
// median_ms: the median of 30 steps after 5 warm-up steps of a fresh model.
//
//   OPENBLAS_NUM_THREADS=1 bazel run //nn:autocast_benchmark
#include <omp.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "nn/benchmark_mlp.h"
#include "nn/loss.h"
#include "nn/models/resnet.h"
#include "nn/optim/sgd.h"
#include "tensor/autocast.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

constexpr int kWarmup = 5;
constexpr int kSteps = 30;

void BM_AutocastStep(benchmark::State& state) {
  const bool resnet = state.range(0) == 1;
  const bool mixed = state.range(1) == 1;
  set_num_threads(1);
  omp_set_num_threads(1);
  std::vector<double> ms;
  for (auto _ : state) {
    std::shared_ptr<Module> net;
    Tensor x, y;
    if (resnet) {
      manual_seed(0);
      net = std::make_shared<models::ResNet18>(models::ResNetOptions{.num_classes = 10});
      x = randn({16, 3, 32, 32});
      y = randint(0, 10, {16});
    } else {
      net = benchmark_mlp(1024, 4, 10);
      x = randn({256, 1024});
      y = randint(0, 10, {256});
    }
    optim::SGD opt(net->parameters(), {.lr = 0.01});
    std::vector<double> times;
    for (int step = 0; step < kWarmup + kSteps; ++step) {
      const absl::Time start = absl::Now();
      opt.zero_grad();
      Tensor loss;
      {
        std::optional<autocast> ac;
        if (mixed) ac.emplace(DeviceType::kCPU);
        loss = functional::cross_entropy((*net)(x), y);
      }
      loss.backward();
      opt.step();
      times.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    ms.insert(ms.end(), times.begin() + kWarmup, times.end());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  state.counters["median_ms"] = ms[ms.size() / 2];
}
BENCHMARK(BM_AutocastStep)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember::nn

BENCHMARK_MAIN();
