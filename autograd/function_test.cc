// Custom Functions (function.h): forward/backward, the context's saved
// tensors and values, mark_dirty, mark_non_differentiable, needs_input_grad.
#include "autograd/function.h"

#include <vector>

#include "autograd/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct ScaleBy : Function<ScaleBy> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, double k) {
    ctx->saved_data["k"] = k;
    return x * k;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    double k = std::get<double>(ctx->saved_data["k"]);
    return {grads[0] * k, Tensor()};
  }
};

// x * w + b, with an optional (undefined) b.
struct Affine : Function<Affine> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& b) {
    ctx->save_for_backward({x, w});
    Tensor y = x * w;
    return b.defined() ? y + b : y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const Tensor& g = grads[0];
    return {ctx->needs_input_grad(0) ? g * saved[1] : Tensor(),
            ctx->needs_input_grad(1) ? g * saved[0] : Tensor(),
            ctx->needs_input_grad(2) ? g : Tensor()};
  }
};

TEST(FunctionTest, ForwardAndBackward) {
  Tensor x = Make({1, 2, 3}).requires_grad_();
  Tensor y = ScaleBy::apply(x, 2.5);
  EXPECT_THAT(Values(y), ElementsAre(2.5, 5, 7.5));
  EXPECT_TRUE(y.requires_grad());
  EXPECT_THAT(y.grad_fn()->name(), HasSubstr("ScaleByBackward"));
  y.sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(2.5, 2.5, 2.5));
}

// sum_k scale * x * ws[k]: a tensor-list argument, and an object kept alive
// in saved_data.
struct WeightedSum : Function<WeightedSum> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const variable_list& ws,
                        std::shared_ptr<double> scale) {
    ctx->save_for_backward({x});
    ctx->saved_data["scale"] = std::shared_ptr<void>(scale);
    ctx->saved_data["count"] = static_cast<int64_t>(ws.size());
    Tensor y = x * ws[0];
    for (size_t k = 1; k < ws.size(); ++k) y = y + x * ws[k];
    return y * *scale;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double scale =
        *std::static_pointer_cast<double>(std::get<std::shared_ptr<void>>(ctx->saved_data["scale"]));
    const Tensor x = ctx->get_saved_variables()[0];
    const int64_t count = std::get<int64_t>(ctx->saved_data["count"]);
    variable_list out = {Tensor()};  // x: not asked for in the test
    EXPECT_FALSE(ctx->needs_input_grad(0));
    for (int64_t k = 0; k < count; ++k) {
      EXPECT_EQ(ctx->needs_input_grad(1 + k), k != 1) << k;  // flattened positions
      out.push_back(ctx->needs_input_grad(1 + k) ? grads[0] * x * scale : Tensor());
    }
    out.push_back(Tensor());  // the scale
    return out;
  }
};

TEST(FunctionTest, TensorListArgumentsCountOneArgumentPerElement) {
  Tensor x = Make({1, 2});
  Tensor w0 = Make({1, 1}).requires_grad_(), w1 = Make({2, 2}), w2 = Make({3, 3}).requires_grad_();
  Tensor y = WeightedSum::apply(x, variable_list{w0, w1, w2}, std::make_shared<double>(0.5));
  EXPECT_THAT(Values(y), ElementsAre(0.5 * (1 + 2 + 3), 0.5 * 2 * (1 + 2 + 3)));
  y.sum().backward();
  EXPECT_THAT(Values(w0.grad()), ElementsAre(0.5, 1.0));
  EXPECT_FALSE(w1.grad().defined());
  EXPECT_THAT(Values(w2.grad()), ElementsAre(0.5, 1.0));
}

TEST(FunctionTest, NeedsInputGradAndUndefinedArguments) {
  Tensor x = Make({1, 2});
  Tensor w = Make({3, 4}).requires_grad_();
  Tensor y = Affine::apply(x, w, Tensor());
  y.sum().backward();
  EXPECT_THAT(Values(w.grad()), ElementsAre(1, 2));
  EXPECT_FALSE(x.grad().defined());
}

TEST(FunctionTest, NotRecordedWithoutGradOrUnderNoGrad) {
  Tensor x = Make({1, 2}).requires_grad_();
  EXPECT_FALSE(ScaleBy::apply(Make({1, 2}), 2.0).requires_grad());
  NoGradGuard no_grad;
  EXPECT_FALSE(ScaleBy::apply(x, 2.0).requires_grad());
}

TEST(FunctionTest, SavedTensorsAreVersionChecked) {
  Tensor x = Make({1, 2}).requires_grad_();
  Tensor w = Make({3, 4}).requires_grad_() * 1;  // A non-leaf we may modify.
  Tensor y = Affine::apply(x, w, Tensor());
  w.add_(1);
  EXPECT_THAT(ErrorOf([&] { y.sum().backward(); }),
              HasSubstr("one of the variables needed for gradient computation has been "
                        "modified by an inplace operation: [float [2]], which is output 0 of "
                        "MulBackward, is at version 1; expected version 0 instead."));
}

struct DoubleInPlace : Function<DoubleInPlace> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    x.mul_(2);
    ctx->mark_dirty({x});
    return x;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0] * 2}; }
};

TEST(FunctionTest, MarkDirtyRebasesHistory) {
  Tensor leaf = Make({1, 2}).requires_grad_();
  Tensor x = leaf * 1;
  Tensor y = DoubleInPlace::apply(x);
  EXPECT_TRUE(y.is_same(x));
  EXPECT_THAT(Values(x), ElementsAre(2, 4));
  (y * y).sum().backward();
  // y = 2 * leaf: d/dleaf sum(y^2) = 2 * y * 2.
  EXPECT_THAT(Values(leaf.grad()), ElementsAre(8, 16));
}

struct SortLike : Function<SortLike> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x) {
    Tensor idx = arange(x.numel());
    ctx->mark_non_differentiable({idx});
    return {x * 1, idx};
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0]}; }
};

TEST(FunctionTest, MarkNonDifferentiableAndVectorOutputs) {
  Tensor x = Make({1, 2}).requires_grad_();
  variable_list out = SortLike::apply(x);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  out[0].sum().backward();
  EXPECT_THAT(Values(x.grad()), ElementsAre(1, 1));
}

struct WrongCount : Function<WrongCount> {
  static Tensor forward(AutogradContext*, const Tensor& x, const Tensor& y) { return x + y; }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0]}; }
};

TEST(FunctionTest, WrongNumberOfGradientsIsAnError) {
  Tensor x = Make({1}).requires_grad_();
  Tensor y = Make({1}).requires_grad_();
  EXPECT_THAT(ErrorOf([&] { WrongCount::apply(x, y).backward(); }),
              HasSubstr("returned an incorrect number of gradients (expected 2, got 1)"));
}

}  // namespace
}  // namespace ember::autograd
