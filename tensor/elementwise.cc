// Composite kernels of the elementwise ops (tensor/ops.inc): unary, binary,
// where and clamp, out of place and in place. They validate, work out the
// result dtype (torch.result_type), broadcast, convert inputs to the compute
// dtype, allocate and call the device `_out` kernels (tensor/cpu/
// elementwise_kernels.cc), which see inputs of the output's shape already in
// the compute dtype.
//
// Note [Elementwise dtypes]
// - unary: ops that UnaryOpPromotesToFloat (exp, sqrt, sigmoid, ...) compute
//   integer and bool inputs in the default float dtype (float32); the others
//   keep the input dtype, except logical_not (bool result) and square on bool
//   (int64, as torch's pow(bool, 2)). neg, abs, relu, floor, ceil and round
//   refuse bool, as torch does.
// - binary: the compute dtype is torch.result_type of the operands, except
//   div, which is true division (integer operands compute in float32).
//   Comparisons and logical ops compute in that dtype and return bool.
// - in place: the result dtype must be castable to the destination's
//   (torch.can_cast: no float -> integer, no non-bool -> bool).
//
// Note [One-pass alpha]
// add/sub(self, other, alpha) compute self +- alpha * other. Optimizers and
// gradient buckets call them in place on large tensors, so the CPU kernel
// (binary_alpha_out) takes alpha and makes one pass, with no temporary for
// alpha * other: float dtypes multiply-add in their op-math type, integers
// and bool stay exact (wrapping, as torch). alpha follows torch's rules: it
// must not be a floating-point number when the compute dtype is integral or
// bool, and a bool alpha needs bool operands. The ops have no autograd
// kernel: when an argument requires grad, Tensor::add/sub record mul and add
// as before. Devices without a binary_alpha_out kernel also take the
// two-pass route.
#include <optional>
#include <string>
#include <string_view>

#include "tensor/ops.h"

namespace ember {
namespace {

// torch.can_cast(from, to): never down a category.
bool CanCast(Dtype from, Dtype to) {
  if (is_floating_point(from) && !is_floating_point(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

void CheckCastable(Dtype result, const Tensor& self, std::string_view op) {
  EMBER_CHECK(CanCast(result, self.dtype()), op, "_: result type ", dtype_name(result),
              " can't be cast to the desired output type ", dtype_name(self.dtype()),
              " of the in-place destination; use the out-of-place ", op,
              " or convert the tensor first");
}

void AddToResultType(ResultTypeState& state, const Tensor& t) {
  if (t.impl()->is_wrapped_number()) {
    state.AddScalar(t.dtype());
  } else {
    state.AddTensor(t.dtype(), t.dim() == 0);
  }
}

// Converts `t` to `dtype` (a copy only when needed) and broadcasts it to
// `shape`. The broadcast operand is the kernel's alone: it never reaches the
// caller or autograd, so it is built directly over the same storage, without
// the dispatch, version counter and base of a user-visible expand view
// (which would cost every op on a number or a smaller operand).
Tensor Prepare(const Tensor& t, Dtype dtype, IntArrayRef shape) {
  Tensor r = t.dtype() == dtype ? t : t.to(dtype);
  if (r.sizes() == shape) return r;
  ExpandedGeometry g = ExpandGeometry(r.sizes(), r.strides(), shape);
  return Tensor(MakeTensorImpl(r.storage(), r.dtype(), g.sizes, g.strides, r.storage_offset()));
}

// Moves a 0-dim operand to the other operand's device (as torch lets CPU
// scalars meet CUDA tensors); refuses other mixes.
Tensor OnDevice(const Tensor& t, Device device, std::string_view op) {
  if (t.device() == device) return t;
  EMBER_CHECK(t.dim() == 0, op, ": expected all tensors to be on the same device, but found ",
              device.str(), " and ", t.device().str());
  return t.to(device);
}

// An input of an in-place op that shares memory with `self` in a different
// layout is cloned, so that writes to self don't change what is still to be
// read. The same layout is safe: each element is read before it is written.
Tensor Unaliased(const Tensor& self, const Tensor& in) {
  if (in.is_same(self) || SameView(self, in) || !MayOverlap(self, in)) return in;
  return in.clone();
}

// --- Unary -----------------------------------------------------------------------

Dtype UnaryResultDtype(UnaryOp op, Dtype in) {
  std::string_view name = UnaryOpName(op);
  if (op == UnaryOp::kLogicalNot) return kBool;
  if (UnaryOpPromotesToFloat(op)) return is_floating_point(in) ? in : kDefaultFloatDtype;
  if (in == kBool) {
    switch (op) {
      case UnaryOp::kNeg:
        EMBER_FAIL(
            "neg: negation, the `-` operator, on a bool tensor is not supported. If you are "
            "trying to invert a mask, use logical_not() instead.");
      case UnaryOp::kSign:
        return kBool;
      case UnaryOp::kSquare:
        return kInt64;  // torch.pow(bool, 2) is int64.
      default:
        EMBER_FAIL(name,
                   ": not supported for bool tensors (dtype bool); convert with "
                   "to() first");
    }
  }
  return in;
}

// Integers are their own floor, ceil and round: a copy (or nothing in place).
bool IsIdentityOnIntegers(UnaryOp op, Dtype dtype) {
  return is_integral(dtype) &&
         (op == UnaryOp::kFloor || op == UnaryOp::kCeil || op == UnaryOp::kRound);
}

// The kernel input: `self` in the dtype the op computes in.
Tensor UnaryInput(UnaryOp op, const Tensor& self, Dtype result) {
  if (op == UnaryOp::kLogicalNot) return self;  // The kernel reads any dtype.
  return self.dtype() == result ? self : self.to(result);
}

Tensor Unary(UnaryOp op, const Tensor& self) {
  EMBER_CHECK(self.defined(), UnaryOpName(op), ": the tensor is undefined");
  Dtype result = UnaryResultDtype(op, self.dtype());
  Tensor out = EmptyTensor(self.sizes(), result, self.device());
  if (self.numel() == 0) return out;
  const bool identity = IsIdentityOnIntegers(op, self.dtype());
  if (identity) {
    ops::copy_out(out, self);
  } else {
    ops::unary_out(op, out, UnaryInput(op, self, result));
  }
  return out;
}

Tensor UnaryInPlace(UnaryOp op, const Tensor& self) {
  std::string_view name = UnaryOpName(op);
  EMBER_CHECK(self.defined(), name, "_: the tensor is undefined");
  Dtype result = UnaryResultDtype(op, self.dtype());
  CheckCastable(result, self, name);
  CheckWritable(self, std::string(name).append("_").c_str());
  const bool identity = IsIdentityOnIntegers(op, self.dtype());
  if (self.numel() > 0 && !identity) {
    if (result == self.dtype() && op != UnaryOp::kLogicalNot) {
      ops::unary_out(op, self, self);
    } else {
      Tensor tmp = EmptyTensor(self.sizes(), result, self.device());
      ops::unary_out(op, tmp, UnaryInput(op, self, result));
      ops::copy_out(self, tmp);
    }
  }
  BumpVersion(self);
  return self;
}

// --- Binary ----------------------------------------------------------------------

struct BinaryPlan {
  SizeVector shape;
  Dtype compute;  // Dtype of both kernel inputs.
  Dtype result;   // Dtype of the output.
};

bool IsNegativeIntegerScalar(const Tensor& t) {
  if (!t.impl()->is_wrapped_number() || !is_integral(t.dtype())) return false;
  return t.item<int64_t>() < 0;
}

BinaryPlan PlanBinary(BinaryOp op, const Tensor& a, const Tensor& b) {
  std::string_view name = BinaryOpName(op);
  std::string name_str(name);
  EMBER_CHECK(a.defined() && b.defined(), name, ": both tensors must be defined");
  BinaryPlan plan;
  plan.shape = BroadcastShapes(a.sizes(), b.sizes(), name_str.c_str());
  ResultTypeState state;
  AddToResultType(state, a);
  AddToResultType(state, b);
  Dtype common = state.Result();
  switch (op) {
    case BinaryOp::kSub:
      EMBER_CHECK(common != kBool,
                  "sub: Subtraction, the `-` operator, with two bool tensors is not supported. "
                  "Use the `^` or `logical_xor()` operator instead.");
      break;
    case BinaryOp::kPow:
      EMBER_CHECK(common != kBool,
                  "pow: not supported for bool operands (result dtype bool); "
                  "convert them with to() first");
      EMBER_CHECK(!(is_integral(common) && IsNegativeIntegerScalar(b)),
                  "pow: Integers to negative integer powers are not allowed. (base dtype ",
                  dtype_name(a.dtype()), ", exponent ", b.item<int64_t>(), ")");
      break;
    default:
      break;
  }
  plan.compute = (op == BinaryOp::kDiv && !is_floating_point(common)) ? kDefaultFloatDtype : common;
  plan.result = BinaryOpReturnsBool(op) ? kBool : plan.compute;
  return plan;
}

Tensor Binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  BinaryPlan plan = PlanBinary(op, a, b);
  // The device of the dimensioned operand wins over a 0-dim one.
  Device device = (a.dim() == 0 && b.dim() > 0) ? b.device() : a.device();
  Tensor a2 = OnDevice(a, device, BinaryOpName(op));
  Tensor b2 = OnDevice(b, device, BinaryOpName(op));
  Tensor out = EmptyTensor(plan.shape, plan.result, device);
  if (out.numel() == 0) return out;
  ops::binary_out(op, out, Prepare(a2, plan.compute, plan.shape),
                  Prepare(b2, plan.compute, plan.shape));
  return out;
}

Tensor BinaryInPlace(BinaryOp op, const Tensor& self, const Tensor& other) {
  std::string_view name = BinaryOpName(op);
  std::string inplace_name = std::string(name) + "_";
  BinaryPlan plan = PlanBinary(op, self, other);
  CheckInPlaceShape(self, plan.shape, inplace_name.c_str());
  CheckCastable(plan.result, self, name);
  CheckWritable(self, inplace_name.c_str());
  Tensor o = OnDevice(other, self.device(), name);
  if (self.numel() > 0) {
    Tensor in_b = Prepare(Unaliased(self, o), plan.compute, plan.shape);
    if (plan.result == self.dtype() && plan.compute == self.dtype()) {
      ops::binary_out(op, self, self, in_b);
    } else {
      Tensor tmp = EmptyTensor(plan.shape, plan.result, self.device());
      ops::binary_out(op, tmp, Prepare(self, plan.compute, plan.shape), in_b);
      ops::copy_out(self, tmp);
    }
  }
  BumpVersion(self);
  return self;
}

// --- add/sub with alpha (Note [One-pass alpha]) ----------------------------------

void CheckAlpha(BinaryOp op, Dtype compute, const Scalar& alpha) {
  std::string_view name = BinaryOpName(op);
  EMBER_CHECK(!alpha.is_bool() || compute == kBool, name,
              ": Boolean alpha only supported for Boolean results (alpha ", alpha.str(),
              ", result dtype ", dtype_name(compute), ")");
  EMBER_CHECK(is_floating_point(compute) || !alpha.is_floating_point(), name,
              ": For integral input tensors, argument alpha must not be a floating point "
              "number (alpha ",
              alpha.str(), ", result dtype ", dtype_name(compute),
              "); pass an integer alpha or convert the tensors to a floating dtype");
}

Tensor Scaled(const Tensor& other, const Scalar& alpha) {
  return ops::binary(BinaryOp::kMul, other, WrapScalar(alpha, other.device()));
}

bool HasAlphaKernel(Device device) {
  return ops::binary_alpha_out.HasKernel(DeviceDispatchKey(device.type()));
}

void CheckAlphaOp(BinaryOp op) {
  EMBER_INTERNAL_ASSERT(op == BinaryOp::kAdd || op == BinaryOp::kSub,
                        "binary_alpha: only add and sub take alpha");
}

Tensor BinaryAlpha(BinaryOp op, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  CheckAlphaOp(op);
  BinaryPlan plan = PlanBinary(op, a, b);
  CheckAlpha(op, plan.compute, alpha);
  Device device = (a.dim() == 0 && b.dim() > 0) ? b.device() : a.device();
  if (!HasAlphaKernel(device)) return ops::binary(op, a, Scaled(b, alpha));
  Tensor a2 = OnDevice(a, device, BinaryOpName(op));
  Tensor b2 = OnDevice(b, device, BinaryOpName(op));
  Tensor out = EmptyTensor(plan.shape, plan.result, device);
  if (out.numel() == 0) return out;
  ops::binary_alpha_out(op, out, Prepare(a2, plan.compute, plan.shape),
                        Prepare(b2, plan.compute, plan.shape), alpha);
  return out;
}

Tensor BinaryAlphaInPlace(BinaryOp op, const Tensor& self, const Tensor& other,
                          const Scalar& alpha) {
  CheckAlphaOp(op);
  std::string_view name = BinaryOpName(op);
  std::string inplace_name = std::string(name) + "_";
  BinaryPlan plan = PlanBinary(op, self, other);
  CheckAlpha(op, plan.compute, alpha);
  if (!HasAlphaKernel(self.device())) return ops::binary_(op, self, Scaled(other, alpha));
  CheckInPlaceShape(self, plan.shape, inplace_name.c_str());
  CheckCastable(plan.result, self, name);
  CheckWritable(self, inplace_name.c_str());
  Tensor o = OnDevice(other, self.device(), name);
  if (self.numel() > 0) {
    Tensor in_b = Prepare(Unaliased(self, o), plan.compute, plan.shape);
    if (plan.result == self.dtype() && plan.compute == self.dtype()) {
      ops::binary_alpha_out(op, self, self, in_b, alpha);
    } else {
      Tensor tmp = EmptyTensor(plan.shape, plan.result, self.device());
      ops::binary_alpha_out(op, tmp, Prepare(self, plan.compute, plan.shape), in_b, alpha);
      ops::copy_out(self, tmp);
    }
  }
  BumpVersion(self);
  return self;
}

// --- where -----------------------------------------------------------------------

Tensor Where(const Tensor& condition, const Tensor& self, const Tensor& other) {
  EMBER_CHECK(condition.defined() && self.defined() && other.defined(),
              "where: all three tensors must be defined");
  EMBER_CHECK(condition.dtype() == kBool, "where: expected condition to be a bool tensor, got ",
              dtype_name(condition.dtype()), "; compare it (e.g. t != 0) to make a mask");
  SizeVector shape = BroadcastShapes(condition.sizes(), self.sizes(), "where");
  shape = BroadcastShapes(shape, other.sizes(), "where");
  ResultTypeState state;
  AddToResultType(state, self);
  AddToResultType(state, other);
  Dtype dtype = state.Result();
  Device device = condition.dim() > 0 ? condition.device()
                  : self.dim() > 0    ? self.device()
                                      : other.device();
  Tensor c = OnDevice(condition, device, "where");
  Tensor a = OnDevice(self, device, "where");
  Tensor b = OnDevice(other, device, "where");
  Tensor out = EmptyTensor(shape, dtype, device);
  if (out.numel() == 0) return out;
  ops::where_out(out, Prepare(c, kBool, shape), Prepare(a, dtype, shape), Prepare(b, dtype, shape));
  return out;
}

// --- clamp -----------------------------------------------------------------------

Dtype ClampDtype(const Tensor& self, const std::optional<Scalar>& min,
                 const std::optional<Scalar>& max, const char* op) {
  EMBER_CHECK(self.defined(), op, ": the tensor is undefined");
  EMBER_CHECK(min.has_value() || max.has_value(), op,
              ": At least one of 'min' or 'max' must not be None");
  ResultTypeState state;
  state.AddTensor(self.dtype(), self.dim() == 0);
  if (min) state.AddScalar(min->dtype());
  if (max) state.AddScalar(max->dtype());
  Dtype dtype = state.Result();
  EMBER_CHECK(dtype != kBool, op, ": not supported for bool tensors (dtype bool)");
  return dtype;
}

Tensor Clamp(const Tensor& self, const std::optional<Scalar>& min,
             const std::optional<Scalar>& max) {
  Dtype dtype = ClampDtype(self, min, max, "clamp");
  Tensor out = EmptyTensor(self.sizes(), dtype, self.device());
  if (out.numel() == 0) return out;
  ops::clamp_out(out, Prepare(self, dtype, self.sizes()), min, max);
  return out;
}

Tensor ClampInPlace(const Tensor& self, const std::optional<Scalar>& min,
                    const std::optional<Scalar>& max) {
  Dtype dtype = ClampDtype(self, min, max, "clamp_");
  CheckCastable(dtype, self, "clamp");
  CheckWritable(self, "clamp_");
  if (self.numel() > 0) {
    if (dtype == self.dtype()) {
      ops::clamp_out(self, self, min, max);
    } else {
      Tensor tmp = EmptyTensor(self.sizes(), dtype, self.device());
      ops::clamp_out(tmp, self.to(dtype), min, max);
      ops::copy_out(self, tmp);
    }
  }
  BumpVersion(self);
  return self;
}

EMBER_REGISTER_KERNEL(unary, kComposite, &Unary);
EMBER_REGISTER_KERNEL(unary_, kComposite, &UnaryInPlace);
EMBER_REGISTER_KERNEL(binary, kComposite, &Binary);
EMBER_REGISTER_KERNEL(binary_, kComposite, &BinaryInPlace);
EMBER_REGISTER_KERNEL(binary_alpha, kComposite, &BinaryAlpha);
EMBER_REGISTER_KERNEL(binary_alpha_, kComposite, &BinaryAlphaInPlace);
EMBER_REGISTER_KERNEL(where, kComposite, &Where);
EMBER_REGISTER_KERNEL(clamp, kComposite, &Clamp);
EMBER_REGISTER_KERNEL(clamp_, kComposite, &ClampInPlace);

}  // namespace
}  // namespace ember
