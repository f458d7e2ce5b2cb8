// Every differentiable op of the tensor core through the gradient checker,
// with contiguous, non-contiguous, broadcast and empty inputs; and the
// checker itself, which must catch a wrong backward.
#include "autograd/gradcheck.h"

#include <functional>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

using ::testing::HasSubstr;

using Fn = std::function<variable_list(const variable_list&)>;

// A float64 leaf of `shape` with values in [-1, 1) (shifted by `shift`).
Tensor Leaf(SizeVector shape, double shift = 0.0) {
  return (rand(shape, kFloat64) * 2 - 1 + shift).requires_grad_();
}
// The same, positive: values in [0.5, 1.5).
Tensor Positive(SizeVector shape) { return (rand(shape, kFloat64) + 0.5).requires_grad_(); }
// A non-contiguous leaf of `shape` (a transposed or strided view of a
// larger tensor).
Tensor Strided(SizeVector shape) {
  if (shape.size() >= 2) {
    SizeVector swapped = shape;
    std::swap(swapped[0], swapped[1]);
    Tensor t = (rand(swapped, kFloat64) * 2 - 1).transpose(0, 1);
    return t.detach().requires_grad_();
  }
  Tensor t = (rand({shape[0] * 2}, kFloat64) * 2 - 1).slice(0, 0, shape[0] * 2, 2);
  return t.detach().requires_grad_();
}

void Check(const std::string& name, const Fn& fn, const variable_list& inputs,
           const GradcheckOptions& options = {}) {
  SCOPED_TRACE(name);
  absl::Status s = gradcheck(fn, inputs, options);
  EXPECT_TRUE(s.ok()) << name << ": " << s;
}

Fn One(std::function<Tensor(const variable_list&)> f) {
  return [f](const variable_list& in) { return variable_list{f(in)}; };
}

TEST(GradcheckTest, UnaryOps) {
  manual_seed(1);
  struct U {
    const char* name;
    UnaryOp op;
    bool positive;
  };
  const U ops[] = {
      {"neg", UnaryOp::kNeg, false},       {"abs", UnaryOp::kAbs, false},
      {"exp", UnaryOp::kExp, false},       {"expm1", UnaryOp::kExpm1, false},
      {"log", UnaryOp::kLog, true},        {"log1p", UnaryOp::kLog1p, true},
      {"log2", UnaryOp::kLog2, true},      {"sqrt", UnaryOp::kSqrt, true},
      {"rsqrt", UnaryOp::kRsqrt, true},    {"sin", UnaryOp::kSin, false},
      {"cos", UnaryOp::kCos, false},       {"tan", UnaryOp::kTan, false},
      {"tanh", UnaryOp::kTanh, false},     {"sigmoid", UnaryOp::kSigmoid, false},
      {"relu", UnaryOp::kRelu, false},     {"gelu", UnaryOp::kGelu, false},
      {"erf", UnaryOp::kErf, false},       {"reciprocal", UnaryOp::kReciprocal, true},
      {"square", UnaryOp::kSquare, false}, {"floor", UnaryOp::kFloor, false},
      {"sign", UnaryOp::kSign, false},
  };
  for (const U& u : ops) {
    Fn f = One([op = u.op](const variable_list& in) { return ops::unary(op, in[0]); });
    Check(u.name, f, {u.positive ? Positive({2, 3}) : Leaf({2, 3})});
    Tensor strided = Strided({3, 2});
    if (u.positive) strided = (strided.detach().abs() + 0.5).requires_grad_();
    Check(std::string(u.name) + " strided", f, {strided});
    Check(std::string(u.name) + " empty", f, {Leaf({0, 3})});
  }
}

TEST(GradcheckTest, BinaryOpsWithBroadcasting) {
  manual_seed(2);
  struct B {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    bool positive_base;
  };
  const B ops[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, false},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return a.add(b, 2.5); }, false},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, false},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, false},
      {"div", [](const Tensor& a, const Tensor& b) { return a / (b.abs() + 0.5); }, false},
      {"pow", [](const Tensor& a, const Tensor& b) { return a.pow(b); }, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.maximum(b); }, false},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.minimum(b); }, false},
  };
  for (const B& b : ops) {
    Fn f = One([g = b.f](const variable_list& in) { return g(in[0], in[1]); });
    Tensor a = b.positive_base ? Positive({2, 3}) : Leaf({2, 3});
    Check(b.name, f, {a, Leaf({2, 3})});
    Check(std::string(b.name) + " broadcast", f, {a, Leaf({3})});
    Check(std::string(b.name) + " broadcast both", f,
          {b.positive_base ? Positive({2, 1}) : Leaf({2, 1}), Leaf({1, 3})});
    Tensor s = Strided({2, 3});
    if (b.positive_base) s = (s.detach().abs() + 0.5).requires_grad_();
    Check(std::string(b.name) + " strided", f, {s, Strided({2, 3})});
    Check(std::string(b.name) + " empty", f, {Leaf({0, 3}), Leaf({3})});
  }
  Check("pow scalar", One([](const variable_list& in) { return in[0].pow(3); }), {Leaf({4})});
  Check("scalar ops", One([](const variable_list& in) { return (2 - in[0]) / 4 * 3 + 1; }),
        {Leaf({4})});
  // Through a float32 step: differences of float32 values need a larger eps.
  Check("float32 step",
        One([](const variable_list& in) { return in[0].to(kFloat32).to(kFloat64) * 2; }),
        {Leaf({3})}, GradcheckOptions{.eps = 1e-2, .atol = 1e-3, .rtol = 1e-3});
}

TEST(GradcheckTest, SelectionAndJoining) {
  manual_seed(3);
  Tensor mask = tensor(std::vector<bool>{true, false, true, true, false, false}).view({2, 3});
  Check("where", One([mask](const variable_list& in) { return where(mask, in[0], in[1]); }),
        {Leaf({2, 3}), Leaf({3})});
  Check("clamp", One([](const variable_list& in) { return in[0].clamp(-0.5, 0.5); }),
        {Leaf({3, 4})});
  Check("clamp min", One([](const variable_list& in) { return in[0].clamp(0.1, std::nullopt); }),
        {Strided({3, 4})});
  Check("masked_fill", One([mask](const variable_list& in) { return in[0].masked_fill(mask, 2); }),
        {Leaf({2, 3})});
  Check("masked_select", One([mask](const variable_list& in) { return in[0].masked_select(mask); }),
        {Leaf({3})});
  Tensor index = tensor(std::vector<int64_t>{2, 0, 2});
  Check("index_select",
        One([index](const variable_list& in) { return in[0].index_select(1, index); }),
        {Strided({2, 3})});
  Check("index_select empty", One([](const variable_list& in) {
          return in[0].index_select(0, tensor(std::vector<int64_t>{}));
        }),
        {Leaf({3, 2})});
  Check("cat", One([](const variable_list& in) {
          return cat({in[0], in[1], in[2]}, 1);
        }),
        {Leaf({2, 1}), Strided({2, 3}), Leaf({2, 0})});
  Check("stack", One([](const variable_list& in) {
          return stack({in[0], in[1]}, 0);
        }),
        {Leaf({3}), Strided({3})});
}

TEST(GradcheckTest, Views) {
  manual_seed(4);
  struct V {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
  };
  const V views[] = {
      {"view",
       [](const Tensor& x) {
         return x.contiguous().view({3, 2}) * 1;
       }},
      {"reshape", [](const Tensor& x) { return x.reshape({6}) * 1; }},
      {"transpose", [](const Tensor& x) { return x.transpose(0, 1) * 1; }},
      {"t", [](const Tensor& x) { return x.t() * 1; }},
      {"permute",
       [](const Tensor& x) {
         return x.unsqueeze(0).permute({2, 0, 1}) * 1;
       }},
      {"slice", [](const Tensor& x) { return x.slice(1, 1, 3) * 1; }},
      {"slice step", [](const Tensor& x) { return x.slice(1, 0, 3, 2) * 1; }},
      {"narrow", [](const Tensor& x) { return x.narrow(0, 1, 1) * 1; }},
      {"select", [](const Tensor& x) { return x.select(1, -1) * 1; }},
      {"expand",
       [](const Tensor& x) {
         return x.unsqueeze(0).expand({4, 2, 3}) * 1;
       }},
      {"squeeze", [](const Tensor& x) { return x.unsqueeze(1).squeeze() * 1; }},
      {"squeeze dim", [](const Tensor& x) { return x.unsqueeze(2).squeeze(2) * 1; }},
      {"flatten", [](const Tensor& x) { return x.flatten() * 1; }},
      {"as_strided",
       [](const Tensor& x) {
         return x.contiguous().as_strided({2, 2}, {1, 2}, 1) * 1;
       }},
      {"as_strided overlapping",
       [](const Tensor& x) {
         return x.contiguous().as_strided({3, 2}, {1, 1}) * 1;
       }},
      {"chunk", [](const Tensor& x) { return x.chunk(2, 1)[1] * 1; }},
      {"unbind", [](const Tensor& x) { return x.unbind(0)[1] * 1; }},
      {"split", [](const Tensor& x) { return x.split(2, 1)[0] * 1; }},
      {"clone", [](const Tensor& x) { return x.clone(); }},
      {"contiguous", [](const Tensor& x) { return x.contiguous() * 1; }},
  };
  for (const V& v : views) {
    Fn f = One([g = v.f](const variable_list& in) { return g(in[0]); });
    Check(v.name, f, {Leaf({2, 3})});
    Check(std::string(v.name) + " strided", f, {Strided({2, 3})});
  }
  Check("view empty", One([](const variable_list& in) {
          return in[0].view({0, 2}) * 1;
        }),
        {Leaf({2, 0})});
}

TEST(GradcheckTest, Reductions) {
  manual_seed(5);
  struct R {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
  };
  const R reductions[] = {
      {"sum", [](const Tensor& x) { return x.sum(); }},
      {"sum dim", [](const Tensor& x) { return x.sum({1}); }},
      {"sum keepdim", [](const Tensor& x) { return x.sum({0}, true); }},
      {"mean", [](const Tensor& x) { return x.mean(); }},
      {"mean dims",
       [](const Tensor& x) {
         return x.mean({0, 1}, true);
       }},
      {"prod", [](const Tensor& x) { return x.prod(); }},
      {"prod dim", [](const Tensor& x) { return x.prod(1); }},
      {"amax", [](const Tensor& x) { return x.amax({1}); }},
      {"amin", [](const Tensor& x) { return x.amin({0}, true); }},
      {"max", [](const Tensor& x) { return x.max(); }},
      {"max dim", [](const Tensor& x) { return x.max(1).values; }},
      {"min dim keepdim", [](const Tensor& x) { return x.min(0, true).values; }},
      {"var", [](const Tensor& x) { return x.var({1}); }},
      {"std", [](const Tensor& x) { return x.std(); }},
      {"norm", [](const Tensor& x) { return x.norm(); }},
      {"norm 1", [](const Tensor& x) { return x.norm(1, {1}); }},
      {"norm 3", [](const Tensor& x) { return x.norm(3); }},
      {"softmax", [](const Tensor& x) { return x.softmax(1); }},
      {"log_softmax", [](const Tensor& x) { return x.log_softmax(0); }},
  };
  for (const R& r : reductions) {
    Fn f = One([g = r.f](const variable_list& in) { return g(in[0]); });
    Check(r.name, f, {Leaf({3, 4})});
    Check(std::string(r.name) + " strided", f, {Strided({3, 4})});
  }
  // prod with zeros: one zero in a slice, and two.
  Tensor z = tensor(std::vector<double>{0.5, 0, 2, 0, 0, 3}).view({2, 3}).requires_grad_();
  Check("prod zeros", One([](const variable_list& in) { return in[0].prod(1); }), {z});
  Check("prod all zeros", One([](const variable_list& in) { return in[0].prod(); }), {z});
  Check("sum empty", One([](const variable_list& in) { return in[0].sum({0}); }), {Leaf({0, 3})});
  Check("softmax empty", One([](const variable_list& in) { return in[0].softmax(1); }),
        {Leaf({0, 3})});
}

TEST(GradcheckTest, LinearAlgebra) {
  manual_seed(6);
  Fn mm = One([](const variable_list& in) { return in[0].mm(in[1]); });
  Check("mm", mm, {Leaf({2, 3}), Leaf({3, 4})});
  Check("mm strided", mm, {Strided({2, 3}), Strided({3, 4})});
  Check("mm empty", mm, {Leaf({2, 0}), Leaf({0, 4})});
  Check("bmm", One([](const variable_list& in) { return in[0].bmm(in[1]); }),
        {Leaf({2, 2, 3}), Leaf({2, 3, 2})});
  Check("addmm", One([](const variable_list& in) { return addmm(in[0], in[1], in[2], 0.5, 2); }),
        {Leaf({3}), Leaf({2, 3}), Strided({3, 3})});
  Check("dot", One([](const variable_list& in) { return in[0].dot(in[1]); }),
        {Leaf({4}), Strided({4})});
  Fn matmul = One([](const variable_list& in) { return in[0].matmul(in[1]); });
  Check("matmul 1d-2d", matmul, {Leaf({3}), Leaf({3, 2})});
  Check("matmul 2d-1d", matmul, {Leaf({2, 3}), Leaf({3})});
  Check("matmul batched broadcast", matmul, {Leaf({2, 2, 3}), Leaf({3, 2})});
  Check("outer", One([](const variable_list& in) { return in[0].outer(in[1]); }),
        {Leaf({2}), Leaf({3})});
}

TEST(GradcheckTest, InPlaceOps) {
  manual_seed(7);
  Check("add_", One([](const variable_list& in) {
          Tensor y = in[0] * 1;
          y.add_(in[1]);
          return y;
        }),
        {Leaf({2, 3}), Leaf({3})});
  Check("mul_ then exp_", One([](const variable_list& in) {
          Tensor y = in[0] * 1;
          y.mul_(in[1]);
          y.exp_();
          return y;
        }),
        {Leaf({2, 3}), Leaf({2, 3})});
  Check("view in place", One([](const variable_list& in) {
          Tensor y = in[0] * 1;
          y.select(0, 1).mul_(in[1]);
          return y;
        }),
        {Leaf({2, 3}), Leaf({3})});
  Check("copy_ into slice", One([](const variable_list& in) {
          Tensor y = in[0] * 1;
          y.slice(1, 0, 2).copy_(in[1]);
          return y;
        }),
        {Leaf({2, 3}), Leaf({2, 2})});
  Check("fill_ and clamp_", One([](const variable_list& in) {
          Tensor y = in[0] * 1;
          y.narrow(0, 0, 1).fill_(0.25);
          y.clamp_(-0.5, 0.5);
          return y;
        }),
        {Leaf({2, 3})});
  Check("relu_ sigmoid_ tanh_", One([](const variable_list& in) {
          Tensor y = in[0] * 1;
          y.relu_();
          y.sigmoid_();
          y.tanh_();
          return y;
        }),
        {Leaf({3, 2})});
}

// A Function whose backward is deliberately wrong: 2x instead of 3x^2.
struct WrongCube : Function<WrongCube> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0] * 2};
  }
};

TEST(GradcheckTest, CatchesAWrongBackward) {
  manual_seed(8);
  absl::Status s =
      gradcheck([](const variable_list& in) { return variable_list{WrongCube::apply(in[0])}; },
                {Leaf({3}, 2.0)});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("Jacobian mismatch for output 0"));
}

void CheckTwice(const std::string& name, const Fn& fn, const variable_list& inputs) {
  SCOPED_TRACE(name);
  absl::Status s = gradgradcheck(fn, inputs);
  EXPECT_TRUE(s.ok()) << name << ": " << s;
}

// The gathers whose backward is a scatter: the scatter is recorded, so their
// second derivatives (and those of ops after them) match finite differences.
TEST(GradgradcheckTest, AsStrided) {
  manual_seed(11);
  CheckTwice("as_strided", One([](const variable_list& in) {
               return in[0].as_strided({3, 2}, {2, 3}, 1).tanh();
             }),
             {Leaf({3, 4})});
  // Overlapping windows: elements read twice get both gradients.
  CheckTwice("as_strided overlapping", One([](const variable_list& in) {
               return in[0].as_strided({3, 3}, {1, 1}, 0) * in[0].as_strided({3, 3}, {2, 1}, 2);
             }),
             {Leaf({9})});
  CheckTwice("as_strided of strided", One([](const variable_list& in) {
               return in[0].as_strided({2, 2}, {1, 2}, 0).sin();
             }),
             {Strided({3, 2})});
}

TEST(GradgradcheckTest, SteppedSlice) {
  manual_seed(12);
  CheckTwice("slice step 2", One([](const variable_list& in) {
               return in[0].slice(1, 1, 5, 2).tanh();
             }),
             {Leaf({3, 5})});
  CheckTwice("slice step 3 of transposed", One([](const variable_list& in) {
               Tensor s = in[0].slice(0, 0, 4, 3);
               return s * s * s;
             }),
             {Strided({4, 3})});
}

TEST(GradgradcheckTest, IndexSelect) {
  manual_seed(13);
  Tensor index = tensor(std::vector<int64_t>{2, 0, 2});
  CheckTwice("index_select dim 0", One([index](const variable_list& in) {
               return in[0].index_select(0, index).tanh();
             }),
             {Leaf({3, 2})});
  CheckTwice("index_select dim 1", One([index](const variable_list& in) {
               Tensor s = in[0].index_select(1, index);
               return s * s;
             }),
             {Strided({2, 3})});
}

TEST(GradgradcheckTest, MaskedSelect) {
  manual_seed(14);
  Tensor mask = tensor({true, false, true, true, false, true}).view({2, 3});
  CheckTwice("masked_select", One([mask](const variable_list& in) {
               return in[0].masked_select(mask).tanh();
             }),
             {Leaf({2, 3})});
  // The mask broadcasts the input: the engine sums the gradient back.
  CheckTwice("masked_select broadcast", One([mask](const variable_list& in) {
               Tensor s = in[0].masked_select(mask);
               return s * s;
             }),
             {Leaf({3})});
}

TEST(GradgradcheckTest, InPlaceOnViews) {
  manual_seed(15);
  // A write through one view of a non-leaf; another view taken before the
  // write sees it through its regenerated history.
  CheckTwice("mul_ on a narrow view", [](const variable_list& in) {
    Tensor y = in[0] * 2;
    Tensor row = y.select(0, 0);
    y.narrow(1, 1, 2).mul_(in[1]);
    return variable_list{y * y, row.tanh()};
  }, {Leaf({2, 3}), Leaf({2, 2})});
  CheckTwice("tanh_ on a stepped slice", One([](const variable_list& in) {
               Tensor y = in[0].sin();
               y.slice(0, 0, 4, 2).tanh_();
               return y * in[0];
             }),
             {Leaf({4, 2})});
}

// First derivative right (2x g), second wrong: the saved x is detached, so
// the recorded backward has no path back to x.
struct DetachedSquare : Function<DetachedSquare> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0].detach() * 2};
  }
};

TEST(GradgradcheckTest, CatchesAWrongSecondDerivative) {
  manual_seed(16);
  Fn fn = [](const variable_list& in) { return variable_list{DetachedSquare::apply(in[0])}; };
  Tensor x = Leaf({3}, 2.0);
  EXPECT_TRUE(gradcheck(fn, {x}).ok());
  absl::Status s = gradgradcheck(fn, {x});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Jacobian mismatch for output 0 element 0 with respect to input 0"));
  // The same function written in recorded ops passes.
  CheckTwice("x * x", One([](const variable_list& in) { return in[0] * in[0]; }), {x});
}

TEST(GradcheckTest, RefusesFloat32AndOverlappingInputs) {
  absl::Status s =
      gradcheck([](const variable_list& in) { return in; }, {ones({2}).requires_grad_()});
  EXPECT_THAT(std::string(s.message()), HasSubstr("need float64 inputs"));
  Tensor expanded = ones({1}, kFloat64).expand({3}).detach().requires_grad_();
  s = gradcheck([](const variable_list& in) { return in; }, {expanded});
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlaps itself"));
}

}  // namespace
}  // namespace ember::autograd
