#include "tensor/ops.h"

namespace ember {

std::string_view UnaryOpName(UnaryOp op) {
  static constexpr std::string_view kNames[] = {
      "neg",   "abs",   "exp",     "expm1", "log",  "log1p",      "log2",  "sqrt",
      "rsqrt", "sin",   "cos",     "tan",   "tanh", "sigmoid",    "relu",  "gelu",
      "erf",   "reciprocal", "sign", "floor", "ceil", "round", "square", "logical_not"};
  return kNames[static_cast<int>(op)];
}

std::string_view BinaryOpName(BinaryOp op) {
  static constexpr std::string_view kNames[] = {
      "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt",
      "le",  "gt",  "ge",  "logical_and", "logical_or", "logical_xor"};
  return kNames[static_cast<int>(op)];
}

std::string_view ReduceOpName(ReduceOp op) {
  static constexpr std::string_view kNames[] = {"sum",  "prod",   "mean",  "amax",
                                                "amin", "argmax", "argmin"};
  return kNames[static_cast<int>(op)];
}

bool UnaryOpPromotesToFloat(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kAbs:
    case UnaryOp::kRelu:
    case UnaryOp::kSign:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound:
    case UnaryOp::kSquare:
    case UnaryOp::kLogicalNot: return false;
    default: return true;
  }
}

bool BinaryOpReturnsBool(BinaryOp op) {
  return op >= BinaryOp::kEq;
}

namespace ops {
#define EMBER_OP(name, ret, args) constinit Op<ret args> name{#name};
#define EMBER_CROSS_DEVICE_OP(name, ret, args) \
  constinit Op<ret args> name{#name, /*cross_device=*/true};
#include "tensor/ops.inc"
#undef EMBER_CROSS_DEVICE_OP
#undef EMBER_OP
}  // namespace ops

}  // namespace ember
