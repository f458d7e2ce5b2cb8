// Training steps on cuda:0, the GPU figures of BENCHMARKS.md:
//   BM_ResNet18Step       ResNet-18, batch 64, 3x224x224, fp32, SGD: against
//                         PyTorch eager on the same GPU (torch_train_step.py);
//                         host_ms (and its forward and backward parts) is
//                         the time the host takes to enqueue a step;
//                         BM_ResNet18StepGraph the same with conv2d through
//                         cuDNN's graph API (set_graph_api(true), figures
//                         suffixed _graph), in the same binary
//   BM_Mlp512Step         the 4x512 MLP of nn/benchmark_mlp.h, batch 64, fp32,
//                         SGD: against PyTorch's; host_us is the time the host
//                         takes to enqueue a step
//   BM_LayerHost/<layer>  the host's time per call of one of ResNet-18's
//                         layers on a small batch (so the device keeps up):
//                         conv2d forward, conv2d forward and backward through
//                         autograd, batch_norm forward in training, relu;
//                         against PyTorch's same calls (torch_train_step.py);
//                         and the two conv2d calls again through cuDNN's
//                         graph API (conv2d_graph, conv2d_fwd_bwd_graph)
//   BM_Mlp4096Bf16Step    a 4x4096 MLP (10-way head), batch 4096, bfloat16:
//                         against the same step's GEMMs alone, issued
//                         straight to cuBLAS (cublasGemmEx, bf16 in and out,
//                         fp32 accumulation) in the same iterations
//   BM_ResNet18StepGraphed the ResNet-18 step captured once in a CUDA graph
//                         (cuda/graphs.h) and replayed, against PyTorch's
//                         torch.cuda.graph step; BM_ResNet18StepAutocast the
//                         eager step under bfloat16 autocast, and graphed
//                         (suffix _graphed), against torch.autocast's
//   BM_Mlp4096AutocastStep the 4x4096 MLP in float32 parameters under
//                         bfloat16 autocast, against torch.autocast's and
//                         against the bfloat16 step's GEMMs
//   BM_CachedAllocFree    one cached 1 MiB allocation and its free through the
//                         caching allocator, against torch.cuda's
//                         caching_allocator_alloc / caching_allocator_delete
//   BM_SdpaStep/<causal>  scaled_dot_product_attention's forward and backward
//                         (cuDNN's fused graphs, Note [cuDNN fused attention]
//                         in nn/cuda/attention.cc) at B=4, H=16, L=S=2048,
//                         E=64, bfloat16, against torch's (its flash or cuDNN
//                         backend, as torch picks); fused_calls counts the
//                         calls that took the fused graphs (0: the composed
//                         path ran, and the figure says nothing about them)
// A step is zero_grad, forward, cross-entropy, backward and the optimizer's
// step, then a device synchronisation; the figures are medians over the
// timed steps, after warm-up steps (cuDNN and cuBLAS choose their algorithms
// in the first). Each prints a line `ember-figure <name> <value>` that
// torch_train_step.py --ember-log reads to print the ratios. Without a
// device every case reports the reason and measures nothing.
//
//   bazel run -c opt //nn/cuda:train_step_benchmark
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/graphs.h"
#include "nn/models/resnet.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/benchmark_mlp.h"
#include "nn/conv.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/cudnn.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "nn/optim/sgd.h"
#include "tensor/autocast.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);

bool SkipWithoutCuda(benchmark::State& state) {
  if (cuda::is_available()) return false;
  state.SkipWithError(("no usable CUDA device: " + cuda::unavailable_reason()).c_str());
  return true;
}

void Sync() { (void)cudaDeviceSynchronize(); }

double Now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void Figure(const char* name, double value) {
  std::printf("ember-figure %s %.4f\n", name, value);
  std::fflush(stdout);
}

// The host's times (ms) to enqueue one step and its parts: while the host
// enqueues more slowly than the device runs, the device waits.
struct HostTimes {
  double forward = 0, backward = 0, step = 0;
};

// One training step; returns the host's times to enqueue it, then waits for
// the device.
HostTimes Step(Module& model, optim::SGD& opt, const Tensor& x, const Tensor& y,
               bool float_loss) {
  const double start = Now();
  opt.zero_grad();
  Tensor logits = model(x);
  if (float_loss) logits = logits.to(kFloat32);
  Tensor loss = functional::cross_entropy(logits, y);
  const double forward = Now();
  loss.backward();
  const double backward = Now();
  opt.step();
  const HostTimes t{forward - start, backward - forward, Now() - start};
  Sync();
  return t;
}

constexpr int kWarmupSteps = 5;

// Runs a case on a usable device, reporting an exception (a kernel this
// build lacks, a device error) as the case's error, so the other cases still
// run and report.
void Guarded(benchmark::State& state, void (*run)(benchmark::State&)) {
  if (SkipWithoutCuda(state)) return;
  try {
    run(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Sets cuDNN's graph-API switch for a scope, restoring it afterwards.
class GraphApi {
 public:
  explicit GraphApi(bool on) : was_(cudnn::graph_api()) { cudnn::set_graph_api(on); }
  ~GraphApi() { cudnn::set_graph_api(was_); }
  GraphApi(const GraphApi&) = delete;
  GraphApi& operator=(const GraphApi&) = delete;

 private:
  bool was_;
};

// ResNet-18 with 1000 classes on cuda:0 in training mode, SGD lr 0.01, and
// a batch of 64 3x224x224 images: every ResNet-18 case's setup.
struct ResNet18Setup {
  std::shared_ptr<nn::models::ResNet18> net;
  std::unique_ptr<optim::SGD> opt;
  Tensor x, y;
};
ResNet18Setup MakeResNet18() {
  constexpr int64_t kBatch = 64, kImage = 224, kClasses = 1000;
  manual_seed(0);
  ResNet18Setup s;
  s.net = std::make_shared<nn::models::ResNet18>(nn::models::ResNetOptions{.num_classes = kClasses});
  s.net->to(kGpu);
  s.net->train();
  s.opt = std::make_unique<optim::SGD>(s.net->parameters(), optim::SGDOptions{.lr = 0.01});
  s.x = randn({kBatch, 3, kImage, kImage}).to(kGpu);
  s.y = randint(0, kClasses, {kBatch}).to(kGpu);
  return s;
}

// `graph`: conv2d through cuDNN's graph API; its figures end in _graph.
void ResNet18Step(benchmark::State& state, bool graph) {
  GraphApi api(graph);
  const std::string suffix = graph ? "_graph" : "";
  ResNet18Setup setup = MakeResNet18();
  auto& net = setup.net;
  optim::SGD& opt = *setup.opt;
  const Tensor& x = setup.x;
  const Tensor& y = setup.y;
  for (int i = 0; i < kWarmupSteps; ++i) Step(*net, opt, x, y, false);
  std::vector<double> ms, host, forward, backward;
  for (auto _ : state) {
    const double start = Now();
    const HostTimes t = Step(*net, opt, x, y, false);
    ms.push_back(Now() - start);
    host.push_back(t.step);
    forward.push_back(t.forward);
    backward.push_back(t.backward);
  }
  state.counters["median_ms"] = Median(ms);
  state.counters["host_ms"] = Median(host);
  state.counters["host_forward_ms"] = Median(forward);
  state.counters["host_backward_ms"] = Median(backward);
  Figure(("resnet18_step_b64_fp32_ms" + suffix).c_str(), Median(ms));
  Figure(("resnet18_step_b64_fp32_host_ms" + suffix).c_str(), Median(host));
}
void BM_ResNet18Step(benchmark::State& state) {
  Guarded(state, [](benchmark::State& s) { ResNet18Step(s, false); });
}
BENCHMARK(BM_ResNet18Step)->Iterations(25)->Unit(benchmark::kMillisecond)->UseRealTime();
void BM_ResNet18StepGraph(benchmark::State& state) {
  Guarded(state, [](benchmark::State& s) { ResNet18Step(s, true); });
}
BENCHMARK(BM_ResNet18StepGraph)->Iterations(25)->Unit(benchmark::kMillisecond)->UseRealTime();

void Mlp512Step(benchmark::State& state) {
  constexpr int64_t kBatch = 64, kClasses = 10;
  std::shared_ptr<Sequential> mlp = benchmark_mlp(512, 4, kClasses);
  mlp->to(kGpu);
  optim::SGD opt(mlp->parameters(), {.lr = 0.01});
  manual_seed(1);
  Tensor x = randn({kBatch, 512}).to(kGpu);
  Tensor y = randint(0, kClasses, {kBatch}).to(kGpu);
  for (int i = 0; i < 20; ++i) Step(*mlp, opt, x, y, false);
  std::vector<double> ms, host;
  for (auto _ : state) {
    const double start = Now();
    host.push_back(Step(*mlp, opt, x, y, false).step);
    ms.push_back(Now() - start);
  }
  state.counters["median_us"] = Median(ms) * 1e3;
  state.counters["host_us"] = Median(host) * 1e3;
  Figure("mlp512_step_b64_fp32_us", Median(ms) * 1e3);
  Figure("mlp512_step_b64_fp32_host_us", Median(host) * 1e3);
}
void BM_Mlp512Step(benchmark::State& state) { Guarded(state, &Mlp512Step); }
BENCHMARK(BM_Mlp512Step)->Iterations(300)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The host's time per call of one layer of ResNet-18's layer1 (64 channels,
// 56x56) on a batch of 2, in microseconds: the calls are enqueued without a
// synchronisation, which comes (untimed) every 64 calls so the queue stays
// short. Layers: 0 conv2d 3x3 forward, 1 conv2d forward and backward
// (input and weight gradients) through autograd, 2 batch_norm forward in
// training mode, 3 relu, 4 and 5 the same as 0 and 1 through cuDNN's graph
// API (set_graph_api(true)).
const char* const kHostLayers[] = {"conv2d", "conv2d_fwd_bwd", "batch_norm",
                                   "relu",   "conv2d_graph",   "conv2d_fwd_bwd_graph"};

void LayerHost(benchmark::State& state) {
  const int layer = static_cast<int>(state.range(0));
  GraphApi api(layer >= 4);
  manual_seed(0);
  const TensorOptions on_gpu = TensorOptions(kFloat32).device(kGpu);
  Tensor x = randn({2, 64, 56, 56}).to(kGpu);
  Tensor w = (randn({64, 64, 3, 3}) * 0.05).to(kGpu);
  Tensor mean = zeros({64}, on_gpu), var = ones({64}, on_gpu);
  Tensor gamma = ones({64}, on_gpu), beta = zeros({64}, on_gpu);
  Tensor leaf = x.detach().requires_grad_(true), wleaf = w.detach().requires_grad_(true);
  auto call = [&] {
    switch (layer) {
      case 0:
      case 4:
        return functional::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
      case 1:
      case 5: {
        Tensor y = functional::conv2d(leaf, wleaf, Tensor(), {1, 1}, {1, 1});
        y.sum().backward();
        return y;
      }
      case 2:
        return functional::batch_norm(x, mean, var, gamma, beta, true);
      default:
        return functional::relu(x);
    }
  };
  for (int i = 0; i < 20; ++i) call();
  Sync();
  std::vector<double> us;
  for (auto _ : state) {
    const double start = Now();
    call();
    const double ms = Now() - start;
    state.SetIterationTime(ms / 1e3);
    us.push_back(ms * 1e3);
    if (us.size() % 64 == 0) Sync();
  }
  Sync();
  state.SetLabel(kHostLayers[layer]);
  state.counters["median_us"] = Median(us);
  Figure((std::string("layer_host_") + kHostLayers[layer] + "_us").c_str(), Median(us));
}
void BM_LayerHost(benchmark::State& state) { Guarded(state, &LayerHost); }
BENCHMARK(BM_LayerHost)
    ->DenseRange(0, 5)
    ->Iterations(2000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The GEMMs of one step of an MLP of `layers` (in, out) pairs at `batch`,
// bf16, issued straight to cuBLAS on the default stream: per layer the
// forward (y = x W^T), the weight gradient (dW = dY^T x) and, except for
// the first layer (its input needs no gradient), the input gradient
// (dX = dY W). Row-major tensors are cuBLAS's column-major transposes.
class RawGemms {
 public:
  RawGemms(int64_t batch, std::vector<std::pair<int64_t, int64_t>> layers)
      : batch_(batch), layers_(std::move(layers)) {
    int64_t widest = 1;
    for (auto [in, out] : layers_) widest = std::max({widest, in, out});
    const TensorOptions bf16 = TensorOptions(kBFloat16).device(kGpu);
    x_ = (randn({batch_, widest}) * 0.1).to(kBFloat16).to(kGpu);
    dy_ = (randn({batch_, widest}) * 0.1).to(kBFloat16).to(kGpu);
    w_ = (randn({widest, widest}) * 0.01).to(kBFloat16).to(kGpu);
    out_ = empty({std::max(batch_, widest), widest}, bf16);
    ok_ = cublasCreate(&handle_) == CUBLAS_STATUS_SUCCESS;
  }
  ~RawGemms() {
    if (ok_) cublasDestroy(handle_);
  }
  bool ok() const { return ok_; }

  // Enqueues the GEMMs; false when cuBLAS refuses one.
  bool Run() {
    const float alpha = 1, beta = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const int in = static_cast<int>(layers_[l].first), out = static_cast<int>(layers_[l].second);
      const int b = static_cast<int>(batch_);
      // y^T[out, b] = W[out, in] x^T[in, b]
      if (!Gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, w_, in, x_, in, out, alpha, beta)) return false;
      // dW^T[in, out] = x^T[in, b] dY[b, out]
      if (!Gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, x_, in, dy_, out, in, alpha, beta)) return false;
      // dX^T[in, b] = W^T[in, out] dY^T[out, b]
      if (l > 0 && !Gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, w_, in, dy_, out, in, alpha, beta))
        return false;
    }
    return true;
  }

 private:
  bool Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const Tensor& a,
            int lda, const Tensor& b, int ldb, int ldc, float alpha, float beta) {
    return cublasGemmEx(handle_, ta, tb, m, n, k, &alpha, a.raw_data(), CUDA_R_16BF, lda,
                        b.raw_data(), CUDA_R_16BF, ldb, &beta, out_.raw_data(), CUDA_R_16BF, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  }

  int64_t batch_;
  std::vector<std::pair<int64_t, int64_t>> layers_;
  Tensor x_, dy_, w_, out_;
  cublasHandle_t handle_ = nullptr;
  bool ok_ = false;
};

void Mlp4096Bf16Step(benchmark::State& state) {
  constexpr int64_t kBatch = 4096, kWidth = 4096, kClasses = 10;
  std::shared_ptr<Sequential> mlp = benchmark_mlp(kWidth, 4, kClasses);
  mlp->to(kBFloat16);
  mlp->to(kGpu);
  optim::SGD opt(mlp->parameters(), {.lr = 0.01});
  manual_seed(1);
  Tensor x = randn({kBatch, kWidth}).to(kBFloat16).to(kGpu);
  Tensor y = randint(0, kClasses, {kBatch}).to(kGpu);
  RawGemms gemms(kBatch, {{kWidth, kWidth},
                          {kWidth, kWidth},
                          {kWidth, kWidth},
                          {kWidth, kWidth},
                          {kWidth, kClasses}});
  if (!gemms.ok()) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  for (int i = 0; i < kWarmupSteps; ++i) {
    Step(*mlp, opt, x, y, true);
    gemms.Run();
    Sync();
  }
  // Interleaved: a step, then its GEMMs alone, each iteration.
  std::vector<double> step_ms, gemm_ms;
  for (auto _ : state) {
    double start = Now();
    Step(*mlp, opt, x, y, true);
    step_ms.push_back(Now() - start);
    start = Now();
    if (!gemms.Run()) {
      state.SkipWithError("cublasGemmEx failed");
      return;
    }
    Sync();
    gemm_ms.push_back(Now() - start);
  }
  const double step = Median(step_ms), gemm = Median(gemm_ms);
  state.counters["step_ms"] = step;
  state.counters["gemms_ms"] = gemm;
  state.counters["ratio"] = step / gemm;
  Figure("mlp4096_step_b4096_bf16_ms", step);
  Figure("mlp4096_gemms_b4096_bf16_ms", gemm);
}
void BM_Mlp4096Bf16Step(benchmark::State& state) { Guarded(state, &Mlp4096Bf16Step); }
BENCHMARK(BM_Mlp4096Bf16Step)->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();

// One step with the forward under bfloat16 autocast when `mixed`.
void MixedStep(Module& model, optim::SGD& opt, const Tensor& x, const Tensor& y, bool mixed) {
  opt.zero_grad();
  Tensor loss;
  {
    std::optional<autocast> region;
    if (mixed) region.emplace(DeviceType::kCUDA, kBFloat16);
    loss = functional::cross_entropy(model(x), y);
  }
  loss.backward();
  opt.step();
}

// ResNet-18 b64: the eager step (autocast when `mixed`), and the same step
// captured once and replayed (`graphed`).
void ResNet18Variant(benchmark::State& state, bool mixed, bool graphed, const std::string& name) {
  ResNet18Setup setup = MakeResNet18();
  auto& net = setup.net;
  optim::SGD& opt = *setup.opt;
  const Tensor& x = setup.x;
  const Tensor& y = setup.y;
  for (int i = 0; i < kWarmupSteps; ++i) MixedStep(*net, opt, x, y, mixed);
  Sync();
  cuda::CUDAGraph g;
  if (graphed) {
    {
      cuda::graph capture(g);
      MixedStep(*net, opt, x, y, mixed);
    }
    if (absl::Status st = cuda::capture_status_of(g); !st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      return;
    }
  }
  std::vector<double> ms, host;
  for (auto _ : state) {
    const double start = Now();
    if (graphed) {
      if (absl::Status st = g.replay(); !st.ok()) {
        state.SkipWithError(std::string(st.message()).c_str());
        return;
      }
    } else {
      MixedStep(*net, opt, x, y, mixed);
    }
    host.push_back(Now() - start);
    Sync();
    ms.push_back(Now() - start);
  }
  state.counters["median_ms"] = Median(ms);
  state.counters["host_ms"] = Median(host);
  Figure((name + "_ms").c_str(), Median(ms));
  Figure((name + "_host_ms").c_str(), Median(host));
}
void BM_ResNet18StepGraphed(benchmark::State& state) {
  Guarded(state, [](benchmark::State& s) {
    ResNet18Variant(s, false, true, "resnet18_step_b64_fp32_graphed");
  });
}
BENCHMARK(BM_ResNet18StepGraphed)->Iterations(25)->Unit(benchmark::kMillisecond)->UseRealTime();
void BM_ResNet18StepAutocast(benchmark::State& state) {
  Guarded(state, [](benchmark::State& s) {
    ResNet18Variant(s, true, false, "resnet18_step_b64_autocast_bf16");
  });
}
BENCHMARK(BM_ResNet18StepAutocast)->Iterations(25)->Unit(benchmark::kMillisecond)->UseRealTime();
void BM_ResNet18StepAutocastGraphed(benchmark::State& state) {
  Guarded(state, [](benchmark::State& s) {
    ResNet18Variant(s, true, true, "resnet18_step_b64_autocast_bf16_graphed");
  });
}
BENCHMARK(BM_ResNet18StepAutocastGraphed)
    ->Iterations(25)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void Mlp4096AutocastStep(benchmark::State& state) {
  constexpr int64_t kBatch = 4096, kWidth = 4096, kClasses = 10;
  std::shared_ptr<Sequential> mlp = benchmark_mlp(kWidth, 4, kClasses);
  mlp->to(kGpu);
  optim::SGD opt(mlp->parameters(), {.lr = 0.01});
  manual_seed(1);
  Tensor x = randn({kBatch, kWidth}).to(kGpu);
  Tensor y = randint(0, kClasses, {kBatch}).to(kGpu);
  for (int i = 0; i < kWarmupSteps; ++i) MixedStep(*mlp, opt, x, y, true);
  Sync();
  std::vector<double> ms;
  for (auto _ : state) {
    const double start = Now();
    MixedStep(*mlp, opt, x, y, true);
    Sync();
    ms.push_back(Now() - start);
  }
  state.counters["median_ms"] = Median(ms);
  Figure("mlp4096_step_b4096_autocast_bf16_ms", Median(ms));
}
void BM_Mlp4096AutocastStep(benchmark::State& state) { Guarded(state, &Mlp4096AutocastStep); }
BENCHMARK(BM_Mlp4096AutocastStep)->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();

void CachedAllocFree(benchmark::State& state) {
  constexpr size_t kBytes = size_t{1} << 20;
  constexpr int kPairs = 10000;
  // The first allocation makes the segment; the pairs after it are cached.
  (void)cuda::caching_allocator_alloc(kBytes);
  std::vector<double> ns;
  for (auto _ : state) {
    const double start = Now();
    for (int i = 0; i < kPairs; ++i) {
      absl::StatusOr<DataPtr> p = cuda::caching_allocator_alloc(kBytes);
      if (!p.ok()) {
        state.SkipWithError(std::string(p.status().message()).c_str());
        return;
      }
    }
    ns.push_back((Now() - start) * 1e6 / kPairs);
  }
  state.counters["ns_per_pair"] = Median(ns);
  Figure("cached_alloc_free_1mib_ns", Median(ns));
}
void BM_CachedAllocFree(benchmark::State& state) { Guarded(state, &CachedAllocFree); }
BENCHMARK(BM_CachedAllocFree)->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();

void SdpaStep(benchmark::State& state) {
  constexpr int64_t kB = 4, kH = 16, kL = 2048, kE = 64;
  const bool causal = state.range(0) != 0;
  manual_seed(2);
  auto make = [] { return randn({kB, kH, kL, kE}).to(kGpu).to(kBFloat16); };
  Tensor q = make().requires_grad_(), k = make().requires_grad_(), v = make().requires_grad_();
  Tensor g = make();
  auto step = [&] {
    q.set_grad(Tensor());
    k.set_grad(Tensor());
    v.set_grad(Tensor());
    functional::scaled_dot_product_attention(q, k, v, {.is_causal = causal}).backward(g);
  };
  const int64_t fused_before = cudnn::internal::AttentionBackwardStats().plans;
  for (int i = 0; i < kWarmupSteps; ++i) step();
  Sync();
  const cudnn::internal::GraphPlanStats stats = cudnn::internal::AttentionBackwardStats();
  std::vector<double> ms;
  for (auto _ : state) {
    const double start = Now();
    step();
    Sync();
    ms.push_back(Now() - start);
  }
  state.counters["median_ms"] = Median(ms);
  state.counters["fused_plans"] = static_cast<double>(stats.plans - fused_before);
  if (stats.plans == fused_before) {
    state.SetLabel("composed path: " + stats.last_fallback);
  }
  Figure(causal ? "sdpa_fwd_bwd_b4h16l2048e64_bf16_causal_ms" : "sdpa_fwd_bwd_b4h16l2048e64_bf16_ms",
         Median(ms));
}
void BM_SdpaStep(benchmark::State& state) { Guarded(state, &SdpaStep); }
BENCHMARK(BM_SdpaStep)->Arg(0)->Arg(1)->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ember::nn
