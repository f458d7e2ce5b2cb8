// scaled_dot_product_attention forward + backward on the CPU at B=4, H=8,
// L=S=512, E=64, float32, causal and not (Note [Fused attention on the CPU]);
// nn/testdata/torch_attention_bench.py times torch's the same way.
//
//   bazel run -c opt //nn:attention_benchmark
//   /root/.cache/ember/peers/torch-2.15.0/bin/python3 nn/testdata/torch_attention_bench.py
//
// BM_Sdpa/<causal>/<threads>: one step is the forward and the backward of
// (out * g).sum() for q, k and v that require grad. Counters:
//   median_ms       the median step, wall time;
//   fwd_extra_MiB   the most CPU memory in use at once during the forward
//                   beyond the inputs and the output (a counting allocator in
//                   front of the CPU allocator, for one untimed step): the
//                   logsumexp [B, H, L] (64 KiB here) and nothing else
//                   tensor-sized; the kernel's per-worker blocks (a few
//                   64 x 64 tiles per thread, on the heap) are not tensors
//                   and not counted. No [L, S] matrix per head is kept (that
//                   would be 4 * 8 * 512 * 512 * 4 B = 32 MiB);
//   step_peak_MiB   the same over the whole step, backward included.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string_view>
#include <vector>

#include "autograd/engine.h"
#include "benchmark/benchmark.h"
#include "nn/attention.h"
#include "tensor/allocator.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

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
  size_t ResetPeak() {
    peak_ = in_use_.load();
    return peak_;
  }
  size_t peak() const { return peak_.load(); }

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

void BM_Sdpa(benchmark::State& state) {
  const bool causal = state.range(0) != 0;
  const int threads = static_cast<int>(state.range(1));
  const int previous = get_num_threads();
  set_num_threads(threads);
  Generator gen(0);
  Tensor q = randn({4, 8, 512, 64}, TensorOptions(), &gen).requires_grad_();
  Tensor k = randn({4, 8, 512, 64}, TensorOptions(), &gen).requires_grad_();
  Tensor v = randn({4, 8, 512, 64}, TensorOptions(), &gen).requires_grad_();
  Tensor g = randn({4, 8, 512, 64}, TensorOptions(), &gen);
  auto step = [&] {
    Tensor out = functional::scaled_dot_product_attention(q, k, v, {.is_causal = causal});
    return autograd::grad({out}, {q, k, v}, {g});
  };
  step();  // warm-up
  std::vector<double> ms;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(step());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  // Memory, on one untimed step. The output is counted in the forward's peak
  // and subtracted.
  SetAllocator(DeviceType::kCPU, &Counting());
  const size_t before = Counting().ResetPeak();
  Tensor out = functional::scaled_dot_product_attention(q, k, v, {.is_causal = causal});
  const size_t forward_peak = Counting().peak() - before - out.nbytes();
  autograd::grad({out}, {q, k, v}, {g});
  const size_t step_peak = Counting().peak() - before;
  out = Tensor();
  SetAllocator(DeviceType::kCPU, GetCpuAllocator());
  set_num_threads(previous);
  std::sort(ms.begin(), ms.end());
  state.counters["median_ms"] = ms.empty() ? 0 : ms[ms.size() / 2];
  state.counters["fwd_extra_MiB"] = forward_peak / kMiB;
  state.counters["step_peak_MiB"] = step_peak / kMiB;
}
BENCHMARK(BM_Sdpa)
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ember::nn
