// layer_norm on cuda:0 against the CPU, forward and backward (input, weight
// and bias; float32 and float64; rows shorter and longer than a block), and
// gradcheck in float64 through the device. Without a device the GPU cases
// skip, saying why; the registration case runs everywhere.
#include <vector>

#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/cuda/layer_testing.h"
#include "nn/layer_norm_kernels.h"
#include "nn/normalization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectGradcheckOnDevice;
using testing::ExpectMatchesCpu;
using ::testing::HasSubstr;
using testing::kGpu;

TEST(LayerNormCudaTest, KernelsAreRegisteredForCpuAndCuda) {
  EXPECT_TRUE(internal::layer_norm_forward.has(DeviceType::kCPU));
  EXPECT_TRUE(internal::layer_norm_backward.has(DeviceType::kCPU));
  EXPECT_TRUE(internal::layer_norm_forward.has(DeviceType::kCUDA));
  EXPECT_TRUE(internal::layer_norm_backward.has(DeviceType::kCUDA));
}

struct Case {
  std::vector<int64_t> input;
  std::vector<int64_t> normalized;
  bool affine;
};

TEST(LayerNormCudaTest, MatchesTheCpuForwardAndBackward) {
  EMBER_SKIP_WITHOUT_CUDA();
  const std::vector<Case> cases = {
      {{4, 7, 33}, {33}, true},      // rows shorter than a block
      {{3, 1000}, {1000}, true},     // a row strided over by 256 threads
      {{2, 3, 4, 5}, {4, 5}, true},  // normalized over two dims
      {{5, 6}, {6}, false},          // no weight or bias
      {{70, 40}, {40}, true},        // more than one column tile of 32
      {{300, 8}, {8}, true},         // parameter sums in 5 chunks of rows
      {{64, 64, 40}, {40}, true},    // 4096 rows: 64 chunks, then their sum
  };
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (const Case& c : cases) {
      const std::vector<int64_t> shape = c.normalized;
      Tensor x = randn(IntArrayRef(c.input), TensorOptions(dtype)) * 3.0 + 1.5;
      Tensor w = c.affine ? randn(IntArrayRef(shape), TensorOptions(dtype)) : Tensor();
      Tensor b = c.affine ? randn(IntArrayRef(shape), TensorOptions(dtype)) : Tensor();
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::layer_norm(in[0], shape, in[1], in[2], 1e-5);
          },
          {x, w, b}, {true, c.affine, c.affine},
          std::string(dtype_name(dtype)) + " " + ShapeToString(c.input));
    }
  }
}

TEST(LayerNormCudaTest, GradientOfTheInputAloneAndOfTheParametersAlone) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor x = randn({6, 12}, TensorOptions(kFloat64));
  Tensor w = randn({12}, TensorOptions(kFloat64)), b = randn({12}, TensorOptions(kFloat64));
  auto fn = [](const std::vector<Tensor>& in) {
    return functional::layer_norm(in[0], {12}, in[1], in[2], 1e-5);
  };
  ExpectMatchesCpu(fn, {x, w, b}, {true, false, false}, "input only");
  ExpectMatchesCpu(fn, {x, w, b}, {false, true, true}, "weight and bias only");
}

TEST(LayerNormCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  ExpectGradcheckOnDevice(
      [](const std::vector<Tensor>& in) {
        return functional::layer_norm(in[0], {2, 3}, in[1], in[2], 1e-5);
      },
      {randn({3, 2, 3}, TensorOptions(kFloat64)), randn({2, 3}, TensorOptions(kFloat64)),
       randn({2, 3}, TensorOptions(kFloat64))});
}

TEST(LayerNormCudaTest, TheModuleOnTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  LayerNorm cpu({8});
  {
    autograd::NoGradGuard no_grad;
    cpu.weight().copy_(randn({8}));
    cpu.bias().copy_(randn({8}));
  }
  Tensor x = randn({5, 8});
  Tensor expected = cpu.forward(x);
  Tensor y = functional::layer_norm(x.to(kGpu), {8}, cpu.weight().detach().to(kGpu),
                                    cpu.bias().detach().to(kGpu), 1e-5);
  testing::ExpectClose(y, expected.detach(), 1e-5, "LayerNorm(8)");
}

TEST(LayerNormCudaTest, AWeightOnAnotherDeviceIsRefusedNamingBoth) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor x = randn({2, 4}).to(kGpu);
  try {
    functional::layer_norm(x, {4}, ones({4}), Tensor(), 1e-5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layer_norm: expected weight/bias on cuda:0"));
    EXPECT_THAT(e.what(), HasSubstr("it is on cpu"));
  }
}

}  // namespace
}  // namespace ember::nn
