// CUDA kernels of unary_out, binary_out, binary_alpha_out, where_out and
// clamp_out: the host side of elementwise_kernels.cu. The composite ops
// (tensor/elementwise.cc) have validated, broadcast (inputs expanded to the
// output's shape) and promoted (inputs in the compute dtype) everything.
#include "cuda/kernels.h"
#include "tensor/device_guard.h"

namespace ember::cuda {
namespace {

using internal::CheckLaunch;
using internal::DtypeCode;
using internal::Ptr;
using internal::StreamOf;

void UnaryOut(UnaryOp op, const Tensor& out, const Tensor& self) {
  if (out.numel() == 0) return;
  internal::CheckSameDevice("unary", {&out, &self});
  DeviceGuard guard(out.device());
  const auto g = internal::GeometryOf<2>(std::string(UnaryOpName(op)).c_str(), {&out, &self});
  CheckLaunch(kernels::LaunchUnary(StreamOf(out.device()), static_cast<int>(op), g, Ptr(out),
                                   Ptr(self), DtypeCode(self.dtype())),
              "unary kernel");
}

void BinaryImpl(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                const Scalar* alpha) {
  if (out.numel() == 0) return;
  internal::CheckSameDevice("binary", {&out, &a, &b});
  DeviceGuard guard(out.device());
  const auto g = internal::GeometryOf<3>(std::string(BinaryOpName(op)).c_str(), {&out, &a, &b});
  double alpha_float = 1;
  int64_t alpha_int = 1;
  if (alpha != nullptr) {
    if (a.is_floating_point()) {
      alpha_float = alpha->to<double>();
    } else if (a.dtype() == kBool) {
      alpha_int = alpha->to<bool>() ? 1 : 0;
    } else {
      alpha_int = alpha->to<int64_t>();
    }
  }
  CheckLaunch(
      kernels::LaunchBinary(StreamOf(out.device()), static_cast<int>(op), g, Ptr(out), Ptr(a),
                            Ptr(b), DtypeCode(a.dtype()), alpha != nullptr, alpha_float, alpha_int),
      "binary kernel");
}

void BinaryOut(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  BinaryImpl(op, out, a, b, nullptr);
}

void BinaryAlphaOut(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                    const Scalar& alpha) {
  EMBER_INTERNAL_ASSERT(op == BinaryOp::kAdd || op == BinaryOp::kSub,
                        "binary_alpha_out: op must be add or sub");
  BinaryImpl(op, out, a, b, &alpha);
}

void WhereOut(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  internal::CheckSameDevice("where", {&out, &condition, &a, &b});
  DeviceGuard guard(out.device());
  const auto g = internal::GeometryOf<4>("where", {&out, &condition, &a, &b});
  CheckLaunch(kernels::LaunchWhere(StreamOf(out.device()), g, Ptr(out), Ptr(condition), Ptr(a),
                                   Ptr(b), DtypeCode(out.dtype())),
              "where kernel");
}

void ClampOut(const Tensor& out, const Tensor& self, const std::optional<Scalar>& min,
              const std::optional<Scalar>& max) {
  if (out.numel() == 0) return;
  EMBER_CHECK(out.dtype() != kBool, "clamp: not implemented for bool tensors");
  internal::CheckSameDevice("clamp", {&out, &self});
  DeviceGuard guard(out.device());
  const auto g = internal::GeometryOf<2>("clamp", {&out, &self});
  const bool fp = out.is_floating_point();
  CheckLaunch(
      kernels::LaunchClamp(StreamOf(out.device()), g, Ptr(out), Ptr(self), DtypeCode(out.dtype()),
                           min.has_value(), max.has_value(), min && fp ? min->to<double>() : 0.0,
                           max && fp ? max->to<double>() : 0.0, min && !fp ? min->to<int64_t>() : 0,
                           max && !fp ? max->to<int64_t>() : 0),
      "clamp kernel");
}

EMBER_REGISTER_KERNEL(unary_out, kCUDA, &UnaryOut);
EMBER_REGISTER_KERNEL(binary_out, kCUDA, &BinaryOut);
EMBER_REGISTER_KERNEL(binary_alpha_out, kCUDA, &BinaryAlphaOut);
EMBER_REGISTER_KERNEL(where_out, kCUDA, &WhereOut);
EMBER_REGISTER_KERNEL(clamp_out, kCUDA, &ClampOut);

}  // namespace
}  // namespace ember::cuda
