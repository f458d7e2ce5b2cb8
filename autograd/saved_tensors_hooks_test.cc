// Saved-tensor hooks (saved_tensors_hooks.h): when pack and unpack run and
// with which tensors, nesting, the in-place check under hooks, release,
// disable_saved_tensors_hooks, save_on_cpu, higher-order gradients and the
// hooks state a backward carries onto the engine's threads.
#include "autograd/saved_tensors_hooks.h"

#include <any>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
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

// Hooks that record what they see: pack keeps a copy (so the saved tensor
// really comes from the hook) and remembers its argument.
struct Recorder {
  std::vector<Tensor> packed_args;
  int unpacks = 0;

  PackHook pack() {
    return [this](const Tensor& t) -> std::any {
      packed_args.push_back(t);
      return t.clone();
    };
  }
  UnpackHook unpack() {
    return [this](const std::any& p) {
      ++unpacks;
      return std::any_cast<Tensor>(p);
    };
  }
};

TEST(SavedTensorsHooksTest, PackRunsWhenSavedUnpackOncePerAccess) {
  Tensor a = Make({1, 2, 3}).requires_grad_();
  Tensor b = Make({4, 5, 6}).requires_grad_();
  Recorder r;
  Tensor y;
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());
    y = a * b;                            // MulBackward saves b (for a's gradient) and a (for b's)
    ASSERT_EQ(r.packed_args.size(), 2u);  // at save time, not later
    EXPECT_TRUE(r.packed_args[0].is_same(b));  // an op's inputs are handed over as they are
    EXPECT_TRUE(r.packed_args[1].is_same(a));
  }
  EXPECT_EQ(r.unpacks, 0);
  y.sum().backward({}, /*retain_graph=*/true);
  EXPECT_EQ(r.unpacks, 2);
  EXPECT_THAT(Values(a.grad()), ElementsAre(4, 5, 6));
  EXPECT_THAT(Values(b.grad()), ElementsAre(1, 2, 3));
  y.sum().backward();  // each access unpacks again
  EXPECT_EQ(r.unpacks, 4);
  EXPECT_EQ(r.packed_args.size(), 2u);
  EXPECT_THAT(Values(a.grad()), ElementsAre(8, 10, 12));
}

TEST(SavedTensorsHooksTest, OutputsAreHandedOverDetached) {
  Tensor x = Make({0, 1}).requires_grad_();
  Recorder r;
  Tensor y;
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());
    y = x.exp();  // ExpBackward saves its own output
  }
  ASSERT_EQ(r.packed_args.size(), 1u);
  const Tensor& arg = r.packed_args[0];
  EXPECT_FALSE(arg.is_same(y));
  EXPECT_FALSE(arg.requires_grad());  // no history: keeping it makes no cycle
  EXPECT_EQ(arg.raw_data(), y.raw_data());
  y.sum().backward();
  EXPECT_EQ(r.unpacks, 1);
  EXPECT_EQ(Values(x.grad()), Values(y));
}

TEST(SavedTensorsHooksTest, CustomFunctionsSavedTensorsGoThroughTheHooks) {
  struct Mul : Function<Mul> {
    static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b) {
      ctx->save_for_backward({a, b});
      return a * b;
    }
    static variable_list backward(AutogradContext* ctx, variable_list grads) {
      variable_list first = ctx->get_saved_variables();
      variable_list again = ctx->get_saved_variables();  // a second access
      return {grads[0] * first[1], grads[0] * again[0]};
    }
  };
  Tensor a = Make({2, 3}).requires_grad_();
  Tensor b = Make({5, 7}).requires_grad_();
  Recorder r;
  Tensor y;
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());
    y = Mul::apply(a, b);
  }
  ASSERT_EQ(r.packed_args.size(), 2u);  // forward's a * b ran with grad mode off
  EXPECT_TRUE(r.packed_args[0].is_same(a));
  EXPECT_TRUE(r.packed_args[1].is_same(b));
  y.sum().backward();
  EXPECT_EQ(r.unpacks, 4);
  EXPECT_THAT(Values(a.grad()), ElementsAre(5, 7));
  EXPECT_THAT(Values(b.grad()), ElementsAre(2, 3));
}

TEST(SavedTensorsHooksTest, PackRunsWithGradModeOff) {
  Tensor x = Make({1, 2}).requires_grad_();
  bool grad_mode_in_pack = true;
  saved_tensors_hooks hooks(
      [&](const Tensor& t) -> std::any {
        grad_mode_in_pack = GradMode::is_enabled();
        return t;
      },
      [](const std::any& p) { return std::any_cast<Tensor>(p); });
  Tensor y = x.sin();
  EXPECT_FALSE(grad_mode_in_pack);
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_TRUE(y.requires_grad());
}

TEST(SavedTensorsHooksTest, InnermostHooksWinAndScopesRestore) {
  Tensor x = Make({1, 2}).requires_grad_();
  Recorder outer, inner;
  Tensor y1, y2, y3, y4;
  {
    saved_tensors_hooks o(outer.pack(), outer.unpack());
    y1 = x.sin();
    {
      saved_tensors_hooks i(inner.pack(), inner.unpack());
      y2 = x.cos();
    }
    y3 = x.log();
  }
  y4 = x.square();  // outside every scope: saved as it is
  EXPECT_EQ(outer.packed_args.size(), 2u);
  EXPECT_EQ(inner.packed_args.size(), 1u);
  // Each saved tensor keeps the pair it was saved under, whatever is active
  // when backward runs.
  Recorder during;
  {
    saved_tensors_hooks d(during.pack(), during.unpack());
    (y1 + y2 + y3 + y4).sum().backward();
  }
  EXPECT_EQ(outer.unpacks, 2);
  EXPECT_EQ(inner.unpacks, 1);
  EXPECT_EQ(during.unpacks, 0);
  EXPECT_TRUE(during.packed_args.empty());  // plain backward saves nothing
}

TEST(SavedTensorsHooksTest, TheStackIsPerThread) {
  Tensor x = Make({1, 2}).requires_grad_();
  Recorder r;
  saved_tensors_hooks hooks(r.pack(), r.unpack());
  Tensor other;
  std::thread([&] { other = x.sin(); }).join();
  EXPECT_TRUE(r.packed_args.empty());
  Tensor mine = x.sin();
  EXPECT_EQ(r.packed_args.size(), 1u);
}

TEST(SavedTensorsHooksTest, InPlaceModificationAfterSavingStillFails) {
  Tensor x = Make({1, 2, 3}).requires_grad_();
  Recorder r;
  Tensor a = x * 2;
  Tensor y;
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());
    y = a.sin();  // saves a; the hook keeps a copy, but a is then changed
  }
  a.add_(1);
  EXPECT_THAT(ErrorOf([&] { y.sum().backward(); }),
              HasSubstr("one of the variables needed for gradient computation has been modified "
                        "by an inplace operation: [float [3]], which is output 0 of "
                        "MulBackward, is at version 1; expected version 0 instead"));
  EXPECT_EQ(r.unpacks, 0);  // refused before the unpack hook runs
}

TEST(SavedTensorsHooksTest, APackHookThatModifiesItsInputFails) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor a = x * 1.0;
  saved_tensors_hooks hooks(
      [](const Tensor& t) -> std::any {
        t.mul_(2);
        return t;
      },
      [](const std::any& p) { return std::any_cast<Tensor>(p); });
  EXPECT_THAT(ErrorOf([&] { a.sin(); }),
              HasSubstr("A saved tensor pack hook is modifying its input in place"));
}

TEST(SavedTensorsHooksTest, APackHookThatThrowsLeavesNoGraphBehind) {
  // A custom Function saving its own output: had the context kept the
  // output when packing failed, node and output would hold each other.
  static std::weak_ptr<TensorImpl> output;
  struct Double : Function<Double> {
    static Tensor forward(AutogradContext* ctx, const Tensor& x) {
      Tensor y = x * 2;
      output = y.impl_ptr();
      ctx->save_for_backward({y});
      return y;
    }
    static variable_list backward(AutogradContext* ctx, variable_list grads) {
      return {grads[0] * 2};
    }
  };
  Tensor x = Make({1, 2}).requires_grad_();
  saved_tensors_hooks hooks([](const Tensor&) -> std::any { EMBER_FAIL("cannot pack"); },
                            [](const std::any& p) { return std::any_cast<Tensor>(p); });
  EXPECT_EQ(ErrorOf([&] { Double::apply(x); }), "cannot pack");
  EXPECT_TRUE(output.expired());
}

TEST(SavedTensorsHooksTest, AnUnpackHookMustReturnATensor) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor y;
  {
    saved_tensors_hooks hooks([](const Tensor& t) -> std::any { return 0; },
                              [](const std::any&) { return Tensor(); });
    y = x.sin();
  }
  EXPECT_THAT(ErrorOf([&] { y.sum().backward(); }),
              HasSubstr("the unpack hook of saved_tensors_hooks returned an undefined tensor for "
                        "a saved [float [2]]"));
  EXPECT_THAT(ErrorOf([] { saved_tensors_hooks hooks(nullptr, nullptr); }),
              HasSubstr("both a pack hook and an unpack hook are needed"));
}

TEST(SavedTensorsHooksTest, FreeingTheGraphDropsThePackedValues) {
  Tensor x = Make({1, 2}).requires_grad_();
  auto alive = std::make_shared<int>(0);
  std::weak_ptr<int> watch = alive;
  Tensor y;
  {
    saved_tensors_hooks hooks(
        [&alive](const Tensor& t) -> std::any { return std::make_pair(alive, t.clone()); },
        [](const std::any& p) {
          return std::any_cast<std::pair<std::shared_ptr<int>, Tensor>>(p).second;
        });
    y = x.sin().sum();
  }
  alive.reset();
  EXPECT_FALSE(watch.expired());  // the graph holds the packed value
  y.backward();
  EXPECT_TRUE(watch.expired());
  EXPECT_THAT(ErrorOf([&] { y.backward(); }),
              HasSubstr("Trying to backward through the graph a second time"));
}

TEST(SavedTensorsHooksTest, DisableSavedTensorsHooks) {
  Tensor x = Make({1, 2}).requires_grad_();
  Recorder r;
  {
    disable_saved_tensors_hooks disabled("no saved-tensor hooks inside this transform");
    EXPECT_EQ(ErrorOf([&] { saved_tensors_hooks hooks(r.pack(), r.unpack()); }),
              "no saved-tensor hooks inside this transform");
    {
      disable_saved_tensors_hooks again("inner message");
      EXPECT_EQ(ErrorOf([&] { save_on_cpu offload; }), "inner message");
    }
    EXPECT_EQ(ErrorOf([&] { saved_tensors_hooks hooks(r.pack(), r.unpack()); }),
              "no saved-tensor hooks inside this transform");
    Tensor y = x.sin();  // saved as it is
    y.sum().backward();
  }
  EXPECT_EQ(Values(x.grad()), Values(x.cos()));
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());  // allowed again
    EXPECT_EQ(ErrorOf([] { disable_saved_tensors_hooks disabled("not while hooks are active"); }),
              "not while hooks are active");
    Tensor y = x.sin();  // and the failed disable left the hooks in place
    EXPECT_EQ(r.packed_args.size(), 1u);
  }
  EXPECT_TRUE(r.packed_args.size() == 1u && r.unpacks == 0);
}

// A small MLP's loss: each op saves something (matmul, tanh, sigmoid, mul,
// log).
Tensor MlpLoss(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  Tensor h = x.matmul(w1).tanh();
  Tensor o = h.matmul(w2).sigmoid();
  return (o * o + 1).log().sum();
}

struct Params {
  Tensor x = randn({4, 6}, kFloat64);
  Tensor w1 = randn({6, 5}, kFloat64).requires_grad_();
  Tensor w2 = randn({5, 3}, kFloat64).requires_grad_();
};

TEST(SavedTensorsHooksTest, SaveOnCpuGivesTheSameGradients) {
  manual_seed(7);
  Params p;
  MlpLoss(p.x, p.w1, p.w2).backward();
  const std::vector<double> g1 = Values(p.w1.grad()), g2 = Values(p.w2.grad());
  for (bool pin : {false, true}) {
    p.w1.set_grad(Tensor());
    p.w2.set_grad(Tensor());
    Tensor loss;
    {
      save_on_cpu offload(/*pin_memory=*/pin);  // pinned memory needs a device: plain without
      loss = MlpLoss(p.x, p.w1, p.w2);
    }
    loss.backward();
    EXPECT_EQ(Values(p.w1.grad()), g1) << "pin_memory=" << pin;
    EXPECT_EQ(Values(p.w2.grad()), g2) << "pin_memory=" << pin;
  }
}

TEST(SavedTensorsHooksTest, HigherOrderGradientsThroughHookedTensors) {
  Tensor x = Make({1, 2, -3}, kFloat64).requires_grad_();
  Recorder r;
  Tensor y;
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());
    y = (x * x * x).sum();  // saves x (a leaf) and x * x (an output of another node)
  }
  variable_list g = grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_THAT(Values(g[0]), ElementsAre(3, 12, 27));
  variable_list gg = grad({g[0].sum()}, {x});
  EXPECT_THAT(Values(gg[0]), ElementsAre(6, 12, -18));  // 6 x: the unpacked copies kept their place
  Tensor again = (x * x * x).sum();
  EXPECT_THAT(Values(grad({grad({again}, {x}, {}, true, true)[0].sum()}, {x})[0]),
              ElementsAre(6, 12, -18));
}

TEST(SavedTensorsHooksTest, ARecordedBackwardSavesThroughTheCallersHooksOnEveryThread) {
  // With create_graph the backward formulas record and save tensors; they go
  // through the hooks active where backward was called, also when the nodes
  // run on a worker thread (the *_on_worker build of this test).
  Tensor x = Make({1, 2}, kFloat64).requires_grad_();
  Tensor y = (x.sin() * x).sum();
  Recorder r;
  variable_list g;
  {
    saved_tensors_hooks hooks(r.pack(), r.unpack());
    g = grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  }
  EXPECT_GE(r.packed_args.size(), 2u);
  variable_list gg = grad({g[0].sum()}, {x});
  EXPECT_GE(r.unpacks, 2);
  const double x0 = 1, x1 = 2;  // d2/dx2 of x sin x = 2 cos x - x sin x
  EXPECT_NEAR(Values(gg[0])[0], 2 * std::cos(x0) - x0 * std::sin(x0), 1e-12);
  EXPECT_NEAR(Values(gg[0])[1], 2 * std::cos(x1) - x1 * std::sin(x1), 1e-12);
}

}  // namespace
}  // namespace ember::autograd
