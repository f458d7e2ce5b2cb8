// embedding on cuda:0 against the CPU: the lookup, the weight's gradient with
// repeated indices (accumulated, deterministically) and padding_idx (no
// gradient), int32 indices, the out-of-range error, and gradcheck in float64
// through the device. Without a device the GPU cases
// skip, saying why; the registration case runs everywhere.
#include "nn/embedding.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/cuda/layer_testing.h"
#include "nn/embedding_kernels.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using testing::ExpectGradcheckOnDevice;
using testing::ExpectMatchesCpu;
using ::testing::HasSubstr;
using testing::HostValues;
using testing::kGpu;

TEST(EmbeddingCudaTest, BackwardKernelIsRegisteredForCpuAndCuda) {
  EXPECT_TRUE(internal::embedding_backward.has(DeviceType::kCPU));
  EXPECT_TRUE(internal::embedding_backward.has(DeviceType::kCUDA));
}

TEST(EmbeddingCudaTest, MatchesTheCpuWithRepeatedIndicesAndPadding) {
  EMBER_SKIP_WITHOUT_CUDA();
  // Row 3 is looked up four times, row 1 twice.
  Tensor indices = tensor({1, 3, 1, 3, 3, 9, 0, 3}).view({2, 4});
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (std::optional<int64_t> pad :
         {std::optional<int64_t>(), std::optional<int64_t>(3), std::optional<int64_t>(-1)}) {
      Tensor w = randn({10, 6}, TensorOptions(dtype));
      ExpectMatchesCpu(
          [&](const std::vector<Tensor>& in) {
            return functional::embedding(indices.to(in[0].device()), in[0], pad);
          },
          {w}, {true},
          std::string(dtype_name(dtype)) + " padding_idx " +
              (pad ? std::to_string(*pad) : std::string("none")));
    }
  }
}

TEST(EmbeddingCudaTest, RepeatedIndicesAccumulateAndThePaddingRowGetsNothing) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor w = randn({4, 3}, TensorOptions(kFloat64)).to(kGpu).requires_grad_(true);
  Tensor idx = tensor({2, 2, 2, 0, 1}).to(kGpu);
  // Output gradient: row i of the lookup gets i + 1 in every column.
  Tensor seed = arange(1, 6, 1, TensorOptions(kFloat64)).view({5, 1}).expand({5, 3}).contiguous();
  functional::embedding(idx, w, /*padding_idx=*/1).backward(seed.to(kGpu));
  // Row 2: 1 + 2 + 3; row 0: 4; row 1 (padding): nothing; row 3: unused.
  EXPECT_EQ(HostValues(w.grad()), std::vector<double>({4, 4, 4, 0, 0, 0, 6, 6, 6, 0, 0, 0}));
}

TEST(EmbeddingCudaTest, ManyRepeatsOfOneRowSumExactly) {
  EMBER_SKIP_WITHOUT_CUDA();
  // 4096 lookups of row 0 with gradient 1 (exact in float32 in any order).
  Tensor w = zeros({2, 64}).to(kGpu).requires_grad_(true);
  Tensor idx = zeros({4096}, TensorOptions(kInt64)).to(kGpu);
  functional::embedding(idx, w).sum().backward();
  const std::vector<double> g = HostValues(w.grad());
  for (int j = 0; j < 64; ++j) EXPECT_EQ(g[j], 4096.0) << "column " << j;
  for (int j = 64; j < 128; ++j) EXPECT_EQ(g[j], 0.0) << "row 1 column " << j - 64;
}

// The backward adds each row's lookups in a fixed order: the same bits on
// every run, however many repeats, and the CPU's sums within rounding.
TEST(EmbeddingCudaTest, TheWeightGradientIsDeterministic) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor idx = randint(0, 7, {5000});  // about 700 lookups of each of 7 rows
  Tensor seed = randn({5000, 33});
  auto weight_grad = [&](Device device) {
    Tensor w = zeros({9, 33}).to(device).requires_grad_(true);
    functional::embedding(idx.to(device), w, /*padding_idx=*/4).backward(seed.to(device));
    return w.grad();
  };
  const Tensor cpu = weight_grad(kCPU), first = weight_grad(kGpu);
  testing::ExpectClose(first, cpu, 1e-4, "against the CPU");
  EXPECT_EQ(HostValues(weight_grad(kGpu)), HostValues(first));
}

TEST(EmbeddingCudaTest, Int32IndicesAndTheModule) {
  EMBER_SKIP_WITHOUT_CUDA();
  Embedding emb(7, 5);
  Tensor idx = tensor({6, 0, 6}).to(kInt32);
  Tensor expected = emb.forward(idx).detach();
  Tensor y = functional::embedding(idx.to(kGpu), emb.weight().detach().to(kGpu));
  testing::ExpectClose(y, expected, 0, "int32 indices");
}

TEST(EmbeddingCudaTest, AnIndexOutOfRangeIsNamed) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor w = randn({5, 2}).to(kGpu);
  EXPECT_THROW(
      {
        try {
          functional::embedding(tensor({0, 7, 2}).to(kGpu), w);
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("index out of range in self: index 7 is not in [0, 5)"));
          throw;
        }
      },
      Error);
  EXPECT_THROW(functional::embedding(tensor({-1}).to(kGpu), w), Error);
}

TEST(EmbeddingCudaTest, IndicesOnAnotherDeviceAreRefused) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor w = randn({5, 2}).to(kGpu);
  try {
    functional::embedding(tensor({1}), w);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("embedding: expected indices on cuda:0"));
  }
}

// The padding row's lookups still read it, but it gets no gradient by
// definition (as in PyTorch), so with padding_idx they are masked out of the
// output for the finite differences to agree (as nn/layers_test.cc does).
// Row 1 is looked up on both sides of the padding row's lookups.
TEST(EmbeddingCudaTest, GradcheckOnTheDeviceInFloat64) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor idx = tensor({1, 2, 1, 0, 2, 2});
  ExpectGradcheckOnDevice(
      [&](const std::vector<Tensor>& in) { return functional::embedding(idx.to(kGpu), in[0]); },
      {randn({3, 4}, TensorOptions(kFloat64))});
  const Tensor keep = tensor({1.0, 0.0, 1.0, 1.0, 0.0, 0.0}).view({6, 1});  // 0 where idx is 2
  ExpectGradcheckOnDevice(
      [&](const std::vector<Tensor>& in) {
        return functional::embedding(idx.to(kGpu), in[0], /*padding_idx=*/2) * keep.to(kGpu);
      },
      {randn({3, 4}, TensorOptions(kFloat64))});
}

// Without the mask the padding row's Jacobian is 1 numerically and 0 by
// definition: the gradient it gets on the device is exactly zero.
TEST(EmbeddingCudaTest, ThePaddingRowGetsExactlyZeroOnTheDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  Tensor w = randn({3, 4}, TensorOptions(kFloat64)).to(kGpu).requires_grad_(true);
  Tensor idx = tensor({1, 2, 1, 0, 2, 2}).to(kGpu);
  functional::embedding(idx, w, /*padding_idx=*/2).sum().backward();
  EXPECT_EQ(HostValues(w.grad()), std::vector<double>({1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace ember::nn
