// The CUDA kernels against raw CUDA baselines, measured in the same run:
//   BM_AddFloat32 vs BM_MemcpyDeviceToDevice   (256M float32: bytes per second)
//   BM_SumFloat32 vs BM_MemcpyDeviceToDevice   (the sum reads 1 GiB once)
//   BM_ColumnSumBFloat16 vs BM_MemcpyDeviceToDevice (a Linear's bias gradient:
//     [4096, 4096] summed over dim 0, 32 MiB read once, 20 calls a sync)
//   BM_MatmulBFloat16 vs BM_RawCublasGemmBFloat16 (8192^3 on the same buffers)
//   BM_SmallAddHostOverhead vs BM_SmallMemcpyAsync (host time per call)
// Run: bazel run -c opt //cuda:kernels_benchmark. Without a device every case
// reports the reason and measures nothing.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "benchmark/benchmark.h"
#include "cuda/device.h"
#include "tensor/factories.h"
#include "tensor/ops.h"

namespace ember {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);
constexpr int64_t k256M = int64_t{256} << 20;

bool SkipWithoutCuda(benchmark::State& state) {
  if (cuda::is_available()) return false;
  state.SkipWithError(("no usable CUDA device: " + cuda::unavailable_reason()).c_str());
  return true;
}

void Sync() { (void)cudaDeviceSynchronize(); }

void BM_MemcpyDeviceToDevice(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = ones({k256M}, TensorOptions(kFloat32).device(kGpu));
  Tensor b = empty({k256M}, TensorOptions(kFloat32).device(kGpu));
  for (auto _ : state) {
    (void)cudaMemcpy(b.raw_data(), a.raw_data(), a.nbytes(), cudaMemcpyDeviceToDevice);
    Sync();
  }
  state.SetBytesProcessed(state.iterations() * 2 * a.nbytes());  // read + write
}
BENCHMARK(BM_MemcpyDeviceToDevice)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_AddFloat32(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = ones({k256M}, TensorOptions(kFloat32).device(kGpu));
  Tensor b = ones({k256M}, TensorOptions(kFloat32).device(kGpu));
  Tensor out = empty({k256M}, TensorOptions(kFloat32).device(kGpu));
  for (auto _ : state) {
    ops::binary_out(BinaryOp::kAdd, out, a, b);
    Sync();
  }
  state.SetBytesProcessed(state.iterations() * 3 * a.nbytes());  // two reads, one write
}
BENCHMARK(BM_AddFloat32)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SumFloat32(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = ones({k256M}, TensorOptions(kFloat32).device(kGpu));
  for (auto _ : state) {
    benchmark::DoNotOptimize(a.sum());
    Sync();
  }
  state.SetBytesProcessed(state.iterations() * a.nbytes());
}
BENCHMARK(BM_SumFloat32)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_ColumnSumBFloat16(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  constexpr int kCalls = 20;
  Tensor a = ones({4096, 4096}, TensorOptions(kBFloat16).device(kGpu));
  for (auto _ : state) {
    for (int i = 0; i < kCalls; ++i) benchmark::DoNotOptimize(a.sum({0}));
    Sync();
  }
  state.SetBytesProcessed(state.iterations() * kCalls * a.nbytes());
}
BENCHMARK(BM_ColumnSumBFloat16)->UseRealTime()->Unit(benchmark::kMicrosecond);

constexpr int kMatmulN = 8192;

void BM_MatmulBFloat16(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = randn({kMatmulN, kMatmulN}).to(kBFloat16).to(kGpu);
  Tensor b = randn({kMatmulN, kMatmulN}).to(kBFloat16).to(kGpu);
  Tensor out = empty({1, kMatmulN, kMatmulN}, TensorOptions(kBFloat16).device(kGpu));
  for (auto _ : state) {
    ops::gemm_out(out, a.unsqueeze(0), b.unsqueeze(0), 0, 1);
    Sync();
  }
  state.counters["TFLOPS"] = benchmark::Counter(2.0 * kMatmulN * kMatmulN * kMatmulN * 1e-12,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MatmulBFloat16)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_RawCublasGemmBFloat16(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = randn({kMatmulN, kMatmulN}).to(kBFloat16).to(kGpu);
  Tensor b = randn({kMatmulN, kMatmulN}).to(kBFloat16).to(kGpu);
  Tensor out = empty({kMatmulN, kMatmulN}, TensorOptions(kBFloat16).device(kGpu));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  const float alpha = 1, beta = 0;
  for (auto _ : state) {
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kMatmulN, kMatmulN, kMatmulN, &alpha, b.raw_data(),
                 CUDA_R_16BF, kMatmulN, a.raw_data(), CUDA_R_16BF, kMatmulN, &beta, out.raw_data(),
                 CUDA_R_16BF, kMatmulN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    Sync();
  }
  cublasDestroy(h);
  state.counters["TFLOPS"] = benchmark::Counter(2.0 * kMatmulN * kMatmulN * kMatmulN * 1e-12,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_RawCublasGemmBFloat16)->UseRealTime()->Unit(benchmark::kMillisecond);

// Host time per call of a one-element add (no synchronisation in the loop),
// against the cheapest asynchronous runtime call on the same stream.
void BM_SmallAddHostOverhead(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = ones({1}, TensorOptions(kFloat32).device(kGpu));
  Tensor out = empty({1}, TensorOptions(kFloat32).device(kGpu));
  for (auto _ : state) ops::binary_out(BinaryOp::kAdd, out, a, a);
  Sync();
}
BENCHMARK(BM_SmallAddHostOverhead);

void BM_SmallMemcpyAsync(benchmark::State& state) {
  if (SkipWithoutCuda(state)) return;
  Tensor a = ones({1}, TensorOptions(kFloat32).device(kGpu));
  Tensor out = empty({1}, TensorOptions(kFloat32).device(kGpu));
  for (auto _ : state) {
    (void)cudaMemcpyAsync(out.raw_data(), a.raw_data(), 4, cudaMemcpyDeviceToDevice, nullptr);
  }
  Sync();
}
BENCHMARK(BM_SmallMemcpyAsync);

}  // namespace
}  // namespace ember
