// Allocation churn through the caching allocators against their uncached
// baselines, in the same benchmark: each iteration replays one fixed sequence
// of mixed-size allocate/free operations (64 live slots, sizes log-uniform
// from 256 B to 8 MiB) first through the baseline, then through the cache.
// Counters: baseline_ns and cached_ns per operation, and x_baseline, how many
// times faster the cached path is.
//
//   BM_HostChurn: BlockPool over malloc vs malloc/free (runs anywhere; it
//                 measures the pool's own bookkeeping against glibc).
//   BM_CudaChurn: the kCUDA caching allocator vs cudaMalloc/cudaFree on the
//                 current device; skipped, saying why, without a GPU.
//   BM_HostCachedPair: one cached 1 MiB allocation and its free through a
//                 BlockPool over malloc, the pool's share of the CUDA
//                 allocator's fast path (train_step_benchmark's
//                 BM_CachedAllocFree on a GPU); its time is per pair.
//   BM_CudaCachedPair, BM_CudaCurrentDevice, BM_CudaCurrentStream: the same
//                 pair through caching_allocator_alloc, and the two lookups
//                 every allocation makes before it reaches the pool, so that
//                 the fast path's host time splits into its parts; skipped,
//                 saying why, without a GPU.
//
//   bazel run //cuda:allocator_benchmark -- --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "cuda/block_pool.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "tensor/stream.h"

namespace ember::cuda {
namespace {

constexpr int kSlots = 64;
constexpr int kOps = 2000;

struct Op {
  int slot;
  size_t size;
};

const std::vector<Op>& Ops() {
  static const std::vector<Op> ops = [] {
    std::mt19937 rng(42);
    std::uniform_int_distribution<int> slot(0, kSlots - 1);
    std::uniform_real_distribution<double> log2_size(8.0, 23.0);  // 256 B .. 8 MiB
    std::vector<Op> v;
    for (int i = 0; i < kOps; ++i) {
      v.push_back({slot(rng), static_cast<size_t>(std::exp2(log2_size(rng)))});
    }
    return v;
  }();
  return ops;
}

// Replays Ops(): each op frees what its slot holds and allocates anew; then
// frees everything. Returns the seconds taken.
template <typename Alloc, typename Free>
double Churn(Alloc alloc, Free free) {
  using Handle = decltype(alloc(size_t{0}));
  std::vector<Handle> slots(kSlots);
  const auto start = std::chrono::steady_clock::now();
  for (const Op& op : Ops()) {
    if (slots[op.slot]) free(slots[op.slot]);  // Handles are pointers or DataPtrs.
    slots[op.slot] = alloc(op.size);
    benchmark::DoNotOptimize(slots[op.slot]);
  }
  for (Handle& h : slots) {
    if (h) free(h);
    h = Handle{};
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Report(benchmark::State& state, double baseline_s, double cached_s) {
  const double ops = static_cast<double>(state.iterations()) * kOps;
  state.counters["baseline_ns"] = baseline_s * 1e9 / ops;
  state.counters["cached_ns"] = cached_s * 1e9 / ops;
  state.counters["x_baseline"] = baseline_s / cached_s;
}

// True, having marked `state` skipped with the reason, when CUDA is not available.
bool SkippedWithoutCuda(benchmark::State& state) {
  absl::Status available = internal::CheckAvailable("allocator_benchmark");
  if (!available.ok()) state.SkipWithError(std::string(available.message()).c_str());
  return !available.ok();
}

// A block pool's source over malloc and free, for the host cases.
BlockPoolBacking MallocBacking() {
  BlockPoolBacking backing;
  backing.allocate = [](size_t n) -> absl::StatusOr<void*> { return std::malloc(n); };
  backing.free = [](void* p, size_t) { std::free(p); };
  return backing;
}

void BM_HostChurn(benchmark::State& state) {
  BlockPool pool(MallocBacking());
  const Stream stream;
  double baseline_s = 0;
  double cached_s = 0;
  for (auto _ : state) {
    baseline_s += Churn([](size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); });
    cached_s +=
        Churn([&](size_t n) { return *pool.allocate(n, stream); }, [&](Block* b) { pool.free(b); });
  }
  Report(state, baseline_s, cached_s);
}
BENCHMARK(BM_HostChurn)->Unit(benchmark::kMicrosecond);

void BM_HostCachedPair(benchmark::State& state) {
  BlockPool pool(MallocBacking());
  const Stream stream;
  constexpr size_t kBytes = size_t{1} << 20;
  pool.free(*pool.allocate(kBytes, stream));  // The segment; every pair after it is cached.
  for (auto _ : state) {
    Block* b = *pool.allocate(kBytes, stream);
    benchmark::DoNotOptimize(b);
    pool.free(b);
  }
}
BENCHMARK(BM_HostCachedPair);

void BM_CudaChurn(benchmark::State& state) {
  if (SkippedWithoutCuda(state)) return;
  double baseline_s = 0;
  double cached_s = 0;
  for (auto _ : state) {
    baseline_s += Churn(
        [](size_t n) {
          void* p = nullptr;
          return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
        },
        [](void* p) { cudaFree(p); });
    cached_s += Churn(
        [](size_t n) {
          absl::StatusOr<DataPtr> p = caching_allocator_alloc(n);
          return p.ok() ? std::move(*p) : DataPtr();
        },
        [](DataPtr& p) { p.Reset(); });
  }
  Report(state, baseline_s, cached_s);
}
BENCHMARK(BM_CudaChurn)->Unit(benchmark::kMillisecond);

void BM_CudaCachedPair(benchmark::State& state) {
  if (SkippedWithoutCuda(state)) return;
  constexpr size_t kBytes = size_t{1} << 20;
  (void)caching_allocator_alloc(kBytes);  // The segment; every pair after it is cached.
  for (auto _ : state) {
    absl::StatusOr<DataPtr> p = caching_allocator_alloc(kBytes);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_CudaCachedPair);

void BM_CudaCurrentDevice(benchmark::State& state) {
  if (SkippedWithoutCuda(state)) return;
  for (auto _ : state) benchmark::DoNotOptimize(current_device());
}
BENCHMARK(BM_CudaCurrentDevice);

void BM_CudaCurrentStream(benchmark::State& state) {
  if (SkippedWithoutCuda(state)) return;
  for (auto _ : state) benchmark::DoNotOptimize(ember::current_stream(Device(DeviceType::kCUDA)));
}
BENCHMARK(BM_CudaCurrentStream);

}  // namespace
}  // namespace ember::cuda
