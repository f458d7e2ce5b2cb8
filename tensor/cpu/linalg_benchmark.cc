// float32 matrix products against a direct OpenBLAS call in the same binary,
// each as BM_<name>/<n>/<threads>:
//   BM_CblasSgemm - cblas_sgemm on preallocated n x n buffers, on OpenBLAS's
//                   own `threads` threads (the baseline);
//   BM_GemmOut    - ember::ops::gemm_out into a preallocated output (the
//                   kernel alone: dispatch, layout checks, the BLAS call);
//   BM_Matmul     - a.matmul(b), allocating its result each time.
// Ember's products run on set_num_threads(threads): one single-threaded
// OpenBLAS call per part of C, the parts split over the intra-op pool (Note
// [BLAS on the team] in linalg_kernels.cc). GFLOP/s counts 2 n^3 flops per
// product. The figure of merit is BM_Matmul's (and BM_GemmOut's) GFLOP/s
// over BM_CblasSgemm's at n = 1024, per thread count.
#include <cblas.h>

#include <cstdint>

#include "benchmark/benchmark.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tensor/thread_pool.h"

namespace ember {
namespace {

struct Operands {
  Tensor a, b, out;
};

Operands Make(int64_t n) {
  manual_seed(0);
  return {randn({n, n}), randn({n, n}), empty({n, n})};
}

void SetFlops(benchmark::State& state, int64_t n) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(n) * n * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_CblasSgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  Operands o = Make(n);
  openblas_set_num_threads(static_cast<int>(state.range(1)));
  const float* a = o.a.data_ptr<float>();
  const float* b = o.b.data_ptr<float>();
  float* c = o.out.data_ptr<float>();
  const int ni = static_cast<int>(n);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a, ni, b, ni, 0.0f, c,
                ni);
  };
  run();  // Warm-up: starts OpenBLAS's threads and touches the output.
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  openblas_set_num_threads(1);  // as Ember keeps it
  SetFlops(state, n);
}

void BM_GemmOut(benchmark::State& state) {
  const int64_t n = state.range(0);
  set_num_threads(static_cast<int>(state.range(1)));
  Operands o = Make(n);
  Tensor a3 = o.a.unsqueeze(0), b3 = o.b.unsqueeze(0), out3 = o.out.unsqueeze(0);
  ops::gemm_out(out3, a3, b3, 0, 1);  // Warm-up, as in BM_CblasSgemm.
  for (auto _ : state) {
    ops::gemm_out(out3, a3, b3, 0, 1);
    benchmark::ClobberMemory();
  }
  SetFlops(state, n);
}

void BM_Matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  set_num_threads(static_cast<int>(state.range(1)));
  Operands o = Make(n);
  o.a.matmul(o.b);  // Warm-up, as in BM_CblasSgemm.
  for (auto _ : state) {
    Tensor c = o.a.matmul(o.b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  SetFlops(state, n);
}

BENCHMARK(BM_CblasSgemm)
    ->ArgsProduct({{1024, 256}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmOut)
    ->ArgsProduct({{1024, 256}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Matmul)
    ->ArgsProduct({{1024, 256}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ember
