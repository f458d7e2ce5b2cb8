// Elementwise add of 16M float32 elements (64 MiB per operand) against its
// baseline, std::memcpy of the same 64 MiB, in the same binary.
//
// Bytes counted: the bytes each loop moves through memory. memcpy reads 64 MiB
// and writes 64 MiB (2 x 64 MiB); add reads two operands and writes one
// (3 x 64 MiB). So bytes_per_second is memory bandwidth in both, and
//   ratio = BM_Add*'s bytes_per_second / BM_Memcpy's bytes_per_second
// is the fraction of memcpy bandwidth the add achieves (the requirement is
// >= 0.7 for the out-of-place add that reuses its output).
//
// Variants (threads = ember::set_num_threads; memcpy is always one thread):
//   BM_Memcpy                     std::memcpy, 64 MiB -> 64 MiB
//   BM_AddOut/threads:{1,0}       ops::binary_out(kAdd, out, a, b), out reused
//   BM_AddAlloc/threads:{1,0}     a.add(b): allocates a fresh 64 MiB output
//                                 each time (the page faults of a fresh mmap
//                                 are part of the cost)
//   BM_AddInPlace/threads:{1,0}   a.add_(b)
//   BM_MemcpyL2, BM_AddOutL2      the same on 128 KiB operands (cache-resident)
//   BM_MulScalarOutL2,            a * 0.5 and where(c, a, 0) with the scalar a
//   BM_WhereScalarOutL2           0-dim tensor broadcast along the run
// threads:0 means the default pool size (all cores).
//
//   bazel run -c opt //tensor/cpu:elementwise_benchmark --
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (one command line).
#include <cstring>

#include "benchmark/benchmark.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

namespace ember {
namespace {

constexpr int64_t kNumel = int64_t{16} << 20;  // 16M float32 = 64 MiB.
constexpr int64_t kBytes = kNumel * static_cast<int64_t>(sizeof(float));

// Sets the pool size for one benchmark and restores it afterwards.
class ThreadsScope {
 public:
  explicit ThreadsScope(int64_t threads) : saved_(get_num_threads()) {
    if (threads > 0) set_num_threads(static_cast<int>(threads));
  }
  ~ThreadsScope() { set_num_threads(saved_); }

 private:
  int saved_;
};

void BM_Memcpy(benchmark::State& state) {
  Tensor src = full({kNumel}, 1.0f);
  Tensor dst = zeros({kNumel});
  for (auto _ : state) {
    std::memcpy(dst.raw_data(), src.raw_data(), kBytes);
    benchmark::DoNotOptimize(dst.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kBytes);
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AddOut(benchmark::State& state) {
  ThreadsScope threads(state.range(0));
  Tensor a = full({kNumel}, 1.0f);
  Tensor b = full({kNumel}, 2.0f);
  Tensor out = zeros({kNumel});
  for (auto _ : state) {
    ops::binary_out(BinaryOp::kAdd, out, a, b);
    benchmark::DoNotOptimize(out.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * kBytes);
}
BENCHMARK(BM_AddOut)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AddAlloc(benchmark::State& state) {
  ThreadsScope threads(state.range(0));
  Tensor a = full({kNumel}, 1.0f);
  Tensor b = full({kNumel}, 2.0f);
  for (auto _ : state) {
    Tensor c = a.add(b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * kBytes);
}
BENCHMARK(BM_AddAlloc)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AddInPlace(benchmark::State& state) {
  ThreadsScope threads(state.range(0));
  Tensor a = full({kNumel}, 1.0f);
  Tensor b = full({kNumel}, 0.0f);
  for (auto _ : state) {
    a.add_(b);
    benchmark::DoNotOptimize(a.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * kBytes);
}
BENCHMARK(BM_AddInPlace)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Cache-resident variants (32K float32 = 128 KiB per operand, one thread: below
// the parallel grain): shows that the contiguous add loop is vectorised, as
// memory bandwidth no longer hides the arithmetic.
constexpr int64_t kSmallNumel = 32 << 10;
constexpr int64_t kSmallBytes = kSmallNumel * static_cast<int64_t>(sizeof(float));

void BM_MemcpyL2(benchmark::State& state) {
  Tensor src = full({kSmallNumel}, 1.0f);
  Tensor dst = zeros({kSmallNumel});
  for (auto _ : state) {
    std::memcpy(dst.raw_data(), src.raw_data(), kSmallBytes);
    benchmark::DoNotOptimize(dst.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kSmallBytes);
}
BENCHMARK(BM_MemcpyL2);

void BM_AddOutL2(benchmark::State& state) {
  Tensor a = full({kSmallNumel}, 1.0f);
  Tensor b = full({kSmallNumel}, 2.0f);
  Tensor out = zeros({kSmallNumel});
  for (auto _ : state) {
    ops::binary_out(BinaryOp::kAdd, out, a, b);
    benchmark::DoNotOptimize(out.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * kSmallBytes);
}
BENCHMARK(BM_AddOutL2);

// The same with a 0-dim (broadcast) operand: a * 0.5 (two inputs) and
// where(c, a, 0) (three, as ReLU's backward), against BM_AddOutL2's loop.
void BM_MulScalarOutL2(benchmark::State& state) {
  Tensor a = full({kSmallNumel}, 1.0f);
  Tensor half = full({}, 0.5f).expand({kSmallNumel});
  Tensor out = zeros({kSmallNumel});
  for (auto _ : state) {
    ops::binary_out(BinaryOp::kMul, out, a, half);
    benchmark::DoNotOptimize(out.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kSmallBytes);
}
BENCHMARK(BM_MulScalarOutL2);

void BM_WhereScalarOutL2(benchmark::State& state) {
  Tensor a = full({kSmallNumel}, 1.0f);
  Tensor c = randn({kSmallNumel}).gt(0);
  Tensor zero = zeros({}).expand({kSmallNumel});
  Tensor out = zeros({kSmallNumel});
  for (auto _ : state) {
    ops::where_out(out, c, a, zero);
    benchmark::DoNotOptimize(out.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 9 * kSmallBytes / 4);
}
BENCHMARK(BM_WhereScalarOutL2);

}  // namespace
}  // namespace ember
