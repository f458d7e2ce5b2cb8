// batch_norm on cuda:0 (cuDNN) against the CPU: training (batch statistics,
// the running statistics' update) and eval (running statistics), forward and
// the gradients of input, weight and bias, for BatchNorm1d's [N, C] and
// [N, C, L] and BatchNorm2d's [N, C, H, W] inputs, with and without affine
// parameters and running statistics, float32 and float64 (and float32
// running statistics under a float64 input), float16 and bfloat16 (scale,
// bias and statistics in float32 inside cuDNN; running statistics of the
// input's dtype or float32) within their precision; gradcheck and second
// derivatives in float64 through the device; the modules moved to the
// device. Without a device the GPU cases skip, saying why; the registration
// case runs everywhere.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/batch_norm_kernels.h"
#include "nn/cuda/layer_testing.h"
#include "nn/normalization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectClose;
using testing::ExpectGradcheckOnDevice;
using testing::ExpectMatchesCpu;
using ::testing::HasSubstr;
using testing::kGpu;

double Rtol(Dtype dtype) { return dtype == kFloat64 ? 1e-9 : 1e-4; }

TEST(BatchNormCudaTest, KernelsAreRegisteredForCpuAndCuda) {
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    EXPECT_TRUE(internal::batch_norm_forward.has(type));
    EXPECT_TRUE(internal::batch_norm_backward.has(type));
  }
}

const std::vector<std::vector<int64_t>>& Shapes() {
  static const std::vector<std::vector<int64_t>> shapes = {
      {16, 5},         // BatchNorm1d [N, C]
      {4, 3, 10},      // BatchNorm1d [N, C, L]
      {3, 4, 6, 7},    // BatchNorm2d
      {2, 32, 17, 9},  // more channels, odd spatial size
  };
  return shapes;
}

TEST(BatchNormCudaTest, TrainingMatchesTheCpuWithTheRunningStatisticsUpdate) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype dtype : {kFloat32, kFloat64}) {
    const TensorOptions o(dtype);
    for (const std::vector<int64_t>& shape : Shapes()) {
      for (bool affine : {true, false}) {
        const int64_t c = shape[1];
        const std::string what = absl::StrCat(std::string(dtype_name(dtype)), " ",
                                              ShapeToString(shape), affine ? " affine" : "");
        Tensor x = randn(IntArrayRef(shape), o) * 2.0 + 0.5;
        Tensor w = affine ? randn({c}, o) : Tensor(), b = affine ? randn({c}, o) : Tensor();
        Tensor rm_cpu = randn({c}, o), rv_cpu = rand({c}, o) + 0.5;
        Tensor rm_gpu = rm_cpu.to(kGpu), rv_gpu = rv_cpu.to(kGpu);
        ExpectMatchesCpu(
            [&](const std::vector<Tensor>& in) {
              const bool gpu = in[0].is_cuda();
              return functional::batch_norm(in[0], gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu,
                                            in[1], in[2], /*training=*/true, 0.2, 1e-5);
            },
            {x, w, b}, {true, affine, affine}, what, Rtol(dtype));
        ExpectClose(rm_gpu, rm_cpu, Rtol(dtype), what + " running_mean");
        ExpectClose(rv_gpu, rv_cpu, Rtol(dtype), what + " running_var");
      }
    }
  }
}

// float16 and bfloat16 inputs against float32 on the CPU from the same
// rounded values, in training (running statistics in the input's dtype, as
// after module.to(kFloat16), and in float32) and in eval.
TEST(BatchNormCudaTest, HalfAndBfloat16MatchTheCpuWithinTheirPrecision) {
  EMBER_SKIP_WITHOUT_CUDA();
  using testing::ExpectLowPrecisionMatchesCpu;
  for (auto [dtype, rtol] : {std::pair{kFloat16, 4e-3}, std::pair{kBFloat16, 3e-2}}) {
    for (const std::vector<int64_t>& shape : Shapes()) {
      const int64_t c = shape[1];
      for (Dtype stats : {dtype, kFloat32}) {
        const std::string what = absl::StrCat(ShapeToString(shape), " running statistics in ",
                                              std::string(dtype_name(stats)));
        // Both sides start from the same (rounded) statistics.
        Tensor rm_cpu = randn({c}).to(stats).to(kFloat32);
        Tensor rv_cpu = (rand({c}) + 0.5).to(stats).to(kFloat32);
        Tensor rm_gpu = rm_cpu.to(stats).to(kGpu), rv_gpu = rv_cpu.to(stats).to(kGpu);
        ExpectLowPrecisionMatchesCpu(
            [&](const std::vector<Tensor>& in) {
              const bool gpu = in[0].is_cuda();
              return functional::batch_norm(in[0], gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu,
                                            in[1], in[2], /*training=*/true, 0.2, 1e-5);
            },
            {randn(IntArrayRef(shape)) * 2.0 + 0.5, randn({c}), randn({c})}, {true, true, true},
            dtype, rtol, "training " + what);
        EXPECT_EQ(rm_gpu.dtype(), stats);
        ExpectClose(rm_gpu.to(kFloat32), rm_cpu, rtol, what + " running_mean");
        ExpectClose(rv_gpu.to(kFloat32), rv_cpu, rtol, what + " running_var");
      }
      Tensor rm = randn({c}).to(dtype), rv = (rand({c}) + 0.5).to(dtype);
      ExpectLowPrecisionMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            const Dtype on = in[0].dtype();
            return functional::batch_norm(in[0], rm.to(on).to(in[0].device()),
                                          rv.to(on).to(in[0].device()), in[1], in[2],
                                          /*training=*/false, 0.1, 1e-5);
          },
          {randn(IntArrayRef(shape)), randn({c}), randn({c})}, {true, true, true}, dtype, rtol,
          "eval " + ShapeToString(shape));
    }
  }
}

TEST(BatchNormCudaTest, TrainingWithoutRunningStatistics) {
  EMBER_SKIP_WITHOUT_CUDA();
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-3);
      },
      {randn({5, 3, 4, 4}), randn({3}), randn({3})}, {true, true, true}, "no running stats",
      Rtol(kFloat32));
}

TEST(BatchNormCudaTest, EvalMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype dtype : {kFloat32, kFloat64}) {
    const TensorOptions o(dtype);
    for (const std::vector<int64_t>& shape : Shapes()) {
      const int64_t c = shape[1];
      Tensor rm = randn({c}, o), rv = rand({c}, o) + 0.5;
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::batch_norm(in[0], rm.to(in[0].device()), rv.to(in[0].device()),
                                          in[1], in[2], /*training=*/false, 0.1, 1e-5);
          },
          {randn(IntArrayRef(shape), o), randn({c}, o), randn({c}, o)}, {true, true, true},
          absl::StrCat("eval ", std::string(dtype_name(dtype)), " ", ShapeToString(shape)),
          Rtol(dtype));
    }
  }
}

TEST(BatchNormCudaTest, Float32RunningStatisticsUnderAFloat64Input) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor rm_cpu = randn({4}), rv_cpu = rand({4}) + 0.5;
  Tensor rm_gpu = rm_cpu.to(kGpu), rv_gpu = rv_cpu.to(kGpu);
  Tensor x = randn({6, 4, 3}, TensorOptions(kFloat64));
  Tensor expected = functional::batch_norm(x, rm_cpu, rv_cpu, Tensor(), Tensor(), true, 0.3, 1e-5);
  Tensor y =
      functional::batch_norm(x.to(kGpu), rm_gpu, rv_gpu, Tensor(), Tensor(), true, 0.3, 1e-5);
  ExpectClose(y, expected, 1e-9, "output");
  EXPECT_EQ(rm_gpu.dtype(), kFloat32);
  ExpectClose(rm_gpu, rm_cpu, 1e-6, "running_mean");
  ExpectClose(rv_gpu, rv_cpu, 1e-6, "running_var");
}

TEST(BatchNormCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions f64(kFloat64);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    Tensor rm = randn({3}, f64).to(kGpu), rv = (rand({3}, f64) + 0.5).to(kGpu);
    ExpectGradcheckOnDevice(
        [&](const std::vector<Tensor>& in) {
          // Fresh running statistics each call: gradcheck's runs must not
          // see each other's updates (the output does not depend on them in
          // training, but keep the runs independent all the same).
          return functional::batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], training, 0.1,
                                        1e-5);
        },
        {randn({4, 3, 2, 3}, f64), randn({3}, f64), randn({3}, f64)});
  }
}

TEST(BatchNormCudaTest, SecondDerivativesOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions f64(kFloat64);
  Tensor x = randn({5, 2, 3}, f64).requires_grad_(true);
  Tensor w = randn({2}, f64).requires_grad_(true);
  absl::Status s = autograd::gradgradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor y = functional::batch_norm(in[0].to(kGpu), Tensor(), Tensor(), in[1].to(kGpu),
                                          Tensor(), true, 0.1, 1e-5);
        return std::vector<Tensor>{y.to(kCPU)};
      },
      {x, w});
  EXPECT_TRUE(s.ok()) << s;
}

TEST(BatchNormCudaTest, TheModulesOnTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  BatchNorm2d cpu(6);
  BatchNorm2d gpu(6);
  {
    autograd::NoGradGuard no_grad;
    cpu.weight().copy_(randn({6}));
    cpu.bias().copy_(randn({6}));
    gpu.weight().copy_(cpu.weight());
    gpu.bias().copy_(cpu.bias());
  }
  gpu.to(kGpu);
  ASSERT_TRUE(gpu.weight().is_cuda());
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({4, 6, 5, 5});
    ExpectClose(gpu.forward(x.to(kGpu)).detach(), cpu.forward(x).detach(), 1e-4,
                absl::StrCat("training step ", step));
  }
  ExpectClose(gpu.running_mean(), cpu.running_mean(), 1e-5, "running_mean after 3 steps");
  ExpectClose(gpu.running_var(), cpu.running_var(), 1e-5, "running_var after 3 steps");
  cpu.eval();
  gpu.eval();
  Tensor x = randn({2, 6, 3, 3});
  ExpectClose(gpu.forward(x.to(kGpu)).detach(), cpu.forward(x).detach(), 1e-4, "eval");

  BatchNorm1d cpu1(5), gpu1(5);
  gpu1.to(kGpu);
  Tensor v = randn({8, 5});
  ExpectClose(gpu1.forward(v.to(kGpu)).detach(), cpu1.forward(v).detach(), 1e-4, "BatchNorm1d");
  ExpectClose(gpu1.running_var(), cpu1.running_var(), 1e-5, "BatchNorm1d running_var");
}

TEST(BatchNormCudaTest, ParametersOnAnotherDeviceAreRefusedNamingThem) {
  EMBER_SKIP_WITHOUT_CUDA();
  try {
    functional::batch_norm(randn({2, 3}).to(kGpu), zeros({3}), ones({3}), Tensor(), Tensor(),
                           false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("batch_norm: expected running_mean on cuda:0"));
    EXPECT_THAT(e.what(), HasSubstr("it is on cpu"));
  }
}

}  // namespace
}  // namespace ember::nn
