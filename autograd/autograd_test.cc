// The Tensor autograd methods, grad mode, the engine and the graph.
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AutogradTest, LeafFlagsAndPropagation) {
  Tensor x = Make({1, 2, 3});
  EXPECT_FALSE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  x.requires_grad_();
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  Tensor c = Make({1, 1, 1});
  Tensor y = x * c;
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  Tensor z = c * 2;  // No input requires grad: no graph at all.
  EXPECT_FALSE(z.requires_grad());
  EXPECT_EQ(z.impl()->autograd_meta(), nullptr);
}

TEST(AutogradTest, BackwardAccumulatesIntoLeaves) {
  Tensor x = Make({1, 2, 3}).requires_grad_();
  Tensor y = (x * x).sum();
  y.backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(2, 4, 6));
  Tensor y2 = (x * 3).sum();
  y2.backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(5, 7, 9));
}

TEST(AutogradTest, ScalarChain) {
  Tensor x = ones({1}).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 100; ++i) y = y * 1.0001 + 0.5;
  y.backward();
  EXPECT_NEAR(Values(x.grad())[0], std::pow(1.0001, 100), 1e-4);
}

TEST(AutogradTest, LongChainDoesNotOverflowTheStack) {
  Tensor x = ones({1}).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = y + 1;
  y.backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(1));
  y = Tensor();  // Dropping the graph is iterative too.
}

TEST(AutogradTest, NoGradGuardRecordsNothing) {
  Tensor x = Make({1, 2}).requires_grad_();
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(GradMode::is_enabled());
    Tensor y = x * 2;
    EXPECT_FALSE(y.requires_grad());
    {
      EnableGradGuard enable;
      EXPECT_TRUE((x * 2).requires_grad());
    }
    x.mul_(2);  // Allowed on a leaf under no_grad.
  }
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_THAT(Values(x), ElementsAre(2, 4));
}

TEST(AutogradTest, BroadcastGradientsAreReducedToInputShape) {
  Tensor a = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32).requires_grad_();
  Tensor b = Make({10, 20, 30}, {3}, kFloat32).requires_grad_();
  Tensor s = Make({2}, {1, 1}, kFloat32).requires_grad_();
  ((a + b) * s).sum().backward();
  EXPECT_THAT(Values(a.grad()), ElementsAre(2, 2, 2, 2, 2, 2));
  EXPECT_THAT(Values(b.grad()), ElementsAre(4, 4, 4));
  EXPECT_THAT(Values(s.grad()), ElementsAre(1 + 2 + 3 + 4 + 5 + 6 + 2 * (10 + 20 + 30)));
}

TEST(AutogradTest, GradientDtypeFollowsTheInput) {
  Tensor a = Make({1, 2}, kFloat32).requires_grad_();
  Tensor b = Make({3, 4}, kFloat64).requires_grad_();
  (a * b).sum().backward();
  EXPECT_EQ(a.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat64);
  EXPECT_THAT(Values(a.grad()), ElementsAre(3, 4));
}

TEST(AutogradTest, MatmulGradients) {
  Tensor a = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64).requires_grad_();
  Tensor b = Make({1, 0, 0, 1, 1, 1}, {3, 2}, kFloat64).requires_grad_();
  a.matmul(b).sum().backward();
  // d/da sum(a @ b) = ones(2,2) @ b^T: row sums of b.
  EXPECT_THAT(Values(a.grad()), ElementsAre(1, 1, 2, 1, 1, 2));
  // d/db = a^T @ ones(2,2): column sums of a.
  EXPECT_THAT(Values(b.grad()), ElementsAre(5, 5, 7, 7, 9, 9));
}

TEST(AutogradTest, ViewsAndReductions) {
  Tensor x = Make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64).requires_grad_();
  Tensor y = x.t().slice(0, 1, 3).select(1, 1);  // x[1, 1:3] = {5, 6}
  (y * y).sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(0, 0, 0, 0, 10, 12));
  x.set_grad(Tensor());
  x.mean().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6));
  x.set_grad(Tensor());
  x.amax({1}).sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(0, 0, 1, 0, 0, 1));
}

TEST(AutogradTest, GradWithAllowUnused) {
  Tensor x = Make({2}).requires_grad_();
  Tensor unused = Make({3}).requires_grad_();
  Tensor y = (x * x * x).sum();
  variable_list g = grad({y}, {x, unused}, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
  EXPECT_THAT(Values(g[0]), ElementsAre(12));
  EXPECT_FALSE(g[1].defined());
  EXPECT_FALSE(x.grad().defined());  // grad() leaves .grad alone.
  EXPECT_THAT(ErrorOf([&] { grad({y}, {unused}, {}, true); }),
              HasSubstr("appears to not have been used in the graph"));
}

TEST(AutogradTest, PiecewiseConstantOpsGiveZeroGradients) {
  Tensor x = Make({-1.5, 0.5, 2.5}).requires_grad_();
  variable_list g = grad({(x.sign() + x.floor() + x.round()).sum()}, {x});
  ASSERT_TRUE(g[0].defined());
  EXPECT_THAT(Values(g[0]), ElementsAre(0, 0, 0));
}

TEST(AutogradTest, SecondBackwardWithoutRetainGraphFails) {
  Tensor x = Make({2}).requires_grad_();
  Tensor y = (x * x).sum();
  y.backward();
  EXPECT_THAT(ErrorOf([&] { y.backward(); }),
              HasSubstr("Trying to backward through the graph a second time"));
  Tensor z = (x * x).sum();
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(4 + 4 + 4));
}

TEST(AutogradTest, RootErrors) {
  Tensor x = Make({1, 2});
  EXPECT_THAT(ErrorOf([&] { x.sum().backward(); }),
              HasSubstr("element 0 of tensors does not require grad and does not have a grad_fn"));
  Tensor w = Make({1, 2}).requires_grad_();
  EXPECT_THAT(ErrorOf([&] { (w * 2).backward(); }),
              HasSubstr("grad can be implicitly created only for scalar outputs"));
  EXPECT_THAT(ErrorOf([&] { arange(3).requires_grad_(); }),
              HasSubstr("only Tensors of floating point and complex dtype can require gradients"));
  EXPECT_THAT(ErrorOf([&] { (w * 2).requires_grad_(false); }),
              HasSubstr("you can only change requires_grad flags of leaf variables"));
}

TEST(AutogradTest, DetachSharesDataAndVersionButNotHistory) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y = x * 2;
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.raw_data(), y.raw_data());
  uint32_t v = y.version();
  d.add_(1);
  EXPECT_EQ(y.version(), v + 1);
  Tensor z = x * 3;
  z.detach_();
  EXPECT_FALSE(z.requires_grad());
  EXPECT_TRUE(z.is_leaf());
}

TEST(AutogradTest, RetainGradKeepsNonLeafGradients) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y = x * 3;
  y.retain_grad();
  Tensor z = y * y;
  z.sum().backward();
  EXPECT_THAT(Values(y.grad()), ElementsAre(6, 12));
  EXPECT_THAT(Values(x.grad()), ElementsAre(18, 36));
}

TEST(AutogradTest, ThreadsDifferentiateOneGraphAtOnce) {
  Tensor x = Make({1, 2, 3}, kFloat64).requires_grad_();
  Tensor y = (x * x * x).sum();
  std::vector<std::vector<double>> results(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        results[t] = Values(grad({y}, {x}, {}, /*retain_graph=*/true)[0]);
        Tensor own = Make({2}, kFloat64).requires_grad_();
        (own * own).sum().backward();  // An independent graph on this thread.
        EXPECT_THAT(Values(own.grad()), ElementsAre(4));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const auto& r : results) EXPECT_THAT(r, ElementsAre(3, 12, 27));
  y.backward();  // Every node was released by both runs.
  EXPECT_THAT(Values(x.grad()), ElementsAre(3, 12, 27));
}

TEST(AutogradTest, SetGradChecksShape) {
  Tensor x = Make({1, 2}).requires_grad_();
  x.set_grad(Make({5, 5}));
  EXPECT_THAT(Values(x.grad()), ElementsAre(5, 5));
  EXPECT_THAT(ErrorOf([&] {
                x.set_grad(Make({1, 2, 3}));
              }),
              HasSubstr("assigned grad has data of a different size"));
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
}

TEST(AutogradTest, EveryFactoryTakesRequiresGrad) {
  const TensorOptions rg = TensorOptions().requires_grad(true);
  const TensorOptions rg64 = rg.dtype(kFloat64);
  float blob[3] = {1, 2, 3};
  Tensor like = ones({3}, kFloat64);
  std::vector<std::pair<std::string, Tensor>> made = {
      {"empty", empty({3}, rg)},
      {"zeros", zeros({3}, rg)},
      {"ones", ones({3}, rg64)},
      {"full", full({3}, 2.5, rg)},
      {"arange", arange(0.0, 3.0, 1.0, rg)},
      {"linspace", linspace(0, 1, 3, rg)},
      {"eye", eye(3, std::nullopt, rg)},
      {"rand", rand({3}, rg)},
      {"randn", randn({3}, rg64)},
      {"randint", randint(0, 5, {3}, rg.dtype(kFloat32))},
      {"tensor", tensor({1.0f, 2.0f, 3.0f}, rg)},
      {"tensor(vector)", tensor(std::vector<double>{1, 2, 3}, rg)},
      {"scalar_tensor", scalar_tensor(1.5, rg)},
      {"from_blob", from_blob(blob, {3}, rg)},
      {"empty_like", empty_like(like, rg)},
      {"zeros_like", zeros_like(like, rg)},
      {"ones_like", ones_like(like, rg.dtype(kFloat32))},
      {"full_like", full_like(like, 4, rg)},
      {"rand_like", rand_like(like, rg)},
      {"randn_like", randn_like(like, rg)},
  };
  for (const auto& [name, t] : made) {
    EXPECT_TRUE(t.requires_grad()) << name;
    EXPECT_TRUE(t.is_leaf()) << name;
    EXPECT_EQ(t.version(), 0u) << name;
  }
  EXPECT_EQ(made[2].second.dtype(), kFloat64);   // ones, dtype kept
  EXPECT_EQ(made[14].second.dtype(), kFloat64);  // empty_like: the input's dtype
  EXPECT_EQ(made[16].second.dtype(), kFloat32);  // ones_like: told otherwise
  // Gradients reach a leaf made this way.
  Tensor w = randn({2, 2}, rg);
  (w * 3).sum().backward();
  EXPECT_THAT(Values(w.grad()), ElementsAre(3, 3, 3, 3));
  // *_like never copies the input's requires_grad.
  EXPECT_FALSE(zeros_like(w).requires_grad());
  // Not without a floating dtype, as torch.
  EXPECT_THAT(ErrorOf([&] { zeros({2}, rg.dtype(kInt64)); }),
              HasSubstr("only Tensors of floating point and complex dtype can require gradients "
                        "(got int64)"));
  EXPECT_THAT(ErrorOf([&] { arange(3, rg); }), HasSubstr("(got int64)"));
  EXPECT_THAT(ErrorOf([&] { randint(0, 3, {2}, rg); }), HasSubstr("(got int64)"));
}

TEST(AutogradTest, GradFnNamesTheNodeAndItsNextFunctions) {
  Tensor x = ones({2, 3}).requires_grad_();
  Tensor c = ones({2, 3});
  EXPECT_EQ(x.grad_fn(), nullptr);  // A leaf.
  EXPECT_EQ(c.grad_fn(), nullptr);  // Outside the graph.
  Tensor y = (x * c).sum();
  std::shared_ptr<AutogradNodeInterface> sum = y.grad_fn();
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->name(), "SumBackward");
  auto sum_next = sum->next_functions();
  ASSERT_EQ(sum_next.size(), 1u);
  EXPECT_EQ(sum_next[0].first->name(), "MulBackward");
  EXPECT_EQ(sum_next[0].second, 0u);
  auto mul_next = sum_next[0].first->next_functions();
  ASSERT_EQ(mul_next.size(), 2u);
  EXPECT_EQ(mul_next[0].first->name(), "AccumulateGrad");
  EXPECT_EQ(mul_next[1].first, nullptr);  // c needs no gradient.
  // The same node as the graph holds; the full Node is one cast away.
  EXPECT_EQ(std::static_pointer_cast<Node>(sum)->next_edge(0).function, sum_next[0].first);
  // Through views and a node with several inputs.
  std::vector<Tensor> parts = (x * 2).unbind(0);
  Tensor z = cat({parts[1], parts[0]});
  auto cat_next = z.grad_fn()->next_functions();
  ASSERT_EQ(cat_next.size(), 2u);
  EXPECT_EQ(cat_next[0].first->name(), "SelectBackward");
  EXPECT_EQ(cat_next[0].first->next_functions()[0].first->name(), "MulBackward");
}

}  // namespace
}  // namespace ember::autograd
