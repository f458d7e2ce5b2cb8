// The kinds of elementwise and reduction ops, listed once: tensor/ops.h makes
// them the enums UnaryOp, BinaryOp and ReduceOp that the dispatcher's ops
// take, and the CUDA kernels (cuda/loops.cuh, compiled by nvcc without the
// tensor headers) make the same lists the int codes their launchers take, so
// the two can never disagree. Each list calls X(name) per op, in value order.
// Dependency-free on purpose.
#ifndef EMBER_TENSOR_OP_KINDS_H_
#define EMBER_TENSOR_OP_KINDS_H_

#define EMBER_UNARY_OPS(X) X(kNeg) X(kAbs) X(kExp) X(kExpm1) X(kLog) X(kLog1p) X(kLog2) X(kSqrt) \
  X(kRsqrt) X(kSin) X(kCos) X(kTan) X(kTanh) X(kSigmoid) X(kRelu) X(kGelu) X(kErf) \
  X(kReciprocal) X(kSign) X(kFloor) X(kCeil) X(kRound) X(kSquare) X(kLogicalNot)

#define EMBER_BINARY_OPS(X) X(kAdd) X(kSub) X(kMul) X(kDiv) X(kPow) X(kMaximum) X(kMinimum) \
  X(kEq) X(kNe) X(kLt) X(kLe) X(kGt) X(kGe) X(kLogicalAnd) X(kLogicalOr) X(kLogicalXor)

#define EMBER_REDUCE_OPS(X) X(kSum) X(kProd) X(kMean) X(kAmax) X(kAmin) X(kArgmax) X(kArgmin)

#endif  // EMBER_TENSOR_OP_KINDS_H_
