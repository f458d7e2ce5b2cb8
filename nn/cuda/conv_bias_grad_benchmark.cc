// conv2d's bias gradient on cuda:0 (Note [conv2d bias gradient] in
// nn/cuda/conv.cc): Ember's reduction, grad_output.sum({0, 2, 3}), against
// cuDNN's cudnnConvolutionBackwardBias on the same float32 tensor, in
// interleaved rounds of the same iterations (each timed with CUDA events on
// the current stream). Counters: ember_us and cudnn_us (medians of one call)
// and ratio = ember_us / cudnn_us. The bfloat16 case (which cuDNN refuses)
// reports Ember's time only. Without a device every case reports the reason
// and measures nothing.
//
//   bazel run -c opt //nn/cuda:conv_bias_grad_benchmark
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/status.h"
#include "nn/cuda/cudnn.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);
constexpr int kCallsPerRound = 10;

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Microseconds of one call of `fn`, from kCallsPerRound calls between two
// events on the current stream.
double TimeUs(const std::function<void()>& fn) {
  const cudaStream_t stream = cuda::internal::StreamOf(kGpu);
  cudaEvent_t start, stop;
  EMBER_CUDA_CHECK(cudaEventCreate(&start));
  EMBER_CUDA_CHECK(cudaEventCreate(&stop));
  EMBER_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < kCallsPerRound; ++i) fn();
  EMBER_CUDA_CHECK(cudaEventRecord(stop, stream));
  EMBER_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return 1000.0 * ms / kCallsPerRound;
}

// grad_output [N, O, OH, OW] from the benchmark's arguments.
Tensor GradOutput(benchmark::State& state, Dtype dtype) {
  return randn({state.range(0), state.range(1), state.range(2), state.range(2)}).to(dtype).to(kGpu);
}

void Run(benchmark::State& state, Dtype dtype) {
  if (!cuda::is_available()) {
    state.SkipWithError(("no usable CUDA device: " + cuda::unavailable_reason()).c_str());
    return;
  }
  try {
    DeviceGuard guard(kGpu);
    const Tensor go = GradOutput(state, dtype);
    const int64_t o = go.size(1);
    Tensor sink;
    auto ember_sum = [&] { sink = go.sum(/*dims=*/{0, 2, 3}); };
    // cuDNN's reduction, float32 only.
    const cudnnDataType_t type = cudnn::internal::DataType(dtype, "conv_bias_grad_benchmark");
    cudnn::internal::TensorDescriptor yd, bd;
    yd.Set(type, {go.size(0), o, go.size(2), go.size(3)}, "conv_bias_grad_benchmark");
    bd.Set(type, {1, o, 1, 1}, "conv_bias_grad_benchmark");
    cudnn::internal::Scalars k(type);
    Tensor db = empty({o}, go.options());
    auto cudnn_sum = [&] {
      EMBER_CUDA_CHECK(cudnnConvolutionBackwardBias(cudnn::internal::Handle(kGpu), k.one(),
                                                    yd.get(), go.raw_data(), k.zero(), bd.get(),
                                                    db.raw_data()));
    };
    const bool compare = dtype == kFloat32;
    ember_sum();  // Warm-up: allocations, first launches.
    if (compare) cudnn_sum();
    std::vector<double> ember_us, cudnn_us;
    for (auto _ : state) {
      ember_us.push_back(TimeUs(ember_sum));
      if (compare) cudnn_us.push_back(TimeUs(cudnn_sum));
    }
    state.counters["ember_us"] = Median(ember_us);
    if (compare) {
      state.counters["cudnn_us"] = Median(cudnn_us);
      state.counters["ratio"] = Median(ember_us) / Median(cudnn_us);
      // The two agree (float accumulation in both, different orders).
      const double diff = (sink - db).abs().max().to(kCPU).item<float>();
      const double scale = db.abs().max().to(kCPU).item<float>();
      state.counters["max_rel_diff"] = diff / std::max(scale, 1e-30);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_BiasGradFloat32(benchmark::State& state) { Run(state, kFloat32); }
void BM_BiasGradBfloat16(benchmark::State& state) { Run(state, kBFloat16); }

// {N, O, OH (= OW)}: ResNet-like layers at batch 64, a wide small map, a
// small batch.
#define SHAPES Args({64, 64, 56})->Args({64, 256, 14})->Args({64, 512, 7})->Args({8, 32, 128})
BENCHMARK(BM_BiasGradFloat32)->SHAPES->Iterations(30)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BiasGradBfloat16)->SHAPES->Iterations(30)->Unit(benchmark::kMicrosecond);
#undef SHAPES

}  // namespace
}  // namespace ember::nn
