// comm.h and the autograd functions built on it (functions.h), on CPU
// replicas: kCPU listed once per replica.
#include "parallel/comm.h"

#include <vector>

#include "autograd/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/functions.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::parallel {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<Device> kThree(3, kCPU);

TEST(CommTest, BroadcastSharesTheFirstMatchingEntryAndCopiesTheRest) {
  Tensor t = arange(6, kFloat32).view({2, 3});
  std::vector<Tensor> copies = comm::broadcast(t, kThree);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_TRUE(copies[0].is_same(t));
  for (int d = 1; d < 3; ++d) {
    EXPECT_NE(copies[d].raw_data(), t.raw_data());
    EXPECT_EQ(Values(copies[d]), Values(t));
  }
  EXPECT_NE(copies[1].raw_data(), copies[2].raw_data());
}

TEST(CommTest, ReduceAddSumsIntoANewTensorAndSkipsMissingInputs) {
  Tensor a = ones({2}), b = full({2}, 2.0f);
  Tensor sum = comm::reduce_add({a, Tensor(), b}, kCPU);
  EXPECT_EQ(Values(sum), (std::vector<double>{3, 3}));
  EXPECT_EQ(Values(a), (std::vector<double>{1, 1}));
  EXPECT_THAT(ErrorOf([&] {
                comm::reduce_add({a, ones({3})}, kCPU);
              }),
              HasSubstr("input 1 has invalid size: got [3], but expected [2]"));
  std::vector<Tensor> sums = comm::reduce_add_coalesced({{a, b}, {b, b}}, kCPU);
  EXPECT_EQ(Values(sums[0]), (std::vector<double>{3, 3}));
  EXPECT_EQ(Values(sums[1]), (std::vector<double>{4, 4}));
}

TEST(CommTest, ScatterSplitsAndGatherJoins) {
  Tensor t = arange(10, kFloat32).view({5, 2});
  std::vector<Tensor> parts = comm::scatter(t, kThree);
  ASSERT_EQ(parts.size(), 3u);  // chunk(3): 2, 2, 1 rows
  EXPECT_EQ(parts[2].size(0), 1);
  EXPECT_EQ(Values(comm::gather(parts, 0, kCPU)), Values(t));
  std::vector<Tensor> sized = comm::scatter(t, kThree, {1, 1, 3});
  EXPECT_EQ(sized[2].size(0), 3);
  // Fewer rows than devices: fewer pieces, as tensor.chunk gives.
  EXPECT_EQ(comm::scatter(ones({2, 2}), kThree).size(), 2u);
  EXPECT_THAT(ErrorOf([&] {
                comm::scatter(t, kThree, {1, 1, 1});
              }),
              HasSubstr("given chunk sizes don't sum up to the tensor's size (sum(chunk_sizes) == "
                        "3, but expected 5)"));
  EXPECT_EQ(comm::gather(comm::scatter(t, kThree, {}, 1), 1, kCPU).sizes(), t.sizes());
}

TEST(FunctionsTest, BroadcastBackwardSumsEveryReplicasGradient) {
  Tensor w = randn({3}, TensorOptions().requires_grad(true));
  Tensor frozen = randn({2});
  std::vector<std::vector<Tensor>> copies = Broadcast::apply(kThree, {w, frozen});
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_FALSE(copies[0][0].is_leaf());
  EXPECT_EQ(copies[0][0].raw_data(), w.raw_data());  // shares storage
  EXPECT_EQ(copies[0][0].grad_fn()->name(), "BroadcastBackward");
  EXPECT_FALSE(copies[1][1].requires_grad());
  // Replica d contributes (d + 1) * copy; replica 2's copy goes unused.
  Tensor loss = copies[0][0].sum() + (copies[1][0] * 2).sum();
  loss.backward();
  EXPECT_EQ(Values(w.grad()), (std::vector<double>{3, 3, 3}));
}

TEST(FunctionsTest, BroadcastGivesSecondDerivatives) {
  Tensor w = full({2}, 3.0f, TensorOptions().requires_grad(true));
  std::vector<std::vector<Tensor>> copies = Broadcast::apply(std::vector<Device>(2, kCPU), {w});
  Tensor loss = (copies[0][0] * copies[0][0]).sum() + (copies[1][0] * copies[1][0]).sum();
  // d loss / dw = 4w (two replicas of w^2); d/dw of sum(4w) = 4.
  Tensor g = autograd::grad({loss}, {w}, {}, std::nullopt, /*create_graph=*/true)[0];
  EXPECT_EQ(Values(g), (std::vector<double>{12, 12}));
  Tensor gg = autograd::grad({g.sum()}, {w})[0];
  EXPECT_EQ(Values(gg), (std::vector<double>{4, 4}));
}

TEST(FunctionsTest, ScatterAndGatherPassGradientsBack) {
  Tensor x = arange(8, kFloat32).view({4, 2});
  x.requires_grad_(true);
  std::vector<Tensor> parts = Scatter::apply(kThree, {}, 0, x);  // 2, 2 rows: two pieces
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].grad_fn()->name(), "ScatterBackward");
  Tensor y = Gather::apply(kCPU, 0, {parts[0] * 2, parts[1] * 3});
  EXPECT_EQ(y.grad_fn()->name(), "GatherBackward");
  y.sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(2, 2, 2, 2, 3, 3, 3, 3));
}

TEST(FunctionsTest, GatherOfScalarsGivesAVectorAndScalarGradients) {
  Tensor a = scalar_tensor(1.0f, TensorOptions().requires_grad(true));
  Tensor b = scalar_tensor(2.0f, TensorOptions().requires_grad(true));
  ::testing::internal::CaptureStderr();
  Tensor v = Gather::apply(kCPU, 0, {a * 3, b * 5});
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("UserWarning: Was asked to gather along dimension 0, but all input "
                        "tensors were scalars; will instead unsqueeze and return a vector."));
  EXPECT_THAT(Values(v), ElementsAre(3, 10));
  v.sum().backward();
  EXPECT_EQ(a.grad().dim(), 0);
  EXPECT_EQ(a.grad().item<float>(), 3);
  EXPECT_EQ(b.grad().item<float>(), 5);
}

}  // namespace
}  // namespace ember::parallel
