// max_pool2d, avg_pool2d and adaptive_avg_pool2d on cuda:0 against the CPU,
// forward and backward, float32 and float64: kernels, strides, paddings,
// dilations, ceil_mode, count_include_pad, adaptive windows that overlap and
// that do not divide the input, global pooling, ties and NaN in max windows,
// a deterministic max backward summed in the CPU's order,
// non-contiguous and 3-D inputs; gradcheck and second derivatives (the
// max pool's scatter/gather pair, the average pool's adjoint) in float64
// through the device. Without a device the GPU cases skip, saying why; the
// registration case runs everywhere.
#include "nn/pooling.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/gradcheck.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/cuda/layer_testing.h"
#include "nn/pooling_kernels.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectClose;
using testing::ExpectGradcheckOnDevice;
using testing::ExpectMatchesCpu;
using testing::kGpu;

double Rtol(Dtype dtype) { return dtype == kFloat64 ? 1e-12 : 1e-5; }

TEST(PoolingCudaTest, KernelsAreRegisteredForCpuAndCuda) {
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    EXPECT_TRUE(internal::max_pool2d_forward.has(type));
    EXPECT_TRUE(internal::max_pool2d_scatter.has(type));
    EXPECT_TRUE(internal::max_pool2d_gather.has(type));
    EXPECT_TRUE(internal::avg_pool2d_forward.has(type));
    EXPECT_TRUE(internal::avg_pool2d_adjoint.has(type));
  }
}

std::string Describe(const MaxPool2dOptions& o) {
  return absl::StrCat("kernel ", o.kernel_size[0], "x", o.kernel_size[1], " stride ", o.stride[0],
                      ",", o.stride[1], " padding ", o.padding[0], ",", o.padding[1], " dilation ",
                      o.dilation[0], ",", o.dilation[1], o.ceil_mode ? " ceil" : "");
}

std::string Describe(const AvgPool2dOptions& o) {
  return absl::StrCat("kernel ", o.kernel_size[0], "x", o.kernel_size[1], " stride ", o.stride[0],
                      ",", o.stride[1], " padding ", o.padding[0], ",", o.padding[1],
                      o.ceil_mode ? " ceil" : "", o.count_include_pad ? " count_include_pad" : "");
}

TEST(PoolingCudaTest, MaxPoolMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  const std::vector<MaxPool2dOptions> options = {
      {{2, 2}},                                // stride = kernel
      {{3, 3}, {2, 2}, {1, 1}},                // ResNet's
      {{3, 2}, {1, 2}, {1, 0}, {2, 1}},        // dilation, rectangles
      {{3, 3}, {2, 2}, {0, 0}, {1, 1}, true},  // ceil_mode: a partial last window
      {{2, 3}, {2, 2}, {1, 1}, {1, 1}, true},
  };
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (const MaxPool2dOptions& o : options) {
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) { return functional::max_pool2d(in[0], o); },
          {randn({2, 3, 9, 8}, TensorOptions(dtype))}, {true},
          std::string(dtype_name(dtype)) + " " + Describe(o), Rtol(dtype));
    }
  }
}

TEST(PoolingCudaTest, MaxPoolTiesAndNan) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Ties: every window's maximum appears twice or more; the argmax (and so
  // the gradient) must be the CPU's, the first.
  Tensor ties = (randn({1, 2, 6, 6}) * 2.0).round();
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::max_pool2d(in[0], {{3, 3}, {1, 1}});
      },
      {ties}, {true}, "ties", Rtol(kFloat32));
  Tensor with_nan = randn({1, 1, 4, 4});
  with_nan.view({-1}).narrow(0, 5, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  Tensor cpu = functional::max_pool2d(with_nan, {{2, 2}, {1, 1}});
  Tensor gpu = functional::max_pool2d(with_nan.to(kGpu), {{2, 2}, {1, 1}});
  ExpectClose(gpu, cpu, Rtol(kFloat32), "NaN propagates to its windows");
}

// A peak shared by many overlapping windows (kernel 5, stride 1, dilation
// and padding as well): its gradient sums up to 25 outputs', in the CPU's
// order, so it equals the CPU's bit for bit and repeats exactly.
TEST(PoolingCudaTest, MaxPoolBackwardIsDeterministicAndInTheCpusOrder) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (const MaxPool2dOptions& o :
       {MaxPool2dOptions{{5, 5}, {1, 1}, {2, 2}}, MaxPool2dOptions{{3, 3}, {1, 2}, {2, 1}, {2, 1}},
        MaxPool2dOptions{{3, 3}, {2, 2}, {1, 1}, {1, 1}, true}}) {
    SCOPED_TRACE(Describe(o));
    Tensor x = randn({2, 3, 11, 10}) - 10.0;
    x.narrow(2, 5, 1).narrow(3, 4, 1).fill_(5.0);  // the peak of every plane
    Tensor seed = randn(functional::max_pool2d(x, o).sizes()) * 1e3;
    auto grad_on = [&](Device device) {
      // detach(): x.to(kCPU) is x itself, which must stay a constant.
      Tensor leaf = x.detach().to(device).requires_grad_(true);
      functional::max_pool2d(leaf, o).backward(seed.to(device));
      return testing::HostValues(leaf.grad());
    };
    const std::vector<double> cpu = grad_on(kCPU), first = grad_on(kGpu), second = grad_on(kGpu);
    EXPECT_EQ(first, cpu);
    EXPECT_EQ(second, first);
  }
}

TEST(PoolingCudaTest, AvgPoolMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  std::vector<AvgPool2dOptions> options;
  for (bool ceil : {false, true}) {
    for (bool include_pad : {true, false}) {
      options.push_back({{2, 2}, {2, 2}, {0, 0}, ceil, include_pad});
      options.push_back({{3, 3}, {2, 2}, {1, 1}, ceil, include_pad});
      options.push_back({{3, 2}, {2, 3}, {1, 1}, ceil, include_pad});
    }
  }
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (const AvgPool2dOptions& o : options) {
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) { return functional::avg_pool2d(in[0], o); },
          {randn({2, 3, 9, 8}, TensorOptions(dtype))}, {true},
          std::string(dtype_name(dtype)) + " " + Describe(o), Rtol(dtype));
    }
  }
}

TEST(PoolingCudaTest, AdaptiveAvgPoolMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<std::vector<int64_t>, Int2>> cases = {
      {{2, 4, 7, 7}, {1, 1}},  // global (ResNet's head)
      {{2, 3, 5, 7}, {3, 2}},  // windows that overlap and do not divide
      {{1, 2, 4, 6}, {4, 6}},  // identity
      {{1, 2, 3, 3}, {5, 4}},  // more outputs than inputs
  };
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (const auto& [shape, out] : cases) {
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::adaptive_avg_pool2d(in[0], out);
          },
          {randn(IntArrayRef(shape), TensorOptions(dtype))}, {true},
          absl::StrCat(std::string(dtype_name(dtype)), " ", ShapeToString(shape), " to ", out[0],
                       "x", out[1]),
          Rtol(dtype));
    }
  }
}

TEST(PoolingCudaTest, NonContiguousAndThreeDimensionalInputs) {
  EMBER_SKIP_WITHOUT_CUDA();
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::max_pool2d(in[0].transpose(2, 3), {{3, 3}, {2, 2}, {1, 1}});
      },
      {randn({2, 3, 8, 10})}, {true}, "max, transposed", Rtol(kFloat32));
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::avg_pool2d(in[0].permute({0, 3, 1, 2}), {{2, 2}});
      },
      {randn({2, 6, 6, 3})}, {true}, "avg, channels last storage", Rtol(kFloat32));
  ExpectMatchesCpu(
      [](const std::vector<Tensor>& in) {
        return functional::adaptive_avg_pool2d(in[0], {2, 3});
      },
      {randn({4, 5, 7})}, {true}, "adaptive, [C, H, W]", Rtol(kFloat32));
}

TEST(PoolingCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions f64(kFloat64);
  // Distinct values, so that the finite differences do not cross a tie.
  Tensor distinct = (arange(2 * 2 * 5 * 6, f64) * 0.37).sin().view({2, 2, 5, 6});
  ExpectGradcheckOnDevice(
      [](const std::vector<Tensor>& in) {
        return functional::max_pool2d(in[0], {{3, 2}, {2, 2}, {1, 1}, {1, 2}, true});
      },
      {distinct});
  ExpectGradcheckOnDevice(
      [](const std::vector<Tensor>& in) {
        return functional::avg_pool2d(in[0], {{3, 3}, {2, 2}, {1, 1}, true, false});
      },
      {randn({2, 2, 5, 6}, f64)});
  ExpectGradcheckOnDevice(
      [](const std::vector<Tensor>& in) {
        return functional::adaptive_avg_pool2d(in[0], {3, 4});
      },
      {randn({1, 3, 5, 7}, f64)});
}

TEST(PoolingCudaTest, SecondDerivativesOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Note [Pooling double backward]: the max pool's scatter and gather, and
  // the average pool and its adjoint, all on the device.
  const TensorOptions f64(kFloat64);
  Tensor distinct = (arange(2 * 4 * 5, f64) * 0.61).cos().view({1, 2, 4, 5}).requires_grad_(true);
  absl::Status max = autograd::gradgradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            functional::max_pool2d(in[0].to(kGpu), {{2, 2}, {1, 1}}).to(kCPU)};
      },
      {distinct});
  EXPECT_TRUE(max.ok()) << max;
  Tensor x = randn({1, 2, 5, 4}, f64).requires_grad_(true);
  absl::Status avg = autograd::gradgradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            functional::avg_pool2d(in[0].to(kGpu), {{2, 3}, {1, 2}, {1, 1}, true, true}).to(kCPU)};
      },
      {x});
  EXPECT_TRUE(avg.ok()) << avg;
}

}  // namespace
}  // namespace ember::nn
