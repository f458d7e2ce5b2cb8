// Training step of a 4x512 ReLU MLP with a 10-way head (batch 64,
// cross-entropy, SGD lr 0.01), the shape of ../shared/peers'
// libtorch_autograd.cc: Ember's nn + autograd + optim against the same step
// written directly on cblas (the floor: the GEMMs and three elementwise
// passes, no allocation, no graph).
//
// Threads: the intra-op pool has one thread, as the peer's
// torch::set_num_threads(1). The argument is the number of OpenBLAS threads:
// 1, or 0 for OpenBLAS's default (one per core), which is what the peer gets,
// since set_num_threads does not reach Debian's OpenBLAS (run it with
// OPENBLAS_NUM_THREADS=1 to compare with /1). nn/compare_mlp_with_libtorch.sh
// runs both side by side, using the PeerProtocol/ variants: like the peer,
// 30 steps of a fresh model in a fresh process, median of the last 25.
//
//   bazel run //nn:mlp_benchmark -- --benchmark_min_time=2
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "nn/activation.h"
#include "nn/benchmark_mlp.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

constexpr int kBatch = 64;
constexpr int kWidth = 512;
constexpr int kHidden = 4;
constexpr int kClasses = 10;
constexpr float kLr = 0.01f;

// Times each step too and reports the median of all but the first five as
// "median_ms", the peer's statistic (a median resists the noise of a shared
// machine).
class StepTimer {
 public:
  void Start() { start_ = std::chrono::steady_clock::now(); }
  void Stop() {
    times_.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count());
  }
  void Report(benchmark::State& state) {
    const size_t warmup = times_.size() > 10 ? 5 : 0;
    std::vector<double> t(times_.begin() + warmup, times_.end());
    if (t.empty()) return;
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    state.counters["median_ms"] = t[t.size() / 2];
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::vector<double> times_;
};

void SetThreads(const benchmark::State& state) {
  set_num_threads(1);
  const int blas_threads = static_cast<int>(state.range(0));
  openblas_set_num_threads(blas_threads > 0 ? blas_threads : openblas_get_num_procs());
}

void BM_EmberMlpStep(benchmark::State& state) {
  SetThreads(state);
  std::shared_ptr<Sequential> model = benchmark_mlp(kWidth, kHidden, kClasses);
  optim::SGD opt(model->parameters(), {.lr = kLr});
  Tensor x = randn({kBatch, kWidth});
  Tensor y = randint(0, kClasses, {kBatch});
  double loss = 0;
  StepTimer timer;
  for (auto _ : state) {
    timer.Start();
    // LibTorch 1.13's Optimizer::zero_grad() zeroes gradients in place (it has
    // no set_to_none); do the same step.
    opt.zero_grad(/*set_to_none=*/false);
    Tensor l = functional::cross_entropy((*model)(x), y);
    l.backward();
    opt.step();
    loss = l.item<double>();
    timer.Stop();
  }
  timer.Report(state);
  state.counters["loss"] = loss;
}
BENCHMARK(BM_EmberMlpStep)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
// The peer's protocol: a fresh model, 30 steps, the median of the last 25.
BENCHMARK(BM_EmberMlpStep)
    ->Name("PeerProtocol/EmberMlpStep")
    ->Arg(1)
    ->Arg(0)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void Sgd(float* __restrict p, const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] -= kLr * g[i];
}

// The same step on raw buffers and cblas_sgemm.
void BM_CblasMlpStep(benchmark::State& state) {
  SetThreads(state);
  manual_seed(0);
  const int layers = kHidden + 1;
  std::vector<int> in(layers, kWidth), out(layers, kWidth);
  out[kHidden] = kClasses;
  std::vector<std::vector<float>> w(layers), b(layers), gw(layers), gb(layers);
  for (int l = 0; l < layers; ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in[l]));
    Tensor wt = rand({out[l], in[l]}) * (2 * bound) - bound;
    Tensor bt = rand({out[l]}) * (2 * bound) - bound;
    w[l].assign(wt.data_ptr<float>(), wt.data_ptr<float>() + wt.numel());
    b[l].assign(bt.data_ptr<float>(), bt.data_ptr<float>() + bt.numel());
    gw[l].resize(w[l].size());
    gb[l].resize(b[l].size());
  }
  Tensor xt = randn({kBatch, kWidth});
  Tensor yt = randint(0, kClasses, {kBatch});
  std::vector<float> x(xt.data_ptr<float>(), xt.data_ptr<float>() + xt.numel());
  const int64_t* y = yt.data_ptr<int64_t>();
  // acts[l] is the input of layer l; acts[layers] the logits.
  std::vector<std::vector<float>> acts(layers + 1), grads(layers + 1);
  acts[0] = x;
  for (int l = 0; l < layers; ++l) {
    acts[l + 1].resize(kBatch * out[l]);
    grads[l + 1].resize(kBatch * out[l]);
  }
  grads[0].resize(kBatch * kWidth);
  double loss = 0;
  StepTimer timer;
  for (auto _ : state) {
    timer.Start();
    // Forward: a = relu(a W^T + b).
    for (int l = 0; l < layers; ++l) {
      float* o = acts[l + 1].data();
      for (int i = 0; i < kBatch; ++i) std::copy(b[l].begin(), b[l].end(), o + i * out[l]);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kBatch, out[l], in[l], 1.0f,
                  acts[l].data(), in[l], w[l].data(), in[l], 1.0f, o, out[l]);
      if (l < kHidden) {
        float* __restrict r = o;
        for (int i = 0; i < kBatch * out[l]; ++i) r[i] = std::max(r[i], 0.0f);
      }
    }
    // Cross-entropy (mean) and its gradient: (softmax - one_hot) / batch.
    loss = 0;
    for (int i = 0; i < kBatch; ++i) {
      const float* z = acts[layers].data() + i * kClasses;
      float* g = grads[layers].data() + i * kClasses;
      const float mx = *std::max_element(z, z + kClasses);
      double sum = 0;
      for (int j = 0; j < kClasses; ++j) sum += std::exp(z[j] - mx);
      const double lse = mx + std::log(sum);
      loss += lse - z[y[i]];
      for (int j = 0; j < kClasses; ++j) {
        g[j] = static_cast<float>((std::exp(z[j] - lse) - (j == y[i])) / kBatch);
      }
    }
    loss /= kBatch;
    // Backward and SGD.
    for (int l = layers - 1; l >= 0; --l) {
      const float* g = grads[l + 1].data();
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out[l], in[l], kBatch, 1.0f, g, out[l],
                  acts[l].data(), in[l], 0.0f, gw[l].data(), in[l]);
      float* __restrict pgb = gb[l].data();
      std::fill(pgb, pgb + out[l], 0.0f);
      for (int i = 0; i < kBatch; ++i) {
        const float* __restrict row = g + i * out[l];
        for (int j = 0; j < out[l]; ++j) pgb[j] += row[j];
      }
      if (l > 0) {
        float* __restrict gin = grads[l].data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kBatch, in[l], out[l], 1.0f, g,
                    out[l], w[l].data(), in[l], 0.0f, gin, in[l]);
        const float* __restrict a = acts[l].data();
        for (int i = 0; i < kBatch * in[l]; ++i) gin[i] = a[i] > 0 ? gin[i] : 0.0f;
      }
      Sgd(w[l].data(), gw[l].data(), w[l].size());
      Sgd(b[l].data(), gb[l].data(), b[l].size());
    }
    benchmark::DoNotOptimize(loss);
    timer.Stop();
  }
  timer.Report(state);
  state.counters["loss"] = loss;
}
BENCHMARK(BM_CblasMlpStep)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CblasMlpStep)
    ->Name("PeerProtocol/CblasMlpStep")
    ->Arg(1)
    ->Arg(0)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::nn
