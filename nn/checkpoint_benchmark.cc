// What activation checkpointing (autograd/checkpoint.h) saves and what it
// costs, on a transformer-like MLP stack and on ResNet-18, each beside the
// same training step without checkpointing in this binary;
// nn/checkpoint_benchmark_torch.py is the same with torch.utils.checkpoint.
//
//   bazel run //nn:checkpoint_benchmark
//   /root/.cache/ember/peers/torch-2.15.0/bin/python3 nn/checkpoint_benchmark_torch.py
//
// BM_MlpStack/<checkpointed>/<threads>: 8 pre-norm residual MLP blocks,
// x + fc2(gelu(fc1(layer_norm(x)))), width 256, hidden 1024, on 512 rows
// (8 sequences of 64 tokens); loss mean(out^2). checkpointed 1: each block
// under checkpoint().
// BM_ResNet18/<checkpointed>/<threads>: ResNet-18 (torchvision's layout, 10
// classes) on 16 images of 3x128x128, cross-entropy. checkpointed 1: each of
// layer1..layer4 under checkpoint() (the stem and the classifier as usual).
// A step is zero_grad (to none), forward, loss and backward; no optimizer.
// threads: set_num_threads (and OpenMP's, for oneDNN), 1 or 2.
// Counters, all from steps after the first kWarmup:
//   median_ms  the median step, wall time;
//   cpu_ms     the median step's CPU time of the whole process (every
//              thread), steadier than wall time on a shared machine;
//   saved_MiB  the activations the graph holds when the forward pass ends:
//              distinct storages of the tensors saved for backward outside
//              checkpointed regions (counted by a saved_tensors_hooks scope
//              around the forward), parameters' storages left out; the
//              PyTorch script counts the same way;
//   forward_MiB, peak_MiB  CPU memory in use when the forward pass ends, and
//              the most in use at once during the step (backward included),
//              above what was in use before it (a counting allocator in front
//              of the CPU allocator, installed for that step only, not the
//              timed ones).
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <any>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/saved_tensors_hooks.h"
#include "benchmark/benchmark.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/models/resnet.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "tensor/allocator.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

constexpr int kWarmup = 3;
constexpr double kMiB = 1024.0 * 1024.0;

// Counts the bytes the CPU allocator hands out and the most in use at once.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator* inner) : inner_(inner) {}
  DataPtr Allocate(size_t nbytes) override {
    auto* block = new Block{inner_->Allocate(nbytes), nbytes, this};
    const size_t now = in_use_.fetch_add(nbytes) + nbytes;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return DataPtr(block->data.get(), block, &Free, block->data.device());
  }
  std::string_view name() const override { return inner_->name(); }
  void RecordStream(const DataPtr& ptr, Stream stream) override {
    inner_->RecordStream(static_cast<Block*>(ptr.context())->data, stream);
  }
  // Starts a new peak from what is in use now; returns that.
  size_t ResetPeak() {
    peak_ = in_use_.load();
    return peak_;
  }
  size_t peak() const { return peak_.load(); }
  size_t in_use() const { return in_use_.load(); }

 private:
  struct Block {
    DataPtr data;
    size_t nbytes;
    CountingAllocator* owner;
  };
  static void Free(void* context) {
    auto* block = static_cast<Block*>(context);
    block->owner->in_use_.fetch_sub(block->nbytes);
    delete block;
  }
  Allocator* inner_;
  std::atomic<size_t> in_use_{0};
  std::atomic<size_t> peak_{0};
};

CountingAllocator& Counting() {
  static auto* counting = new CountingAllocator(GetCpuAllocator());
  return *counting;
}

// Distinct storages saved for backward, parameters' left out.
class SavedActivations {
 public:
  explicit SavedActivations(const Module& model) {
    for (const Tensor& p : model.parameters()) parameters_.insert(p.storage().id());
  }
  autograd::PackHook pack() {
    return [this](const Tensor& t) -> std::any {
      const void* id = t.storage().id();
      if (!parameters_.contains(id) && storages_.insert(id).second) bytes_ += t.storage().nbytes();
      return t;
    };
  }
  static autograd::UnpackHook unpack() {
    return [](const std::any& p) { return std::any_cast<Tensor>(p); };
  }
  size_t bytes() const { return bytes_; }

 private:
  std::set<const void*> parameters_, storages_;
  size_t bytes_ = 0;
};

// A pre-norm residual MLP block, a transformer layer without attention.
class MlpBlock : public Module {
 public:
  MlpBlock(int64_t width, int64_t hidden)
      : norm_(register_module("norm", std::make_shared<LayerNorm>(SizeVector{width}))),
        fc1_(register_module("fc1", std::make_shared<Linear>(width, hidden))),
        act_(register_module("act", std::make_shared<GELU>())),
        fc2_(register_module("fc2", std::make_shared<Linear>(hidden, width))) {}
  Tensor forward(const Tensor& x) override { return x + (*fc2_)((*act_)((*fc1_)((*norm_)(x)))); }

 private:
  std::shared_ptr<Module> norm_, fc1_, act_, fc2_;
};

// Calls its module under autograd::checkpoint (torch's CheckpointWrapper).
class Checkpointed : public Module {
 public:
  explicit Checkpointed(std::shared_ptr<Module> inner)
      : inner_(register_module("module", std::move(inner))) {}
  Tensor forward(const Tensor& input) override {
    return autograd::checkpoint([m = inner_](const Tensor& t) { return (*m)(t); }, input);
  }

 private:
  std::shared_ptr<Module> inner_;
};

class MlpStack : public Module {
 public:
  MlpStack(int64_t blocks, int64_t width, int64_t hidden, bool checkpointed) {
    for (int64_t i = 0; i < blocks; ++i) {
      std::shared_ptr<Module> block = std::make_shared<MlpBlock>(width, hidden);
      if (checkpointed) block = std::make_shared<Checkpointed>(block);
      blocks_.push_back(register_module(std::to_string(i), block));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& b : blocks_) h = (*b)(h);
    return h;
  }

 private:
  std::vector<std::shared_ptr<Module>> blocks_;
};

double ProcessCpuMs() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

void SetThreads(int n) {
  set_num_threads(n);
  omp_set_num_threads(n);
}

double MedianMs(std::vector<double> ms) {
  ms.erase(ms.begin(), ms.begin() + std::min<size_t>(kWarmup, ms.size()));
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0.0 : ms[ms.size() / 2];
}

// Times `step` (forward -> loss; the caller's closure runs backward), then
// measures one more step's saved activations and allocator peak.
template <typename Forward>
void Run(benchmark::State& state, Module& model, Forward forward) {
  std::vector<double> ms, cpu_ms;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuMs();
    model.zero_grad();
    forward().backward();
    cpu_ms.push_back(ProcessCpuMs() - cpu_start);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  model.zero_grad();
  SavedActivations saved(model);
  SetAllocator(DeviceType::kCPU, &Counting());
  const size_t before = Counting().ResetPeak();
  Tensor loss;
  {
    autograd::saved_tensors_hooks count(saved.pack(), SavedActivations::unpack());
    loss = forward();
  }
  const size_t after_forward = Counting().in_use() - before;
  loss.backward();
  const size_t peak = Counting().peak() - before;
  loss = Tensor();
  model.zero_grad();
  SetAllocator(DeviceType::kCPU, GetCpuAllocator());
  state.counters["median_ms"] = MedianMs(ms);
  state.counters["cpu_ms"] = MedianMs(cpu_ms);
  state.counters["saved_MiB"] = saved.bytes() / kMiB;
  state.counters["forward_MiB"] = after_forward / kMiB;
  state.counters["peak_MiB"] = peak / kMiB;
}

void BM_MlpStack(benchmark::State& state) {
  const bool checkpointed = state.range(0) != 0;
  SetThreads(static_cast<int>(state.range(1)));
  manual_seed(0);
  auto stack =
      std::make_shared<MlpStack>(/*blocks=*/8, /*width=*/256, /*hidden=*/1024, checkpointed);
  MlpStack& model = *stack;
  const Tensor x = randn({8 * 64, 256});
  Run(state, model, [&] {
    Tensor out = model(x);
    return (out * out).mean();
  });
}
BENCHMARK(BM_MlpStack)
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ResNet18(benchmark::State& state) {
  const bool checkpointed = state.range(0) != 0;
  SetThreads(static_cast<int>(state.range(1)));
  manual_seed(0);
  auto net = std::make_shared<models::ResNet18>(models::ResNetOptions{.num_classes = 10});
  models::ResNet18& model = *net;
  if (checkpointed) {
    for (const char* stage : {"layer1", "layer2", "layer3", "layer4"}) {
      model.replace_module(stage, std::make_shared<Checkpointed>(model.child(stage)));
    }
  }
  const Tensor x = randn({16, 3, 128, 128});
  const Tensor y = randint(0, 10, {16});
  Run(state, model, [&] { return functional::cross_entropy(model(x), y); });
}
BENCHMARK(BM_ResNet18)
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->Iterations(13)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::nn
