// The autograd kernels of the tensor core's ops (tensor/ops.inc): each runs
// the op below autograd (Note [Below autograd]), then, when grad mode is on
// and an input requires grad, records one node whose backward formula is
// written in differentiable tensor ops, so that create_graph gives
// higher-order gradients. Gradients are returned in the op's output shape and
// compute dtype; the engine reduces them to each input (Note [Gradient
// layout]).
//
// Note [Derivative coverage]
// - Recorded here: every view op, copy_/fill_, unary, binary, where, clamp,
//   masked_fill_, masked_select, index_select, cat, reduce, std, norm,
//   max_dim/min_dim, softmax/log_softmax, mm, bmm, addmm, dot, and the
//   in-place forms (through Note [In-place rules]). addmm's backward with a
//   bias row runs the fused gemm_bias_grad_out when not under create_graph.
// - var has no autograd kernel: its composite kernel is written in recorded
//   ops (mean, sub, mul, sum), so it is differentiated through them. The same
//   holds for the Tensor methods composed in tensor.cc (matmul, outer,
//   reshape, flatten, split, stack, ...). std and norm have their own
//   formulas because torch's take a subgradient (0) at a zero std or norm,
//   where the chain through sqrt or pow gives NaN.
// - Comparisons, logical ops, argmax/argmin and the indices of max/min give
//   bool or integer results, which never require grad.
// - The scatters that undo gathers (as_strided, stepped slice, index_select,
//   masked_select, and the regenerated history of views written in place) are
//   recorded too (StridedScatter, RecordedIndexAdd), so every op here is
//   differentiable twice.
#include <cctype>
#include <cmath>
#include <numbers>
#include <optional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "autograd/anomaly_mode.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/record.h"
#include "autograd/scatter.h"
#include "tensor/factories.h"
#include "tensor/ops.h"

namespace ember::autograd {
namespace {

// --- Helpers -----------------------------------------------------------------

Tensor Num(double v) { return WrapScalar(v); }
Tensor ZeroLike() { return WrapScalar(0.0); }

SizeVector ToVector(IntArrayRef a) { return SizeVector(a.begin(), a.end()); }

// Reduced dims as the reduce kernels see them: every dim when `dims` is empty.
SizeVector ReducedDims(const Tensor& self, IntArrayRef dims) {
  if (self.dim() == 0) return {};
  if (dims.empty()) {
    SizeVector all(self.dim());
    for (int64_t d = 0; d < self.dim(); ++d) all[d] = d;
    return all;
  }
  return WrapDims(dims, self.dim(), "reduce");
}

// A gradient of a reduction, given in the output shape, back in the input's
// shape (unsqueezing reduced dims first when they were dropped).
Tensor ExpandReduced(const Tensor& g, IntArrayRef in_sizes, IntArrayRef reduced, bool keepdim) {
  Tensor r = g;
  if (!keepdim) {
    for (int64_t d : reduced) r = r.unsqueeze(d);
  }
  return r.expand(in_sizes);
}

// The result of a reduction with its reduced dims kept (size 1).
Tensor KeepDims(const Tensor& out, IntArrayRef reduced, bool keepdim) {
  Tensor r = out;
  if (!keepdim) {
    for (int64_t d : reduced) r = r.unsqueeze(d);
  }
  return r;
}

bool ShouldRecord(const Tensor& a) { return GradMode::is_enabled() && RequiresGrad(a); }
bool ShouldRecord(const Tensor& a, const Tensor& b) {
  return GradMode::is_enabled() && (RequiresGrad(a) || RequiresGrad(b));
}
bool ShouldRecord(const Tensor& a, const Tensor& b, const Tensor& c) {
  return GradMode::is_enabled() && (RequiresGrad(a) || RequiresGrad(b) || RequiresGrad(c));
}

std::shared_ptr<FormulaNode> Formula(const char* name, FormulaNode::Formula f) {
  return MakeNode<FormulaNode>(name, std::move(f));
}

// A zero tensor of `sizes` whose slice [start, end) along `dim` is `g`,
// built from differentiable ops (cat), so its own backward is recorded.
Tensor PadAlong(const Tensor& g, IntArrayRef sizes, int64_t dim, int64_t start, int64_t end) {
  SizeVector before = ToVector(sizes), after = ToVector(sizes);
  before[dim] = start;
  after[dim] = sizes[dim] - end;
  std::vector<Tensor> parts;
  if (start > 0) parts.push_back(zeros(before, TensorOptions(g.dtype()).device(g.device())));
  parts.push_back(g);
  if (after[dim] > 0) parts.push_back(zeros(after, TensorOptions(g.dtype()).device(g.device())));
  return parts.size() == 1 ? g : cat(parts, dim);
}

// IndexAdd (scatter.h), recorded when grad mode is on and `grad` requires
// grad: it is linear in `grad`, and its adjoint is index_select, whose own
// backward is this function again.
Tensor RecordedIndexAdd(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad) {
  Tensor result = IndexAdd(sizes, dim, index, grad);
  if (!ShouldRecord(grad)) return result;
  auto node =
      Formula("IndexAddBackward", [dim](const variable_list& saved, const variable_list& grads) {
        return variable_list{grads[0].index_select(dim, saved[0])};
      });
  node->add_next_edge(GradientEdge(grad));
  node->Save(index);
  FinishHistory(node, result, "index_add");
  return result;
}

// --- Views -------------------------------------------------------------------

// Records `out = view_op(self)` with `backward(grad)`.
template <typename F>
Tensor RecordView(const Tensor& self, Tensor out, const char* name, const char* op, F backward) {
  if (!ShouldRecord(self)) return out;
  auto node = Formula(name, [backward](const variable_list&, const variable_list& grads) {
    return variable_list{backward(grads[0])};
  });
  node->add_next_edge(GradientEdge(self));
  FinishHistory(node, out, op);
  return out;
}

Tensor ViewAutograd(const Tensor& self, IntArrayRef sizes) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::view(self, sizes);
  }
  SizeVector in = ToVector(self.sizes());
  return RecordView(self, out, "ViewBackward", "view",
                    [in](const Tensor& g) { return g.reshape(in); });
}

Tensor AsStridedAutograd(const Tensor& self, IntArrayRef sizes, IntArrayRef strides,
                         int64_t offset) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::as_strided(self, sizes, strides, offset);
  }
  StridedGeometry in = StridedGeometry::Of(self), view = StridedGeometry::Of(out);
  return RecordView(self, out, "AsStridedBackward", "as_strided",
                    [in, view](const Tensor& g) { return StridedScatter(g, in, view); });
}

Tensor TransposeAutograd(const Tensor& self, int64_t d0, int64_t d1) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::transpose(self, d0, d1);
  }
  return RecordView(self, out, "TransposeBackward", "transpose",
                    [d0, d1](const Tensor& g) { return g.transpose(d0, d1); });
}

Tensor PermuteAutograd(const Tensor& self, IntArrayRef dims) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::permute(self, dims);
  }
  SizeVector inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[WrapDim(dims[i], self.dim(), "permute")] = i;
  return RecordView(self, out, "PermuteBackward", "permute",
                    [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor SliceAutograd(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::slice(self, dim, start, end, step);
  }
  SizeVector in = ToVector(self.sizes());
  int64_t d = WrapDim(dim, self.dim(), "slice");
  if (step == 1) {
    return RecordView(self, out, "SliceBackward", "slice",
                      [=](const Tensor& g) { return PadAlong(g, in, d, start, end); });
  }
  // A stepped slice of a contiguous tensor of self's shape, whatever self's
  // strides: the gradient is scattered there (recorded, so differentiable).
  StridedGeometry whole{in, ContiguousStrides(in), 0};
  StridedGeometry part{ToVector(out.sizes()), whole.strides, start * whole.strides[d]};
  part.strides[d] *= step;
  return RecordView(self, out, "SliceBackward", "slice",
                    [=](const Tensor& g) { return StridedScatter(g, whole, part); });
}

Tensor SelectAutograd(const Tensor& self, int64_t dim, int64_t index) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::select(self, dim, index);
  }
  SizeVector in = ToVector(self.sizes());
  int64_t d = WrapDim(dim, self.dim(), "select");
  int64_t i = index < 0 ? index + in[d] : index;
  return RecordView(self, out, "SelectBackward", "select",
                    [=](const Tensor& g) { return PadAlong(g.unsqueeze(d), in, d, i, i + 1); });
}

Tensor ExpandAutograd(const Tensor& self, IntArrayRef sizes) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::expand(self, sizes);
  }
  SizeVector in = ToVector(self.sizes());
  return RecordView(self, out, "ExpandBackward", "expand",
                    [in](const Tensor& g) { return SumToSize(g, in); });
}

Tensor SqueezeAutograd(const Tensor& self, std::optional<int64_t> dim) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::squeeze(self, dim);
  }
  SizeVector in = ToVector(self.sizes());
  return RecordView(self, out, "SqueezeBackward", "squeeze",
                    [in](const Tensor& g) { return g.reshape(in); });
}

Tensor UnsqueezeAutograd(const Tensor& self, int64_t dim) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::unsqueeze(self, dim);
  }
  SizeVector in = ToVector(self.sizes());
  return RecordView(self, out, "UnsqueezeBackward", "unsqueeze",
                    [in](const Tensor& g) { return g.reshape(in); });
}

// --- In place (Note [In-place rules]) ------------------------------------------

// Runs an in-place op that must be recorded: `out_of_place(snapshot)` computes
// the new value from a recorded copy of the old one (so saved tensors are not
// the ones being overwritten), `in_place()` performs the real op below
// autograd (its checks and dtype rules included), then self's history is
// rebased onto the recorded result.
template <typename OutOfPlace, typename InPlace>
Tensor RecordInPlace(const Tensor& self, OutOfPlace out_of_place, InPlace in_place) {
  CheckInPlace(self);
  Tensor snapshot = self.clone();
  Tensor result = out_of_place(snapshot);
  {
    BelowAutogradGuard below;
    in_place();
  }
  if (RequiresGrad(result)) {
    AutogradMeta* meta = GetMeta(result);
    RebaseHistory(self, Edge(meta->grad_fn_, meta->output_nr_));
  }
  return self;
}

Tensor CopyAutograd(const Tensor& self, const Tensor& src) {
  if (!ShouldRecord(self, src)) {
    BelowAutogradGuard below;
    return ops::copy_(self, src);
  }
  CheckInPlace(self);
  {
    BelowAutogradGuard below;
    ops::copy_(self, src);
  }
  if (!self.is_floating_point()) return self;
  // The old value of self is overwritten: it gets no gradient. src's goes
  // back to src's device (a copy between devices, as torch's CopyBackwards).
  const Device src_device = src.device();
  auto node = Formula("CopyBackwards", [src_device](const variable_list&,
                                                    const variable_list& grads) {
    return variable_list{grads[0].defined() ? grads[0].to(src_device) : grads[0]};
  });
  node->add_next_edge(GradientEdge(src));
  uint32_t nr = node->add_input_metadata(self);
  if (AnomalyMode::is_enabled()) node->set_forward_op("copy_");
  RebaseHistory(self, Edge(node, nr));
  return self;
}

Tensor FillAutograd(const Tensor& self, const Scalar& value) {
  if (!ShouldRecord(self)) {
    BelowAutogradGuard below;
    return ops::fill_(self, value);
  }
  CheckInPlace(self);
  {
    BelowAutogradGuard below;
    ops::fill_(self, value);
  }
  auto node = Formula("FillBackward",
                      [](const variable_list&, const variable_list&) { return variable_list{}; });
  uint32_t nr = node->add_input_metadata(self);
  RebaseHistory(self, Edge(node, nr));
  return self;
}

// --- Unary -------------------------------------------------------------------

Tensor UnaryFormula(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y) {
  switch (op) {
    case UnaryOp::kNeg:
      return g.neg();
    case UnaryOp::kAbs:
      return g * x.sign();
    case UnaryOp::kExp:
      return g * y;
    case UnaryOp::kExpm1:
      return g * (y + 1);
    case UnaryOp::kLog:
      return g / x;
    case UnaryOp::kLog1p:
      return g / (x + 1);
    case UnaryOp::kLog2:
      return g / (x * std::numbers::ln2);
    case UnaryOp::kSqrt:
      return g / (y * 2);
    case UnaryOp::kRsqrt:
      return g * y.pow(3) * -0.5;
    case UnaryOp::kSin:
      return g * x.cos();
    case UnaryOp::kCos:
      return g * x.sin().neg();
    case UnaryOp::kTan:
      return g * (y * y + 1);
    case UnaryOp::kTanh:
      return g * (1 - y * y);
    case UnaryOp::kSigmoid:
      return g * (y * (1 - y));
    case UnaryOp::kRelu:
      // As torch's threshold_backward: zero where the result is <= 0, so a
      // NaN result passes its gradient through.
      return where(y.le(0), ZeroLike(), g);
    case UnaryOp::kGelu: {
      constexpr double kInvSqrt2 = 0.70710678118654752440;
      constexpr double kInvSqrt2Pi = 0.39894228040143267794;
      Tensor cdf = ((x * kInvSqrt2).erf() + 1) * 0.5;
      Tensor pdf = (x * x * -0.5).exp() * kInvSqrt2Pi;
      return g * (cdf + x * pdf);
    }
    case UnaryOp::kErf:
      return g * (x * x).neg().exp() * (2.0 / std::sqrt(std::numbers::pi));
    case UnaryOp::kReciprocal:
      return g * (y * y).neg();
    case UnaryOp::kSquare:
      return g * x * 2;
    case UnaryOp::kSign:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound:
      // Zero almost everywhere; a zero tensor (not "no gradient"), as torch.
      return zeros(g.sizes(), TensorOptions(g.dtype()).device(g.device()));
    case UnaryOp::kLogicalNot:
      break;
  }
  EMBER_INTERNAL_ASSERT(false, "no derivative for ", UnaryOpName(op));
  return Tensor();
}

bool UnarySavesInput(UnaryOp op) {
  switch (op) {
    case UnaryOp::kAbs:
    case UnaryOp::kLog:
    case UnaryOp::kLog1p:
    case UnaryOp::kLog2:
    case UnaryOp::kSin:
    case UnaryOp::kCos:
    case UnaryOp::kGelu:
    case UnaryOp::kErf:
    case UnaryOp::kSquare:
      return true;
    default:
      return false;
  }
}

bool UnarySavesResult(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
    case UnaryOp::kExpm1:
    case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt:
    case UnaryOp::kTan:
    case UnaryOp::kTanh:
    case UnaryOp::kSigmoid:
    case UnaryOp::kRelu:
    case UnaryOp::kReciprocal:
      return true;
    default:
      return false;
  }
}

class UnaryBackward final : public Node {
 public:
  explicit UnaryBackward(UnaryOp op) : op_(op) {}
  std::string name() const override {
    std::string n(UnaryOpName(op_));
    n[0] = static_cast<char>(std::toupper(n[0]));
    return n + "Backward";
  }
  void release_variables() override {
    self_.Release();
    result_.Release();
  }
  SavedVariable self_, result_;

 protected:
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {UnaryFormula(op_, grads[0], self_.Unpack(), result_.Unpack())};
  }

 private:
  UnaryOp op_;
};

Tensor UnaryAutograd(UnaryOp op, const Tensor& self) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::unary(op, self);
  }
  if (op == UnaryOp::kLogicalNot || !ShouldRecord(self)) return out;
  auto node = MakeNode<UnaryBackward>(op);
  node->add_next_edge(GradientEdge(self));
  if (UnarySavesInput(op)) node->self_ = SavedVariable(self, false);
  FinishHistory(node, out, UnaryOpName(op));
  if (UnarySavesResult(op)) node->result_ = SavedVariable(out, true);
  return out;
}

Tensor UnaryInPlaceAutograd(UnaryOp op, const Tensor& self) {
  if (op == UnaryOp::kLogicalNot || !ShouldRecord(self)) {
    BelowAutogradGuard below;
    return ops::unary_(op, self);
  }
  return RecordInPlace(
      self, [&](const Tensor& old) { return ops::unary(op, old); }, [&] { ops::unary_(op, self); });
}

// --- Binary ------------------------------------------------------------------

// add and sub: nothing saved. (Small, as chains of small ops are
// dominated by the size of their graph.)
class AddSubBackward final : public Node {
 public:
  explicit AddSubBackward(bool sub) : sub_(sub) {}
  std::string name() const override { return sub_ ? "SubBackward" : "AddBackward"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor()};
    return {g, sub_ && next_edge(1).is_valid() ? g.neg() : g};
  }

 private:
  bool sub_;
};

// Note [Number operands]
// An op with a plain number operand (t * 0.5, t.pow(1.7), t.add(u, alpha),
// clamp(min, max)) keeps the number as a Scalar for its backward formula, as
// torch's formulas take `Scalar other`, and never does arithmetic on it as a
// tensor: two wrapped numbers promote to the default dtype (float32), which
// would round a double (pow's exponent - 1 would become float32). Where the
// number reaches a tensor op it is applied once, in the gradient's dtype, as
// the forward kernel applied it (a float32 tensor times 0.1 multiplies by
// float(0.1) both ways). Tensor::pow(Scalar) wraps its exponent exactly and
// alpha is wrapped exactly (tensor.cc); mul/div read the number back from
// its wrapped tensor.

// mul or div by a plain number (a wrapped scalar that needs no gradient):
// the number is kept instead of its tensor, as torch's MulBackward1.
class ScaleBackward final : public Node {
 public:
  ScaleBackward(bool div, Scalar number) : div_(div), number_(number) {}
  std::string name() const override { return div_ ? "DivBackward" : "MulBackward"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor()};
    return {div_ ? g.div(number_) : g.mul(number_), Tensor()};
  }

 private:
  bool div_;
  Scalar number_;
};

// pow by a plain number (Note [Number operands]): torch's PowBackward0,
// d/dx x^e = e * x^(e - 1) with e - 1 computed on the Scalar (in double for
// a floating exponent), and a zero gradient for e == 0.
class PowScalarBackward final : public Node {
 public:
  explicit PowScalarBackward(Scalar exponent) : exponent_(exponent) {}
  std::string name() const override { return "PowBackward"; }
  void release_variables() override { self_.Release(); }
  SavedVariable self_;

 protected:
  variable_list apply(variable_list&& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor()};
    if (exponent_.to_double() == 0.0) {
      return {zeros(g.sizes(), TensorOptions(g.dtype()).device(g.device())), Tensor()};
    }
    const Scalar minus_one = exponent_.is_floating_point() ? Scalar(exponent_.to_double() - 1.0)
                                                           : Scalar(exponent_.to_int() - 1);
    return {g * (self_.Unpack().pow(minus_one) * exponent_), Tensor()};
  }

 private:
  Scalar exponent_;
};

class BinaryBackward final : public Node {
 public:
  explicit BinaryBackward(BinaryOp op) : op_(op) {}
  std::string name() const override {
    switch (op_) {
      case BinaryOp::kAdd:
        return "AddBackward";
      case BinaryOp::kSub:
        return "SubBackward";
      case BinaryOp::kMul:
        return "MulBackward";
      case BinaryOp::kDiv:
        return "DivBackward";
      case BinaryOp::kPow:
        return "PowBackward";
      case BinaryOp::kMaximum:
        return "MaximumBackward";
      case BinaryOp::kMinimum:
        return "MinimumBackward";
      default:
        return std::string(BinaryOpName(op_)) + "Backward";
    }
  }
  void release_variables() override {
    self_.Release();
    other_.Release();
    result_.Release();
  }
  SavedVariable self_, other_, result_;

 protected:
  variable_list apply(variable_list&& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor()};
    const bool need_a = next_edge(0).is_valid(), need_b = next_edge(1).is_valid();
    Tensor ga, gb;
    switch (op_) {
      case BinaryOp::kMul:
        if (need_a) ga = g * other_.Unpack();
        if (need_b) gb = g * self_.Unpack();
        return {ga, gb};
      case BinaryOp::kDiv: {
        Tensor b = other_.Unpack();
        if (need_a) ga = g / b;
        if (need_b) gb = (g * self_.Unpack() / (b * b)).neg();
        return {ga, gb};
      }
      case BinaryOp::kPow: {
        Tensor a = self_.Unpack(), b = other_.Unpack();
        // torch's pow_backward_self, in its order of operations.
        if (need_a) ga = where(b.eq(0), ZeroLike(), g * (b * a.pow(b - 1)));
        if (need_b) {
          Tensor y = result_.Unpack();
          // d/db a^b = a^b log a; zero where a == 0 and b >= 0 (torch's rule).
          Tensor mask = a.eq(0).logical_and(b.ge(0));
          gb = where(mask, ZeroLike(), g * y * a.log());
        }
        return {ga, gb};
      }
      case BinaryOp::kMaximum:
      case BinaryOp::kMinimum: {
        Tensor a = self_.Unpack(), b = other_.Unpack();
        Tensor a_wins = op_ == BinaryOp::kMaximum ? a > b : a < b;
        Tensor tie = a == b;
        Tensor half = g * 0.5;
        if (need_a) ga = where(a_wins, g, where(tie, half, ZeroLike()));
        if (need_b) gb = where(a_wins.logical_or(tie), where(tie, half, ZeroLike()), g);
        return {ga, gb};
      }
      default:
        break;
    }
    EMBER_INTERNAL_ASSERT(false, "no derivative for ", BinaryOpName(op_));
    return {};
  }

 private:
  BinaryOp op_;
};

Tensor BinaryAutograd(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::binary(op, a, b);
  }
  if (BinaryOpReturnsBool(op) || !ShouldRecord(a, b)) return out;
  const bool need_a = RequiresGrad(a), need_b = RequiresGrad(b);
  if (op == BinaryOp::kAdd || op == BinaryOp::kSub) {
    auto node = MakeNode<AddSubBackward>(op == BinaryOp::kSub);
    node->add_next_edge(GradientEdge(a));
    node->add_next_edge(GradientEdge(b));
    FinishHistory(node, out, BinaryOpName(op));
    return out;
  }
  const bool b_is_number = !need_b && b.impl()->is_wrapped_number() && b.is_cpu();
  if (b_is_number && (op == BinaryOp::kMul || op == BinaryOp::kDiv)) {
    auto node = MakeNode<ScaleBackward>(op == BinaryOp::kDiv, b.ItemScalar());
    node->add_next_edge(GradientEdge(a));
    node->add_next_edge(Edge());
    FinishHistory(node, out, BinaryOpName(op));
    return out;
  }
  if (b_is_number && op == BinaryOp::kPow) {
    auto node = MakeNode<PowScalarBackward>(b.ItemScalar());
    node->add_next_edge(GradientEdge(a));
    node->add_next_edge(Edge());
    node->self_ = SavedVariable(a, false);
    FinishHistory(node, out, BinaryOpName(op));
    return out;
  }
  auto node = MakeNode<BinaryBackward>(op);
  node->add_next_edge(GradientEdge(a));
  node->add_next_edge(GradientEdge(b));
  switch (op) {
    case BinaryOp::kMul:
      if (need_a) node->other_ = SavedVariable(b, false);
      if (need_b) node->self_ = SavedVariable(a, false);
      break;
    case BinaryOp::kDiv:
      node->other_ = SavedVariable(b, false);
      if (need_b) node->self_ = SavedVariable(a, false);
      break;
    case BinaryOp::kPow:
    case BinaryOp::kMaximum:
    case BinaryOp::kMinimum:
      node->self_ = SavedVariable(a, false);
      node->other_ = SavedVariable(b, false);
      break;
    default:
      break;
  }
  FinishHistory(node, out, BinaryOpName(op));
  if (op == BinaryOp::kPow && need_b) node->result_ = SavedVariable(out, true);
  return out;
}

Tensor BinaryInPlaceAutograd(BinaryOp op, const Tensor& self, const Tensor& other) {
  if (BinaryOpReturnsBool(op) || !ShouldRecord(self, other)) {
    BelowAutogradGuard below;
    return ops::binary_(op, self, other);
  }
  return RecordInPlace(
      self,
      [&](const Tensor& old) {
        // x.mul_(x): the other operand is self too, and must be read as it was.
        const bool aliased = other.is_same(self) || SameView(other, self);
        return ops::binary(op, old, aliased ? old : other);
      },
      [&] { ops::binary_(op, self, other); });
}

// --- where, clamp, masking, indexing, cat ----------------------------------------

Tensor WhereAutograd(const Tensor& condition, const Tensor& self, const Tensor& other) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::where(condition, self, other);
  }
  if (!ShouldRecord(self, other)) return out;
  auto node = Formula("WhereBackward", [](const variable_list& saved, const variable_list& grads) {
    const Tensor& c = saved[0];
    const Tensor& g = grads[0];
    return variable_list{where(c, g, ZeroLike()), where(c, ZeroLike(), g)};
  });
  node->add_next_edge(GradientEdge(self));
  node->add_next_edge(GradientEdge(other));
  node->Save(condition);
  FinishHistory(node, out, "where");
  return out;
}

Tensor ClampMask(const Tensor& x, const std::optional<Scalar>& min,
                 const std::optional<Scalar>& max) {
  Tensor mask;
  if (min) mask = x.ge(*min);
  if (max) mask = mask.defined() ? mask.logical_and(x.le(*max)) : x.le(*max);
  return mask;
}

Tensor ClampAutograd(const Tensor& self, const std::optional<Scalar>& min,
                     const std::optional<Scalar>& max) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::clamp(self, min, max);
  }
  if (!ShouldRecord(self)) return out;
  auto node =
      Formula("ClampBackward", [min, max](const variable_list& saved, const variable_list& grads) {
        return variable_list{where(ClampMask(saved[0], min, max), grads[0], ZeroLike())};
      });
  node->add_next_edge(GradientEdge(self));
  node->Save(self);
  FinishHistory(node, out, "clamp");
  return out;
}

Tensor ClampInPlaceAutograd(const Tensor& self, const std::optional<Scalar>& min,
                            const std::optional<Scalar>& max) {
  if (!ShouldRecord(self)) {
    BelowAutogradGuard below;
    return ops::clamp_(self, min, max);
  }
  return RecordInPlace(
      self, [&](const Tensor& old) { return ops::clamp(old, min, max); },
      [&] { ops::clamp_(self, min, max); });
}

Tensor MaskedFillAutograd(const Tensor& self, const Tensor& mask, const Scalar& value) {
  if (!ShouldRecord(self)) {
    BelowAutogradGuard below;
    return ops::masked_fill_(self, mask, value);
  }
  return RecordInPlace(
      self, [&](const Tensor& old) { return where(mask, WrapScalar(value), old); },
      [&] { ops::masked_fill_(self, mask, value); });
}

Tensor MaskedSelectAutograd(const Tensor& self, const Tensor& mask) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::masked_select(self, mask);
  }
  if (!ShouldRecord(self)) return out;
  SizeVector shape = BroadcastShapes(self.sizes(), mask.sizes(), "masked_select");
  auto node = Formula(
      "MaskedSelectBackward", [shape](const variable_list& saved, const variable_list& grads) {
        Tensor m = saved[0].expand(shape).to(kCPU).contiguous();
        std::vector<int64_t> positions;
        const bool* mp = m.numel() > 0 ? m.data_ptr<bool>() : nullptr;
        for (int64_t i = 0; i < m.numel(); ++i) {
          if (mp[i]) positions.push_back(i);
        }
        Tensor index = tensor(positions);
        return variable_list{RecordedIndexAdd({Numel(shape)}, 0, index, grads[0]).view(shape)};
      });
  node->add_next_edge(GradientEdge(self));
  node->Save(mask);
  FinishHistory(node, out, "masked_select");
  return out;
}

Tensor IndexSelectAutograd(const Tensor& self, int64_t dim, const Tensor& index) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::index_select(self, dim, index);
  }
  if (!ShouldRecord(self)) return out;
  SizeVector in = ToVector(self.sizes());
  auto node = Formula("IndexSelectBackward",
                      [in, dim](const variable_list& saved, const variable_list& grads) {
                        return variable_list{RecordedIndexAdd(in, dim, saved[0], grads[0])};
                      });
  node->add_next_edge(GradientEdge(self));
  node->Save(index);
  FinishHistory(node, out, "index_select");
  return out;
}

Tensor CatAutograd(absl::Span<const Tensor> tensors, int64_t dim) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::cat(tensors, dim);
  }
  bool record = false;
  for (const Tensor& t : tensors) record = record || RequiresGrad(t);
  if (!GradMode::is_enabled() || !record) return out;
  // Legacy [0]-shaped inputs take no part in the result (see ops::cat).
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (start, length); length -1: skipped.
  const int64_t d = out.dim() == 0 ? 0 : WrapDim(dim, out.dim(), "cat");
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (t.dim() == 1 && t.numel() == 0 && out.dim() != 1) {
      ranges.push_back({0, -1});
      continue;
    }
    ranges.push_back({offset, t.sizes()[d]});
    offset += t.sizes()[d];
  }
  auto node = Formula("CatBackward", [ranges, d](const variable_list&, const variable_list& grads) {
    variable_list result;
    for (auto [start, length] : ranges) {
      result.push_back(length < 0 ? Tensor() : grads[0].narrow(d, start, length));
    }
    return result;
  });
  for (const Tensor& t : tensors) node->add_next_edge(GradientEdge(t));
  FinishHistory(node, out, "cat");
  return out;
}

// --- Reductions --------------------------------------------------------------

Tensor ReduceAutograd(ReduceOp op, const Tensor& self, IntArrayRef dims, bool keepdim,
                      std::optional<Dtype> dtype) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::reduce(op, self, dims, keepdim, dtype);
  }
  if (!ShouldRecord(self) || !out.is_floating_point()) return out;
  SizeVector in = ToVector(self.sizes());
  SizeVector reduced = ReducedDims(self, dims);
  std::shared_ptr<FormulaNode> node;
  switch (op) {
    case ReduceOp::kSum:
      node = Formula("SumBackward", [=](const variable_list&, const variable_list& grads) {
        return variable_list{ExpandReduced(grads[0], in, reduced, keepdim)};
      });
      break;
    case ReduceOp::kMean: {
      int64_t n = 1;
      for (int64_t d : reduced) n *= in[d];
      node = Formula("MeanBackward", [=](const variable_list&, const variable_list& grads) {
        return variable_list{ExpandReduced(grads[0], in, reduced, keepdim) /
                             static_cast<double>(n)};
      });
      break;
    }
    case ReduceOp::kProd:
      node = Formula("ProdBackward", [=](const variable_list& saved, const variable_list& grads) {
        const Tensor& x = saved[0];
        Tensor y = KeepDims(saved[1], reduced, keepdim);
        Tensor g = ExpandReduced(grads[0], in, reduced, keepdim);
        // Without zeros in a slice: y / x. With one zero, its derivative is
        // the product of the others; with more, every derivative is zero.
        Tensor is_zero = x.eq(0);
        Tensor zero_count = is_zero.sum(reduced, /*keepdim=*/true);
        Tensor safe_x = where(is_zero, Num(1.0), x);
        Tensor others = safe_x;
        for (int64_t d : reduced) others = others.prod(d, /*keepdim=*/true);
        Tensor deriv = where(zero_count.eq(0), y / safe_x,
                             where(is_zero.logical_and(zero_count.eq(1)), others, Num(0.0)));
        return variable_list{g * deriv};
      });
      break;
    case ReduceOp::kAmax:
    case ReduceOp::kAmin:
      node = Formula(
          op == ReduceOp::kAmax ? "AmaxBackward" : "AminBackward",
          [=](const variable_list& saved, const variable_list& grads) {
            Tensor y = KeepDims(saved[1], reduced, keepdim);
            Tensor mask = (saved[0] == y).to(grads[0].dtype());
            Tensor count = mask.sum(reduced, /*keepdim=*/true);
            return variable_list{ExpandReduced(grads[0], in, reduced, keepdim) * mask / count};
          });
      break;
    default:
      return out;
  }
  node->add_next_edge(GradientEdge(self));
  if (op == ReduceOp::kProd || op == ReduceOp::kAmax || op == ReduceOp::kAmin) node->Save(self);
  FinishHistory(node, out, ReduceOpName(op));
  if (op == ReduceOp::kProd || op == ReduceOp::kAmax || op == ReduceOp::kAmin) {
    node->Save(out, /*is_output=*/true);
  }
  return out;
}

// torch's var_backward: the gradient of var over `reduced` (kept dims), given
// `g` in the kept shape.
Tensor VarFormula(const Tensor& g, const Tensor& x, IntArrayRef reduced, int64_t n,
                  int64_t correction) {
  const double scale = 2.0 / static_cast<double>(n - correction);
  return g * scale * (x - x.mean(reduced, /*keepdim=*/true));
}

// std = sqrt(var). Where a slice has no spread (std == 0), sqrt's derivative
// is infinite and var's is zero; torch takes 0 there, a subgradient, instead
// of the NaN their product gives.
Tensor StdAutograd(const Tensor& self, IntArrayRef dims, int64_t correction, bool keepdim) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::std(self, dims, correction, keepdim);
  }
  if (!ShouldRecord(self)) return out;
  SizeVector reduced = ReducedDims(self, dims);
  int64_t n = 1;
  for (int64_t d : reduced) n *= self.sizes()[d];
  auto node = Formula("StdBackward", [=](const variable_list& saved, const variable_list& grads) {
    Tensor y = KeepDims(saved[1], reduced, keepdim);
    Tensor g = KeepDims(grads[0], reduced, keepdim);
    Tensor g_var = where(y.eq(0), Num(0.0), g / (y * 2));
    return variable_list{VarFormula(g_var, saved[0], reduced, n, correction)};
  });
  node->add_next_edge(GradientEdge(self));
  node->Save(self);
  FinishHistory(node, out, "std");
  node->Save(out, /*is_output=*/true);
  return out;
}

// torch's norm_backward: the p-norm's gradient, taking 0 where the norm (or,
// for p < 1, the element) is zero instead of the NaN or infinity of the
// formula, and splitting the gradient evenly among ties for p = +-inf. p = 0
// (a count) gives no gradient.
Tensor NormFormula(double p, const Tensor& g, const Tensor& x, const Tensor& norm,
                   IntArrayRef reduced) {
  if (p == 0) return Tensor();
  if (p == 1) return x.sign() * g;
  if (p == 2) return g * where(norm.eq(0), Num(0.0), x / norm);
  if (std::isinf(p)) {
    Tensor ax = x.abs();
    Tensor mask = ax.eq(norm).logical_or(ax.ne(ax)).to(g.dtype());
    return x.sign() * ((g / mask.sum(reduced, /*keepdim=*/true)) * mask);
  }
  if (p < 1) {
    Tensor scaled = x.sign() * where(x.eq(0), Num(0.0), x.abs().pow(p - 1));
    return scaled * g * norm.pow(1 - p);
  }
  Tensor scaled = p < 2 ? x.sign() * x.abs().pow(p - 1) : x * x.abs().pow(p - 2);
  return scaled * where(norm.eq(0), Num(0.0), g / norm.pow(p - 1));
}

Tensor NormAutograd(const Tensor& self, const Scalar& p, IntArrayRef dims, bool keepdim) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::norm(self, p, dims, keepdim);
  }
  if (!ShouldRecord(self)) return out;
  SizeVector reduced = ReducedDims(self, dims);
  const double pv = p.to_double();
  auto node = Formula("NormBackward", [=](const variable_list& saved, const variable_list& grads) {
    return variable_list{NormFormula(pv, KeepDims(grads[0], reduced, keepdim), saved[0],
                                     KeepDims(saved[1], reduced, keepdim), reduced)};
  });
  node->add_next_edge(GradientEdge(self));
  node->Save(self);
  FinishHistory(node, out, "norm");
  node->Save(out, /*is_output=*/true);
  return out;
}

MinMaxResult MaxMinDimAutograd(bool is_max, const Tensor& self, int64_t dim, bool keepdim) {
  MinMaxResult out;
  {
    BelowAutogradGuard below;
    out = is_max ? ops::max_dim(self, dim, keepdim) : ops::min_dim(self, dim, keepdim);
  }
  if (!ShouldRecord(self) || !out.values.is_floating_point()) return out;
  SizeVector in = ToVector(self.sizes());
  const int64_t d = self.dim() == 0 ? 0 : WrapDim(dim, self.dim(), is_max ? "max" : "min");
  auto node = Formula(is_max ? "MaxBackward" : "MinBackward", [=](const variable_list& saved,
                                                                  const variable_list& grads) {
    if (in.empty()) return variable_list{grads[0]};
    Tensor idx = keepdim ? saved[0] : saved[0].unsqueeze(d);
    Tensor g = keepdim ? grads[0] : grads[0].unsqueeze(d);
    SizeVector pos_shape(in.size(), 1);
    pos_shape[d] = in[d];
    // On the indices' device: a CPU arange beside CUDA
    // indices would not compare.
    Tensor positions = arange(in[d], TensorOptions(kInt64).device(idx.device())).view(pos_shape);
    return variable_list{where(positions == idx, g, ZeroLike())};
  });
  node->add_next_edge(GradientEdge(self));
  node->Save(out.indices);
  FinishHistory(node, out.values, is_max ? "max" : "min");
  return out;
}

MinMaxResult MaxDimAutograd(const Tensor& self, int64_t dim, bool keepdim) {
  return MaxMinDimAutograd(true, self, dim, keepdim);
}
MinMaxResult MinDimAutograd(const Tensor& self, int64_t dim, bool keepdim) {
  return MaxMinDimAutograd(false, self, dim, keepdim);
}

Tensor SoftmaxAutogradImpl(bool log, const Tensor& self, int64_t dim) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = log ? ops::log_softmax(self, dim) : ops::softmax(self, dim);
  }
  if (!ShouldRecord(self)) return out;
  const int64_t d = self.dim() == 0 ? 0 : WrapDim(dim, self.dim(), "softmax");
  const bool scalar = self.dim() == 0;
  auto node = Formula(log ? "LogSoftmaxBackward" : "SoftmaxBackward",
                      [=](const variable_list& saved, const variable_list& grads) {
                        const Tensor& y = saved[0];
                        const Tensor& g = grads[0];
                        if (scalar) return variable_list{log ? g - y.exp() * g : g * y - g * y};
                        if (log) return variable_list{g - y.exp() * g.sum({d}, /*keepdim=*/true)};
                        return variable_list{y * (g - (g * y).sum({d}, /*keepdim=*/true))};
                      });
  node->add_next_edge(GradientEdge(self));
  FinishHistory(node, out, log ? "log_softmax" : "softmax");
  node->Save(out, /*is_output=*/true);
  return out;
}

Tensor SoftmaxAutograd(const Tensor& self, int64_t dim) {
  return SoftmaxAutogradImpl(false, self, dim);
}
Tensor LogSoftmaxAutograd(const Tensor& self, int64_t dim) {
  return SoftmaxAutogradImpl(true, self, dim);
}

// --- Linear algebra ------------------------------------------------------------

Tensor MmAutograd(const Tensor& self, const Tensor& other) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::mm(self, other);
  }
  if (!ShouldRecord(self, other)) return out;
  auto node = Formula("MmBackward", [](const variable_list& saved, const variable_list& grads) {
    const Tensor& g = grads[0];
    return variable_list{saved[1].defined() ? g.mm(saved[1].t()) : Tensor(),
                         saved[0].defined() ? saved[0].t().mm(g) : Tensor()};
  });
  node->add_next_edge(GradientEdge(self));
  node->add_next_edge(GradientEdge(other));
  node->Save(RequiresGrad(other) ? self : Tensor());
  node->Save(RequiresGrad(self) ? other : Tensor());
  FinishHistory(node, out, "mm");
  return out;
}

Tensor BmmAutograd(const Tensor& self, const Tensor& other) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::bmm(self, other);
  }
  if (!ShouldRecord(self, other)) return out;
  auto node = Formula("BmmBackward", [](const variable_list& saved, const variable_list& grads) {
    const Tensor& g = grads[0];
    return variable_list{saved[1].defined() ? g.bmm(saved[1].transpose(1, 2)) : Tensor(),
                         saved[0].defined() ? saved[0].transpose(1, 2).bmm(g) : Tensor()};
  });
  node->add_next_edge(GradientEdge(self));
  node->add_next_edge(GradientEdge(other));
  node->Save(RequiresGrad(other) ? self : Tensor());
  node->Save(RequiresGrad(self) ? other : Tensor());
  FinishHistory(node, out, "bmm");
  return out;
}

Tensor AddmmAutograd(const Tensor& self, const Tensor& mat1, const Tensor& mat2, const Scalar& beta,
                     const Scalar& alpha) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::addmm(self, mat1, mat2, beta, alpha);
  }
  if (!ShouldRecord(self, mat1, mat2)) return out;
  // A Linear's backward (a bias row, beta = alpha = 1): the weight's and the
  // bias's gradients in one gemm_bias_grad_out, outside create_graph (the
  // fused op is not recorded; under create_graph the formula below is).
  const bool bias_row = self.dim() == 1 && beta.to_double() == 1.0 && alpha.to_double() == 1.0 &&
                        is_floating_point(self.dtype());
  auto node = Formula(
      "AddmmBackward",
      [beta, alpha, bias_row](const variable_list& saved, const variable_list& grads) {
        const Tensor& g = grads[0];
        if (bias_row && saved[0].defined() && !GradMode::is_enabled() && g.numel() > 0) {
          const Tensor& mat1 = saved[0];
          Tensor g2 = empty({mat1.sizes()[1], g.sizes()[1]},
                            TensorOptions().dtype(g.dtype()).device(g.device()));
          Tensor g_bias = empty({g.sizes()[1]}, TensorOptions().dtype(g.dtype()).device(g.device()));
          ops::gemm_bias_grad_out(g2, g_bias, mat1.t(), g, /*of_a=*/false);
          Tensor g1 = saved[1].defined() ? g.mm(saved[1].t()) : Tensor();
          return variable_list{g_bias, g1, g2};
        }
        const bool beta_zero = beta.to_double() == 0.0;
        const bool alpha_one = alpha.to_double() == 1.0;
        Tensor g_self = beta_zero ? Tensor() : (beta.to_double() == 1.0 ? g : g * beta);
        Tensor g1, g2;
        if (saved[1].defined()) g1 = alpha_one ? g.mm(saved[1].t()) : g.mm(saved[1].t()) * alpha;
        if (saved[0].defined()) g2 = alpha_one ? saved[0].t().mm(g) : saved[0].t().mm(g) * alpha;
        return variable_list{g_self, g1, g2};
      });
  node->add_next_edge(GradientEdge(self));
  node->add_next_edge(GradientEdge(mat1));
  node->add_next_edge(GradientEdge(mat2));
  node->Save(RequiresGrad(mat2) ? mat1 : Tensor());
  node->Save(RequiresGrad(mat1) ? mat2 : Tensor());
  FinishHistory(node, out, "addmm");
  return out;
}

Tensor DotAutograd(const Tensor& self, const Tensor& other) {
  Tensor out;
  {
    BelowAutogradGuard below;
    out = ops::dot(self, other);
  }
  if (!ShouldRecord(self, other)) return out;
  auto node = Formula("DotBackward", [](const variable_list& saved, const variable_list& grads) {
    const Tensor& g = grads[0];
    return variable_list{saved[1].defined() ? g * saved[1] : Tensor(),
                         saved[0].defined() ? g * saved[0] : Tensor()};
  });
  node->add_next_edge(GradientEdge(self));
  node->add_next_edge(GradientEdge(other));
  node->Save(RequiresGrad(other) ? self : Tensor());
  node->Save(RequiresGrad(self) ? other : Tensor());
  FinishHistory(node, out, "dot");
  return out;
}

EMBER_REGISTER_KERNEL(view, kAutograd, &ViewAutograd);
EMBER_REGISTER_KERNEL(as_strided, kAutograd, &AsStridedAutograd);
EMBER_REGISTER_KERNEL(transpose, kAutograd, &TransposeAutograd);
EMBER_REGISTER_KERNEL(permute, kAutograd, &PermuteAutograd);
EMBER_REGISTER_KERNEL(slice, kAutograd, &SliceAutograd);
EMBER_REGISTER_KERNEL(select, kAutograd, &SelectAutograd);
EMBER_REGISTER_KERNEL(expand, kAutograd, &ExpandAutograd);
EMBER_REGISTER_KERNEL(squeeze, kAutograd, &SqueezeAutograd);
EMBER_REGISTER_KERNEL(unsqueeze, kAutograd, &UnsqueezeAutograd);
EMBER_REGISTER_KERNEL(copy_, kAutograd, &CopyAutograd);
EMBER_REGISTER_KERNEL(fill_, kAutograd, &FillAutograd);
EMBER_REGISTER_KERNEL(unary, kAutograd, &UnaryAutograd);
EMBER_REGISTER_KERNEL(unary_, kAutograd, &UnaryInPlaceAutograd);
EMBER_REGISTER_KERNEL(binary, kAutograd, &BinaryAutograd);
EMBER_REGISTER_KERNEL(binary_, kAutograd, &BinaryInPlaceAutograd);
EMBER_REGISTER_KERNEL(where, kAutograd, &WhereAutograd);
EMBER_REGISTER_KERNEL(clamp, kAutograd, &ClampAutograd);
EMBER_REGISTER_KERNEL(clamp_, kAutograd, &ClampInPlaceAutograd);
EMBER_REGISTER_KERNEL(masked_fill_, kAutograd, &MaskedFillAutograd);
EMBER_REGISTER_KERNEL(masked_select, kAutograd, &MaskedSelectAutograd);
EMBER_REGISTER_KERNEL(index_select, kAutograd, &IndexSelectAutograd);
EMBER_REGISTER_KERNEL(cat, kAutograd, &CatAutograd);
EMBER_REGISTER_KERNEL(reduce, kAutograd, &ReduceAutograd);
EMBER_REGISTER_KERNEL(std, kAutograd, &StdAutograd);
EMBER_REGISTER_KERNEL(norm, kAutograd, &NormAutograd);
EMBER_REGISTER_KERNEL(max_dim, kAutograd, &MaxDimAutograd);
EMBER_REGISTER_KERNEL(min_dim, kAutograd, &MinDimAutograd);
EMBER_REGISTER_KERNEL(softmax, kAutograd, &SoftmaxAutograd);
EMBER_REGISTER_KERNEL(log_softmax, kAutograd, &LogSoftmaxAutograd);
EMBER_REGISTER_KERNEL(mm, kAutograd, &MmAutograd);
EMBER_REGISTER_KERNEL(bmm, kAutograd, &BmmAutograd);
EMBER_REGISTER_KERNEL(addmm, kAutograd, &AddmmAutograd);
EMBER_REGISTER_KERNEL(dot, kAutograd, &DotAutograd);

}  // namespace
}  // namespace ember::autograd
