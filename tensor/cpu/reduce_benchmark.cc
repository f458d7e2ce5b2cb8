// Sum of a large float32 tensor against the machine's memory read bandwidth,
// measured in the same binary by plain read loops over the same 64 MiB:
//   BM_ReadBandwidthXor   - XOR of the buffer as uint64 words (integer work
//                           only, so the loop is bound by memory);
//   BM_ReadBandwidthFloat - a float sum with 16 independent accumulators;
//   BM_Sum                - ember's t.sum().
// Each runs on all the pool's threads (arg 0; the baselines split the buffer
// with ember::parallel_for into one chunk per thread) and on one thread (arg 1).
// The figure of merit is BM_Sum's bytes/s over the faster baseline's.
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tensor/thread_pool.h"

namespace ember {
namespace {

constexpr int64_t kNumel = int64_t{16} << 20;  // 16M float32 = 64 MiB.

const Tensor& Input() {
  static const Tensor* t = [] {
    manual_seed(0);
    return new Tensor(rand({kNumel}));
  }();
  return *t;
}

// Sets the pool size for one benchmark run (arg 0: all cores, else arg).
class ThreadsFor {
 public:
  explicit ThreadsFor(const benchmark::State& state) : saved_(get_num_threads()) {
    if (state.range(0) > 0) set_num_threads(static_cast<int>(state.range(0)));
  }
  ~ThreadsFor() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Runs body(begin, end) over one chunk per thread and returns the results.
template <typename R, typename F>
std::vector<R> PerThread(int64_t n, F body) {
  const int64_t chunks = get_num_threads();
  std::vector<R> out(chunks);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) out[c] = body(n * c / chunks, n * (c + 1) / chunks);
  });
  return out;
}

void BM_ReadBandwidthXor(benchmark::State& state) {
  ThreadsFor threads(state);
  const uint64_t* words = reinterpret_cast<const uint64_t*>(Input().raw_data());
  const int64_t n = kNumel / 2;
  for (auto _ : state) {
    std::vector<uint64_t> parts = PerThread<uint64_t>(n, [&](int64_t b, int64_t e) {
      uint64_t acc[8] = {};
      int64_t i = b;
      for (; i + 8 <= e; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] ^= words[i + j];
      }
      for (; i < e; ++i) acc[0] ^= words[i];
      uint64_t r = 0;
      for (uint64_t a : acc) r ^= a;
      return r;
    });
    benchmark::DoNotOptimize(parts.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kNumel * int64_t{sizeof(float)});
  state.counters["threads"] = get_num_threads();
}

void BM_ReadBandwidthFloat(benchmark::State& state) {
  ThreadsFor threads(state);
  const float* x = Input().data_ptr<float>();
  for (auto _ : state) {
    std::vector<float> parts = PerThread<float>(kNumel, [&](int64_t b, int64_t e) {
      float acc[16] = {};
      int64_t i = b;
      for (; i + 16 <= e; i += 16) {
        for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
      }
      for (; i < e; ++i) acc[0] += x[i];
      float r = 0;
      for (float a : acc) r += a;
      return r;
    });
    benchmark::DoNotOptimize(parts.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kNumel * int64_t{sizeof(float)});
  state.counters["threads"] = get_num_threads();
}

void BM_Sum(benchmark::State& state) {
  ThreadsFor threads(state);
  const Tensor& t = Input();
  for (auto _ : state) {
    Tensor s = t.sum();
    benchmark::DoNotOptimize(s.raw_data());
  }
  state.SetBytesProcessed(state.iterations() * kNumel * int64_t{sizeof(float)});
  state.counters["threads"] = get_num_threads();
}

BENCHMARK(BM_ReadBandwidthXor)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadBandwidthFloat)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Sum)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember
