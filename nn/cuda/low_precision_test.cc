// float16 and bfloat16 through nn/cuda's float kernels (Note [float16 and
// bfloat16 through float32] in low_precision.h): max/avg/adaptive pooling,
// layer_norm, embedding and the class losses on cuda:0 in each dtype against
// float32 on the CPU from the same rounded values, forward and backward,
// results in the call's dtype. Everywhere: the CPU kernels still refuse
// those dtypes naming them, and the helpers keep undefined tensors and
// other dtypes as they are. Without a device the GPU cases skip, saying why.
#include "nn/cuda/low_precision.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/cuda/layer_testing.h"
#include "nn/embedding.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "nn/pooling.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using cuda_kernels::IsLowPrecision;
using cuda_kernels::ToDtype;
using cuda_kernels::ToFloat;
using testing::ExpectLowPrecisionMatchesCpu;
using ::testing::HasSubstr;

// Each dtype with the tolerance of its rounding (11 and 8 mantissa bits).
const std::vector<std::pair<Dtype, double>>& Dtypes() {
  static const std::vector<std::pair<Dtype, double>> dtypes = {{kFloat16, 4e-3},
                                                               {kBFloat16, 3e-2}};
  return dtypes;
}

TEST(LowPrecisionTest, OnlyFloat16AndBfloat16GoThroughFloat32) {
  EXPECT_TRUE(IsLowPrecision(zeros({2}).to(kFloat16)));
  EXPECT_TRUE(IsLowPrecision(zeros({2}).to(kBFloat16)));
  EXPECT_FALSE(IsLowPrecision(zeros({2})));
  EXPECT_FALSE(IsLowPrecision(zeros({2}, TensorOptions(kFloat64))));
  EXPECT_FALSE(IsLowPrecision(Tensor()));
  EXPECT_EQ(ToFloat(tensor({1.5}).to(kBFloat16)).dtype(), kFloat32);
  EXPECT_EQ(ToFloat(zeros({2}, TensorOptions(kFloat64))).dtype(), kFloat64);
  EXPECT_FALSE(ToFloat(Tensor()).defined());
  EXPECT_FALSE(ToDtype(Tensor(), kFloat16).defined());
  EXPECT_EQ(ToDtype(tensor({0.25}), kFloat16).dtype(), kFloat16);
}

TEST(LowPrecisionTest, TheCpuKernelsComputeThemInFloat32) {
  // Note [16-bit floats on the CPU]: the float32 kernel on the widened input,
  // its output rounded once.
  Tensor x = randn({1, 2, 4, 4}).to(kFloat16);
  Tensor pooled = functional::max_pool2d(x, MaxPool2dOptions{{2, 2}});
  EXPECT_EQ(pooled.dtype(), kFloat16);
  EXPECT_TRUE(pooled.equal(
      functional::max_pool2d(x.to(kFloat32), MaxPool2dOptions{{2, 2}}).to(kFloat16)));
  Tensor w = randn({3, 2}).to(kBFloat16);
  Tensor rows = functional::embedding(tensor({0, 1}), w);
  EXPECT_EQ(rows.dtype(), kBFloat16);
  EXPECT_TRUE(rows.equal(w.slice(0, 0, 2)));
  try {
    functional::max_pool2d(ones({1, 2, 4, 4}, kInt64), MaxPool2dOptions{{2, 2}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("max_pool2d: expected a float32, float64, float16 or "
                                    "bfloat16 tensor, but got int64"));
  }
}

TEST(LowPrecisionTest, PoolingMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (auto [dtype, rtol] : Dtypes()) {
    ExpectLowPrecisionMatchesCpu(
        [](const std::vector<Tensor>& in) {
          return functional::max_pool2d(in[0], MaxPool2dOptions{{3, 3}, {2, 2}, {1, 1}});
        },
        {randn({2, 3, 9, 8})}, {true}, dtype, rtol, "max_pool2d 3x3 stride 2 padding 1");
    ExpectLowPrecisionMatchesCpu(
        [](const std::vector<Tensor>& in) {
          return functional::avg_pool2d(in[0], AvgPool2dOptions{{3, 2}, {2, 3}, {1, 1}, true});
        },
        {randn({2, 3, 9, 8})}, {true}, dtype, rtol, "avg_pool2d ceil_mode");
    ExpectLowPrecisionMatchesCpu(
        [](const std::vector<Tensor>& in) {
          return functional::adaptive_avg_pool2d(in[0], {1, 1});
        },
        {randn({4, 8, 7, 7})}, {true}, dtype, rtol, "global average (ResNet's head)");
  }
}

TEST(LowPrecisionTest, LayerNormMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  for (auto [dtype, rtol] : Dtypes()) {
    ExpectLowPrecisionMatchesCpu(
        [](const std::vector<Tensor>& in) {
          return functional::layer_norm(in[0], {40}, in[1], in[2], 1e-5);
        },
        {randn({70, 40}) * 3.0 + 1.5, randn({40}), randn({40})}, {true, true, true}, dtype,
        rtol, "layer_norm [70, 40]");
  }
}

TEST(LowPrecisionTest, EmbeddingMatchesTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor indices = tensor({1, 3, 1, 3, 3, 9, 0, 3}).view({2, 4});
  for (auto [dtype, rtol] : Dtypes()) {
    ExpectLowPrecisionMatchesCpu(
        [&](const std::vector<Tensor>& in) {
          return functional::embedding(indices.to(in[0].device()), in[0], /*padding_idx=*/3);
        },
        {randn({10, 6})}, {true}, dtype, rtol, "embedding, repeated rows and padding");
  }
}

TEST(LowPrecisionTest, ClassLossesMatchTheCpu) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor target = tensor(std::vector<int64_t>{0, 4, -100, 3, 1, 2});
  for (auto [dtype, rtol] : Dtypes()) {
    for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
      ExpectLowPrecisionMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::cross_entropy(in[0], target.to(in[0].device()),
                                             {.reduction = r, .label_smoothing = 0.1});
          },
          {randn({6, 5}) * 3.0}, {true}, dtype, rtol, "cross_entropy");
      ExpectLowPrecisionMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::nll_loss(in[0], target.to(in[0].device()), {.reduction = r});
          },
          {randn({6, 5})}, {true}, dtype, rtol, "nll_loss");
    }
  }
}

}  // namespace
}  // namespace ember::nn
