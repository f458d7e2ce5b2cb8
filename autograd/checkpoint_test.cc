// Activation checkpointing (checkpoint.h): gradients equal to the run without
// it, bit for bit (dropout included); the function runs twice; activations
// are not kept; the RNG streams; the determinism check; nesting, inputs that
// need no gradient, outputs used twice, retain_graph, grad(), early stop,
// higher-order gradients and the errors.
#include "autograd/checkpoint.h"

#include <any>
#include <memory>
#include <set>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/saved_tensors_hooks.h"
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

// Inverted dropout drawn from the CPU generator, as nn::functional::dropout.
Tensor Dropout(const Tensor& x, double p) {
  return x * (bernoulli_(empty_like(x), 1.0 - p) * (1.0 / (1.0 - p)));
}

// A two-block MLP with dropout; each block is what gets checkpointed.
struct Mlp {
  Tensor w1, b1, w2, b2, w3;
  int block_calls = 0;

  explicit Mlp(uint64_t seed) {
    manual_seed(seed);
    w1 = (randn({16, 32}) * 0.3).requires_grad_();
    b1 = (randn({32}) * 0.1).requires_grad_();
    w2 = (randn({32, 32}) * 0.2).requires_grad_();
    b2 = (randn({32}) * 0.1).requires_grad_();
    w3 = (randn({32, 4}) * 0.2).requires_grad_();
  }
  Tensor Block1(const Tensor& x) {
    ++block_calls;
    return Dropout((x.matmul(w1) + b1).tanh(), 0.25);
  }
  Tensor Block2(const Tensor& h) {
    ++block_calls;
    return Dropout((h.matmul(w2) + b2).relu(), 0.5).matmul(w3).sigmoid();
  }
  Tensor Loss(const Tensor& x, bool use_checkpoint, const CheckpointOptions& options = {}) {
    Tensor h, out;
    if (use_checkpoint) {
      h = checkpoint([this](const Tensor& t) { return Block1(t); }, x, options);
      out = checkpoint([this](const Tensor& t) { return Block2(t); }, h, options);
    } else {
      h = Block1(x);
      out = Block2(h);
    }
    return (out * out).sum();
  }
  std::vector<std::vector<double>> Grads() const {
    return {Values(w1.grad()), Values(b1.grad()), Values(w2.grad()), Values(b2.grad()),
            Values(w3.grad())};
  }
};

// What a forward pass saves for backward outside checkpointed regions, in
// bytes of distinct storages (an outer hook sees checkpoint's inputs, not
// what the checkpointed ops save).
struct SavedBytes {
  std::set<const void*> storages;
  size_t bytes = 0;
  int tensors = 0;
  PackHook pack() {
    return [this](const Tensor& t) -> std::any {
      ++tensors;
      if (storages.insert(t.storage().id()).second) bytes += t.storage().nbytes();
      return t;
    };
  }
  static UnpackHook unpack() {
    return [](const std::any& p) { return std::any_cast<Tensor>(p); };
  }
};

std::vector<double> RngState() { return Values(default_generator().get_state()); }

TEST(CheckpointTest, MlpWithDropoutGivesTheSameGradientsBitForBit) {
  Mlp plain(1), checkpointed(1);
  manual_seed(42);
  Tensor x = randn({8, 16}).requires_grad_();
  Tensor x2 = x.detach().requires_grad_();

  manual_seed(5);
  Tensor loss = plain.Loss(x, false);
  loss.backward();
  const std::vector<double> rng_after_plain = RngState();
  EXPECT_EQ(plain.block_calls, 2);

  manual_seed(5);
  Tensor loss2 = checkpointed.Loss(x2, true);
  EXPECT_EQ(checkpointed.block_calls, 2);  // the forward pass
  loss2.backward();
  EXPECT_EQ(checkpointed.block_calls, 4);  // each block once more, during backward

  EXPECT_EQ(Values(loss2), Values(loss));
  EXPECT_EQ(checkpointed.Grads(), plain.Grads());
  EXPECT_EQ(Values(x2.grad()), Values(x.grad()));
  // The recomputation replayed the forward's draws and put the generator
  // back: the stream outside is where the plain run left it.
  EXPECT_EQ(RngState(), rng_after_plain);
}

TEST(CheckpointTest, WithoutPreservingTheRngStateTheMasksDiffer) {
  Mlp plain(1), checkpointed(1);
  manual_seed(42);
  Tensor x = randn({8, 16});
  manual_seed(5);
  plain.Loss(x, false).backward();
  manual_seed(5);
  checkpointed.Loss(x, true, {.preserve_rng_state = false}).backward();
  EXPECT_NE(checkpointed.Grads(), plain.Grads());  // the recomputation drew new masks
}

TEST(CheckpointTest, ActivationsAreNotKept) {
  Tensor w1 = randn({64, 64}).requires_grad_();
  Tensor w2 = randn({64, 64}).requires_grad_();
  Tensor x = randn({128, 64});
  std::weak_ptr<TensorImpl> hidden;
  auto block = [&](const Tensor& in) {
    Tensor h = in.matmul(w1).tanh();
    hidden = h.impl_ptr();
    return h.matmul(w2).tanh().matmul(w1).tanh();
  };

  SavedBytes plain, checkpointed;
  Tensor y1, y2;
  {
    saved_tensors_hooks count(plain.pack(), SavedBytes::unpack());
    y1 = block(x).sum();
  }
  EXPECT_FALSE(hidden.expired());  // the graph keeps it for MmBackward
  {
    saved_tensors_hooks count(checkpointed.pack(), SavedBytes::unpack());
    y2 = checkpoint(block, x).sum();
  }
  EXPECT_TRUE(hidden.expired());                        // dropped after the forward pass
  EXPECT_EQ(checkpointed.tensors, 1);                   // x alone, saved by checkpoint
  EXPECT_EQ(checkpointed.bytes, size_t{128 * 64 * 4});  // x's bytes
  EXPECT_GE(plain.bytes, 4 * checkpointed.bytes);       // x, 3 hidden layers, w1, w2
  y1.backward();
  const std::vector<double> g = Values(w1.grad());
  w1.set_grad(Tensor());
  y2.backward();
  EXPECT_EQ(Values(w1.grad()), g);
}

TEST(CheckpointTest, TheRecomputationMustMatchTheForward) {
  Tensor x = randn({6, 4}).requires_grad_();
  int calls = 0;
  Tensor y = checkpoint(
      [&](const Tensor& t) {
        ++calls;
        // A function that changes between calls: 6 rows, then 5.
        return t.slice(0, 0, calls == 1 ? 6 : 5).sin().sum();
      },
      x);
  const std::string error = ErrorOf([&] { y.backward(); });
  EXPECT_THAT(error, HasSubstr("checkpoint: the recomputation differed from the forward pass"));
  EXPECT_THAT(error, HasSubstr("saved tensor 0: [float [6, 4]] on cpu in the forward pass, "
                               "[float [5, 4]] on cpu when recomputed"));
  try {
    Tensor z = checkpoint(
        [&](const Tensor& t) {
          ++calls;  // 3 in the forward pass: 5 rows; 4 when recomputed: 6
          return t.slice(0, 0, calls % 2 == 0 ? 6 : 5).sin().sum();
        },
        x);
    z.backward();
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {  // torch's CheckpointError
    EXPECT_THAT(e.what(), HasSubstr("saved tensor 0: [float [5, 4]] on cpu in the forward pass, "
                                    "[float [6, 4]] on cpu when recomputed"));
  }
  // kNone checks only how many tensors were saved: a recomputation in
  // another dtype passes.
  for (DeterminismCheck check : {DeterminismCheck::kDefault, DeterminismCheck::kNone}) {
    calls = 0;
    Tensor z = checkpoint(
        [&](const Tensor& t) {
          ++calls;
          return (calls == 1 ? t : t.to(kFloat64)).sin().sum();
        },
        x, {.determinism_check = check});
    const std::string message = ErrorOf([&] { z.backward(); });
    if (check == DeterminismCheck::kNone) {
      EXPECT_EQ(message, "no error");
    } else {
      EXPECT_THAT(message, HasSubstr("saved tensor 0: [float [6, 4]] on cpu in the forward pass, "
                                     "[double [6, 4]] on cpu when recomputed"));
    }
  }
}

TEST(CheckpointTest, FewerSavedTensorsInTheRecomputationFail) {
  Tensor x = randn({3}).requires_grad_();
  int calls = 0;
  Tensor y = checkpoint(
      [&](const Tensor& t) {
        ++calls;
        Tensor s = t.sin();                                 // saves t
        return calls == 1 ? s.cos().sum() : (s * 2).sum();  // cos saves s; * 2 saves nothing
      },
      x);
  EXPECT_THAT(ErrorOf([&] { y.backward(); }),
              HasSubstr("checkpoint: a different number of tensors was saved during the original "
                        "forward pass and during the recomputation (forward: 2, recomputation: "
                        "1)"));
}

TEST(CheckpointTest, NestedCheckpoints) {
  Mlp plain(3), nested(3);
  manual_seed(9);
  Tensor x = randn({4, 16}).requires_grad_();
  Tensor x2 = x.detach().requires_grad_();
  manual_seed(11);
  plain.Loss(x, false).backward();
  const std::vector<double> rng_after = RngState();

  int outer_calls = 0, inner_calls = 0;
  manual_seed(11);
  Tensor out = checkpoint(
      [&](const Tensor& in) {
        ++outer_calls;
        Tensor h = checkpoint(
            [&](const Tensor& t) {
              ++inner_calls;
              return nested.Block1(t);
            },
            in);
        return nested.Block2(h);
      },
      x2);
  EXPECT_EQ(outer_calls, 1);
  EXPECT_EQ(inner_calls, 1);
  (out * out).sum().backward();
  // The outer function once more (re-running the inner call in it), then the
  // inner one for its own saved tensors: torch's rules for nesting.
  EXPECT_EQ(outer_calls, 2);
  EXPECT_EQ(inner_calls, 3);
  EXPECT_EQ(nested.Grads(), plain.Grads());
  EXPECT_EQ(Values(x2.grad()), Values(x.grad()));
  EXPECT_EQ(RngState(), rng_after);
}

TEST(CheckpointTest, InputsThatDoNotRequireGrad) {
  Mlp plain(4), checkpointed(4);
  Tensor x = randn({5, 16});  // data: no gradient, the weights inside have one
  manual_seed(1);
  plain.Loss(x, false).backward();
  manual_seed(1);
  checkpointed.Loss(x, true).backward();
  EXPECT_EQ(checkpointed.Grads(), plain.Grads());
  EXPECT_FALSE(x.grad().defined());

  // Nothing requires grad: nothing is saved or recomputed.
  int calls = 0;
  Tensor y = checkpoint(
      [&](const Tensor& t) {
        ++calls;
        return t.sin();
      },
      x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(calls, 1);
}

TEST(CheckpointTest, AnOutputUsedTwiceAndSeveralInputsAndOutputs) {
  Tensor a = randn({3, 3}).requires_grad_();
  Tensor b = randn({3}).requires_grad_();
  auto fn = [](const variable_list& in) {
    Tensor h = in[0].matmul(in[0]).tanh();
    // in[2] is undefined: passed through as it is.
    return variable_list{h, (h * in[1]).exp(), in[2]};
  };
  variable_list plain = fn({a, b, Tensor()});
  Tensor loss = (plain[0] * plain[0]).sum() + plain[0].sum() * plain[1].sum();
  variable_list g = grad({loss}, {a, b});

  variable_list outs = checkpoint(fn, {a, b, Tensor()});
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_FALSE(outs[2].defined());
  Tensor loss2 = (outs[0] * outs[0]).sum() + outs[0].sum() * outs[1].sum();
  variable_list g2 = grad({loss2}, {a, b});  // grad() works too (non-reentrant)
  EXPECT_EQ(Values(g2[0]), Values(g[0]));
  EXPECT_EQ(Values(g2[1]), Values(g[1]));
}

TEST(CheckpointTest, EachBackwardRunRecomputesOnce) {
  Tensor w = randn({4, 4}).requires_grad_();
  Tensor x = randn({2, 4});
  int calls = 0;
  Tensor y = checkpoint(
      [&](const Tensor& t) {
        ++calls;
        return t.matmul(w).tanh().matmul(w).sigmoid().sum();
      },
      x);
  y.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(calls, 2);
  y.backward();  // the graph is kept; its saved tensors are recomputed again
  EXPECT_EQ(calls, 3);
  const std::vector<double> twice = Values(w.grad());
  w.set_grad(Tensor());
  Tensor plain = x.matmul(w).tanh().matmul(w).sigmoid().sum();
  plain.backward({}, true);
  plain.backward();
  EXPECT_EQ(Values(w.grad()), twice);
  EXPECT_THAT(ErrorOf([&] { y.backward(); }),
              HasSubstr("Trying to backward through the graph a second time"));
}

TEST(CheckpointTest, EarlyStopEndsTheRecomputationAtTheLastSavedTensor) {
  for (bool early_stop : {true, false}) {
    Tensor x = randn({3}).requires_grad_();
    int before = 0, after = 0;
    Tensor y = checkpoint(
        [&](const Tensor& t) {
          ++before;
          Tensor h = t.tanh();  // the last op that saves a tensor
          ++after;
          return (h * 3 + 1).sum();  // saves nothing
        },
        x, {.early_stop = early_stop});
    y.backward();
    EXPECT_EQ(before, 2) << "early_stop=" << early_stop;
    EXPECT_EQ(after, early_stop ? 1 : 2) << "early_stop=" << early_stop;
    Tensor plain = x.detach().requires_grad_();
    (plain.tanh() * 3 + 1).sum().backward();
    EXPECT_EQ(Values(x.grad()), Values(plain.grad()));
  }
}

TEST(CheckpointTest, EarlyStopFreesWhatTheStoppedRecomputationBuilt) {
  // The recomputation stops inside a custom Function that saves its output
  // (as nn's ReLU does); nothing it built may stay alive.
  static std::vector<std::weak_ptr<TensorImpl>> outputs;
  struct Double : Function<Double> {
    static Tensor forward(AutogradContext* ctx, const Tensor& x) {
      Tensor y = x * 2;
      outputs.push_back(y.impl_ptr());
      ctx->save_for_backward({y});
      return y;
    }
    static variable_list backward(AutogradContext* ctx, variable_list grads) {
      ctx->get_saved_variables();
      return {grads[0] * 2};
    }
  };
  outputs.clear();
  Tensor x = randn({4}).requires_grad_();
  Tensor y = checkpoint([](const Tensor& t) { return Double::apply(t.sin()); }, x);
  y.sum().backward();
  ASSERT_EQ(outputs.size(), 2u);       // the forward pass's, the recomputation's
  EXPECT_FALSE(outputs[0].expired());  // y
  EXPECT_TRUE(outputs[1].expired());
  EXPECT_EQ(Values(x.grad()), Values(x.cos() * 2));
}

TEST(CheckpointTest, SecondDerivativesThroughACheckpoint) {
  Tensor x = Make({0.5, -1, 2}, kFloat64).requires_grad_();
  auto fn = [](const Tensor& t) { return (t * t * t).sin(); };
  variable_list g = grad({fn(x).sum()}, {x}, {}, true, true);
  variable_list gg = grad({g[0].sum()}, {x});
  Tensor y = checkpoint(fn, x);
  variable_list g2 = grad({y.sum()}, {x}, {}, true, true);
  variable_list gg2 = grad({g2[0].sum()}, {x});
  EXPECT_EQ(Values(g2[0]), Values(g[0]));
  EXPECT_EQ(Values(gg2[0]), Values(gg[0]));
}

TEST(CheckpointTest, GradModeOffJustRunsTheFunction) {
  Tensor x = randn({3}).requires_grad_();
  int calls = 0;
  NoGradGuard no_grad;
  Tensor y = checkpoint(
      [&](const Tensor& t) {
        ++calls;
        return t.sin();
      },
      x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

TEST(CheckpointTest, Errors) {
  Tensor x = randn({3}).requires_grad_();
  {
    disable_saved_tensors_hooks disabled("this transform does not support checkpoint");
    EXPECT_EQ(ErrorOf([&] { checkpoint([](const Tensor& t) { return t.sin(); }, x); }),
              "this transform does not support checkpoint");
  }
  struct ReadsTwice : Function<ReadsTwice> {
    static Tensor forward(AutogradContext* ctx, const Tensor& t) {
      ctx->save_for_backward({t});
      return t * 2;
    }
    static variable_list backward(AutogradContext* ctx, variable_list grads) {
      ctx->get_saved_variables();
      ctx->get_saved_variables();
      return {grads[0] * 2};
    }
  };
  Tensor y = checkpoint([](const Tensor& t) { return ReadsTwice::apply(t); }, x);
  EXPECT_THAT(ErrorOf([&] { y.sum().backward(); }),
              HasSubstr("checkpoint: a tensor saved inside the checkpointed function was unpacked "
                        "a second time in one backward pass"));
  EXPECT_THAT(ErrorOf([&] { checkpoint(std::function<Tensor(const Tensor&)>(), x); }),
              HasSubstr("checkpoint: the function is empty"));
}

TEST(CheckpointTest, InPlaceChangesToCheckpointInputsAreCaught) {
  Tensor w = randn({3}).requires_grad_();
  Tensor x = randn({3});
  Tensor y = checkpoint([&](const Tensor& t) { return (t * w).sum(); }, x);
  x.add_(1);  // the recomputation would see another x
  EXPECT_THAT(
      ErrorOf([&] { y.backward(); }),
      HasSubstr("one of the variables needed for gradient computation has been modified "
                "by an inplace operation: [float [3]] is at version 1; expected version 0"));
}

}  // namespace
}  // namespace ember::autograd
