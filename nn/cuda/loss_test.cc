// The losses on cuda:0 against the CPU, forward and backward, for every
// reduction: cross_entropy (ignore_index, label smoothing) and nll_loss
// through their CUDA kernels, mse_loss, l1_loss and
// binary_cross_entropy_with_logits (pos_weight) through tensor ops; the
// recorded backward under create_graph; the out-of-bounds target error; and
// gradcheck in float64 through the device. Without a device the GPU cases
// skip, saying why; the registration case runs everywhere.
#include "nn/loss.h"

#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/cuda/layer_testing.h"
#include "nn/loss_kernels.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectClose;
using testing::ExpectGradcheckOnDevice;
using testing::ExpectMatchesCpu;
using ::testing::HasSubstr;
using testing::HostValues;
using testing::kGpu;

constexpr Reduction kReductions[] = {Reduction::kNone, Reduction::kMean, Reduction::kSum};

std::string Name(Reduction r) {
  return r == Reduction::kNone ? "none" : r == Reduction::kMean ? "mean" : "sum";
}

TEST(LossCudaTest, ClassLossKernelsAreRegisteredForCpuAndCuda) {
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    EXPECT_TRUE(internal::cross_entropy_forward.has(type));
    EXPECT_TRUE(internal::cross_entropy_backward.has(type));
    EXPECT_TRUE(internal::nll_loss_forward.has(type));
    EXPECT_TRUE(internal::nll_loss_backward.has(type));
  }
}

TEST(LossCudaTest, CrossEntropyMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Rows 2 and 5 are ignored (-100); 300 classes: a row strided by 256 threads.
  for (int64_t classes : {5, 300}) {
    Tensor target = tensor(std::vector<int64_t>{0, classes - 1, -100, 3, 1, -100, 2});
    for (Dtype dtype : {kFloat32, kFloat64}) {
      Tensor logits = randn({7, classes}, TensorOptions(dtype)) * 4.0;
      for (Reduction r : kReductions) {
        for (double smoothing : {0.0, 0.2}) {
          ExpectMatchesCpu(
              [&](const std::vector<Tensor>& in) {
                return functional::cross_entropy(in[0], target.to(in[0].device()),
                                                 {.reduction = r, .label_smoothing = smoothing});
              },
              {logits}, {true},
              std::string(dtype_name(dtype)) + " C=" + std::to_string(classes) + " " + Name(r) +
                  " smoothing " + std::to_string(smoothing));
        }
      }
    }
  }
}

TEST(LossCudaTest, CrossEntropyWithAClassAsIgnoreIndexAndAOneDimInput) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor logits = randn({6, 4}, TensorOptions(kFloat64));
  Tensor target = tensor({0, 1, 1, 3, 2, 1});
  ExpectMatchesCpu(
      [&](const std::vector<Tensor>& in) {
        return functional::cross_entropy(in[0], target.to(in[0].device()), {.ignore_index = 1});
      },
      {logits}, {true}, "ignore_index 1");
  Tensor row = randn({4}, TensorOptions(kFloat64));
  ExpectMatchesCpu(
      [&](const std::vector<Tensor>& in) {
        return functional::cross_entropy(in[0], tensor({2}).view({}).to(in[0].device()));
      },
      {row}, {true}, "[C] input with a 0-dim target");
}

TEST(LossCudaTest, NllLossMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor target = tensor({4, 0, -100, 2, 2});
  for (Dtype dtype : {kFloat32, kFloat64}) {
    Tensor log_probs = randn({5, 5}, TensorOptions(dtype)).log_softmax(1);
    for (Reduction r : kReductions) {
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::nll_loss(in[0], target.to(in[0].device()), {.reduction = r});
          },
          {log_probs}, {true}, std::string(dtype_name(dtype)) + " " + Name(r));
    }
  }
}

TEST(LossCudaTest, EveryRowIgnoredGivesNanMeanAndZeroGradient) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor logits = randn({3, 4}).to(kGpu).requires_grad_(true);
  Tensor target = full({3}, -100, TensorOptions(kInt64)).to(kGpu);
  Tensor loss = functional::cross_entropy(logits, target);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  functional::cross_entropy(logits, target, {.reduction = Reduction::kSum}).backward();
  EXPECT_EQ(HostValues(logits.grad()), std::vector<double>(12, 0.0));
}

TEST(LossCudaTest, ElementwiseLossesMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (Dtype dtype : {kFloat32, kFloat64}) {
    Tensor x = randn({4, 6}, TensorOptions(dtype)), y = randn({4, 6}, TensorOptions(dtype));
    Tensor labels = rand({4, 6}, TensorOptions(dtype));
    Tensor pos_weight = rand({6}, TensorOptions(dtype)) + 0.5;
    for (Reduction r : kReductions) {
      const std::string what = std::string(dtype_name(dtype)) + " " + Name(r);
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) { return functional::mse_loss(in[0], in[1], r); },
          {x, y}, {true, true}, "mse_loss " + what);
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) { return functional::l1_loss(in[0], in[1], r); },
          {x, y}, {true, true}, "l1_loss " + what);
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::binary_cross_entropy_with_logits(in[0], in[1], r);
          },
          {x, labels}, {true, true}, "binary_cross_entropy_with_logits " + what);
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::binary_cross_entropy_with_logits(in[0], in[1], r, in[2]);
          },
          {x, labels, pos_weight}, {true, false, true},
          "binary_cross_entropy_with_logits pos_weight " + what);
    }
  }
}

TEST(LossCudaTest, AnOutOfBoundsTargetIsNamed) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor logits = randn({4, 3}).to(kGpu);
  for (bool nll : {false, true}) {
    // The first bad target in row order is reported.
    Tensor target = tensor({0, 7, -100, -5}).to(kGpu);
    try {
      nll ? functional::nll_loss(logits, target) : functional::cross_entropy(logits, target);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("Target 7 is out of bounds."));
    }
  }
}

TEST(LossCudaTest, ATargetOnAnotherDeviceIsRefused) {
  EMBER_SKIP_WITHOUT_CUDA();
  try {
    functional::cross_entropy(randn({2, 3}).to(kGpu), tensor({0, 1}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cross_entropy: expected target on cuda:0"));
  }
}

// The recorded backward (create_graph) runs in tensor ops on the device: its
// first derivative equals the CPU's, and it can be differentiated again.
TEST(LossCudaTest, RecordedBackwardOnTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor logits = randn({5, 4}, TensorOptions(kFloat64));
  Tensor target = tensor({0, 3, -100, 1, 1});
  auto first = [&](Device device, bool nll) {
    Tensor x = logits.to(device).requires_grad_(true);
    Tensor t = target.to(device);
    CrossEntropyOptions ce{.label_smoothing = 0.1};
    Tensor loss =
        nll ? functional::nll_loss(x.log_softmax(1), t) : functional::cross_entropy(x, t, ce);
    Tensor g = autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    EXPECT_TRUE(g.requires_grad());
    Tensor gg = autograd::grad({(g * g).sum()}, {x})[0];
    return std::vector<Tensor>{g.detach(), gg};
  };
  for (bool nll : {false, true}) {
    std::vector<Tensor> cpu = first(kCPU, nll), gpu = first(kGpu, nll);
    ExpectClose(gpu[0], cpu[0], 1e-10, nll ? "nll first derivative" : "ce first derivative");
    ExpectClose(gpu[1], cpu[1], 1e-10, nll ? "nll second derivative" : "ce second derivative");
  }
}

TEST(LossCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor target = tensor({2, -100, 0, 1});
  Tensor x = randn({4, 3}, TensorOptions(kFloat64));
  for (Reduction r : kReductions) {
    SCOPED_TRACE(Name(r));
    ExpectGradcheckOnDevice(
        [&](const std::vector<Tensor>& in) {
          return functional::cross_entropy(in[0], target.to(kGpu),
                                           {.reduction = r, .label_smoothing = 0.15});
        },
        {x});
    ExpectGradcheckOnDevice(
        [&](const std::vector<Tensor>& in) {
          return functional::nll_loss(in[0], target.to(kGpu), {.reduction = r});
        },
        {x});
    ExpectGradcheckOnDevice(
        [&](const std::vector<Tensor>& in) { return functional::mse_loss(in[0], in[1], r); },
        {x, randn({4, 3}, TensorOptions(kFloat64))});
    ExpectGradcheckOnDevice(
        [&](const std::vector<Tensor>& in) {
          return functional::binary_cross_entropy_with_logits(in[0], in[1], r, in[2]);
        },
        {x, rand({4, 3}, TensorOptions(kFloat64)), rand({3}, TensorOptions(kFloat64)) + 0.5});
  }
  // |x - y| is differentiable away from x == y; these stay apart.
  ExpectGradcheckOnDevice(
      [](const std::vector<Tensor>& in) { return functional::l1_loss(in[0], in[1]); },
      {tensor({0.5, -1.0, 2.0}, TensorOptions(kFloat64)),
       tensor({-0.5, 1.0, 1.0}, TensorOptions(kFloat64))});
}

}  // namespace
}  // namespace ember::nn
