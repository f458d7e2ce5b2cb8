// Hooks (tensor hooks, node pre/post hooks, end-of-backward callbacks),
// anomaly mode and higher-order gradients.
#include <cmath>
#include <vector>

#include "autograd/anomaly_mode.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/variable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HooksTest, TensorHookReplacesTheGradient) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y = x * 3;
  std::vector<double> seen;
  RegisterHook(y, [&](const Tensor& g) {
    seen = Values(g);
    return g * 10;
  });
  y.sum().backward();
  EXPECT_THAT(seen, ElementsAre(1, 1));
  EXPECT_THAT(Values(x.grad()), ElementsAre(30, 30));
}

TEST(HooksTest, LeafHookRunsBeforeAccumulation) {
  Tensor x = Make({1, 2}).requires_grad_();
  int calls = 0;
  RegisterHook(x, [&](const Tensor& g) {
    ++calls;
    return g.neg();
  });
  (x * 2).sum().backward();
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(Values(x.grad()), ElementsAre(-2, -2));
  EXPECT_THAT(ErrorOf([] { RegisterHook(Make({1}), [](const Tensor& g) { return g; }); }),
              HasSubstr("cannot register a hook on a tensor that doesn't require gradient"));
}

TEST(HooksTest, NodePreAndPostHooks) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y = x * 2;
  std::shared_ptr<Node> fn = std::static_pointer_cast<Node>(y.grad_fn());
  std::vector<double> pre, post_in, post_out;
  fn->register_pre_hook([&](const variable_list& grads) {
    pre = Values(grads[0]);
    return variable_list{grads[0] * 2};
  });
  fn->register_post_hook([&](const variable_list& grad_inputs, const variable_list& grad_outputs) {
    post_in = Values(grad_inputs[0]);
    post_out = Values(grad_outputs[0]);
    return variable_list{};
  });
  y.sum().backward();
  EXPECT_THAT(pre, ElementsAre(1, 1));
  EXPECT_THAT(post_out, ElementsAre(2, 2));
  EXPECT_THAT(post_in, ElementsAre(4, 4));
  EXPECT_THAT(Values(x.grad()), ElementsAre(4, 4));
}

TEST(HooksTest, CallbacksRunWhenBackwardFinishes) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y = x * 2;
  std::vector<std::string> order;
  RegisterHook(y, [&](const Tensor& g) {
    order.push_back("hook");
    queue_callback([&] {
      order.push_back("callback");
      // Gradients are accumulated by the time callbacks run (DDP relies on it).
      EXPECT_TRUE(x.grad().defined());
    });
    return Tensor();
  });
  y.sum().backward();
  EXPECT_THAT(order, ElementsAre("hook", "callback"));
  EXPECT_THAT(ErrorOf([] { queue_callback([] {}); }),
              HasSubstr("Final callbacks can only be installed during backward pass."));
}

TEST(HooksTest, BackwardInsideAHookOverTheSameGraph) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y = x * 2;
  Tensor z = y * 3;
  std::vector<double> inner;
  bool nested = false;
  RegisterHook(y, [&](const Tensor& g) {
    if (nested) return Tensor();  // The nested run reaches this hook too.
    nested = true;
    // y's node belongs to the running backward: this nested run keeps its
    // own bookkeeping (Note [Engine]). Backward runs with grad mode off.
    EnableGradGuard enable_grad;
    inner = Values(grad({(y * y).sum()}, {x}, {}, /*retain_graph=*/true)[0]);
    nested = false;
    return Tensor();
  });
  z.sum().backward(Tensor(), /*retain_graph=*/true);
  EXPECT_THAT(inner, ElementsAre(8, 16));  // d/dx sum((2x)^2) = 8x.
  EXPECT_THAT(Values(x.grad()), ElementsAre(6, 6));
  z.sum().backward();  // The graph is still usable: every node was released.
  EXPECT_THAT(Values(x.grad()), ElementsAre(12, 12));
}

struct Explode : Function<Explode> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 1; }
  static variable_list backward(AutogradContext*, variable_list) {
    EMBER_FAIL("explode: something went wrong");
  }
};

TEST(AnomalyTest, FailingBackwardNamesTheForwardOp) {
  Tensor x = Make({1, 2}).requires_grad_();
  {
    DetectAnomalyGuard detect;
    Tensor d = x - x;
    Tensor z = d / d;  // d/db (a / b) at a = b = 0 is -0 / 0: NaN.
    EXPECT_THAT(ErrorOf([&] { z.sum().backward(); }),
                HasSubstr("Function 'DivBackward' returned nan values in its 1th output."));
    Tensor w = Make({1, 2}).requires_grad_() * 2;
    Tensor e = Explode::apply(w).sum();
    std::string message = ErrorOf([&] { e.backward(); });
    EXPECT_THAT(message, HasSubstr("Error detected in"));
    EXPECT_THAT(message, HasSubstr("ExplodeBackward"));
    EXPECT_THAT(message, HasSubstr("explode: something went wrong"));
    Tensor a = Make({1, 2}).requires_grad_();
    Tensor b = a.exp();
    b.add_(1);
    EXPECT_THAT(ErrorOf([&] { (a * 1).exp().sum().backward(); }), HasSubstr("no error"));
  }
  // Saved tensor modified: the message names the node and, in anomaly mode,
  // the forward op.
  DetectAnomalyGuard detect;
  Tensor a = Make({1, 2}).requires_grad_();
  Tensor b = a * 1;
  Tensor c = b.sigmoid();
  c.mul_(2);
  std::string message = ErrorOf([&] { c.sum().backward(); });
  EXPECT_THAT(message, HasSubstr("Error detected in SigmoidBackward (forward op: sigmoid)"));
  EXPECT_THAT(message, HasSubstr("modified by an inplace operation"));
}

TEST(HigherOrderTest, SecondDerivativeOfCube) {
  Tensor x = Make({2, 3}, kFloat64).requires_grad_();
  Tensor y = (x * x * x).sum();
  variable_list g = grad({y}, {x}, {}, std::nullopt, /*create_graph=*/true);
  EXPECT_THAT(Values(g[0]), ElementsAre(12, 27));
  EXPECT_TRUE(g[0].requires_grad());
  variable_list gg = grad({g[0].sum()}, {x});
  EXPECT_THAT(Values(gg[0]), ElementsAre(12, 18));  // 6x
}

TEST(HigherOrderTest, ThroughSavedOutputsAndMatmul) {
  Tensor x = Make({0.5, -1}, kFloat64).requires_grad_();
  Tensor y = x.tanh().sum();
  variable_list g = grad({y}, {x}, {}, std::nullopt, true);
  variable_list gg = grad({g[0].sum()}, {x});
  for (int i = 0; i < 2; ++i) {
    double v = Values(x)[i], t = std::tanh(v);
    EXPECT_NEAR(Values(gg[0])[i], -2 * t * (1 - t * t), 1e-12);
  }
  Tensor a = Make({1, 2, 3, 4}, {2, 2}, kFloat64).requires_grad_();
  Tensor l = a.mm(a).sum();  // d/da = 1 a^T + a^T 1 (ones matrices).
  variable_list ga = grad({l}, {a}, {}, std::nullopt, true);
  variable_list gga = grad({ga[0].sum()}, {a});
  // sum(d/da) = sum_ij (sum_k a_jk + sum_k a_ki): each element counted 4 times.
  EXPECT_THAT(Values(gga[0]), ElementsAre(4, 4, 4, 4));
}

TEST(HigherOrderTest, BackwardWithCreateGraphAccumulatesDifferentiableGrad) {
  Tensor x = Make({3}, kFloat64).requires_grad_();
  (x * x).sum().backward(Tensor(), false, /*create_graph=*/true);
  EXPECT_TRUE(x.grad().requires_grad());
  variable_list gg = grad({x.grad().sum()}, {x});
  EXPECT_THAT(Values(gg[0]), ElementsAre(2));
  // x.grad()'s graph holds x: reset it to break the cycle (as torch advises).
  x.set_grad(Tensor());
}

}  // namespace
}  // namespace ember::autograd
