// Composite kernels of the matrix products (tensor/ops.inc): mm, bmm, addmm
// and dot. They check ranks, shapes and dtypes with torch's messages, allocate
// the result and call the device kernel gemm_out on batched 3-D views
// (b x n x k @ b x k x m -> b x n x m). matmul and outer are composed from
// these in tensor.cc. Beside them, the composites of a Linear's fused
// kernels: gemm_bias_out, gemm_bias_act_out and gemm_bias_grad_out.
//
// Dtypes: both operands (and addmm's self) must share one dtype, as torch
// requires; the result has it. Every dtype but bool is supported (torch has no
// bool matrix product on CPU). For integer dtypes addmm's beta and alpha must
// be integers.
#include <cmath>
#include <vector>

#include "tensor/ops.h"

namespace ember {
namespace {

void CheckDefinedOnOneDevice(const char* op, const Tensor& a, const Tensor& b) {
  EMBER_CHECK(a.defined() && b.defined(), op, ": both arguments must be defined tensors");
  EMBER_CHECK(a.device() == b.device(), op,
              ": expected both arguments to be on the same device, but found ",
              a.device().str(), " and ", b.device().str());
}

void CheckSameDtype(const char* op, const char* what, const Tensor& a, const Tensor& b) {
  EMBER_CHECK(a.dtype() == b.dtype(), op, ": expected both ", what,
              " to have the same dtype, but found ", dtype_name(a.dtype()), " and ",
              dtype_name(b.dtype()), "; convert one with .to(...)");
  EMBER_CHECK(a.dtype() != kBool, op, ": not implemented for bool tensors; convert them with "
              ".to(ember::kInt64) or a floating dtype first");
}

void CheckMatrix(const char* op, const char* name, const Tensor& t, int64_t rank) {
  EMBER_CHECK(t.dim() == rank, op, ": expected ", name, " to be a ", rank, "-D tensor, but got a ",
              t.dim(), "-D tensor of shape ", ShapeToString(t.sizes()));
}

// The checks mm and addmm share on their two matrices; returns the result
// shape [n, m].
SizeVector CheckMatrixProduct(const char* op, const Tensor& mat1, const Tensor& mat2) {
  CheckDefinedOnOneDevice(op, mat1, mat2);
  CheckMatrix(op, "mat1", mat1, 2);
  CheckMatrix(op, "mat2", mat2, 2);
  const int64_t n = mat1.sizes()[0], k = mat1.sizes()[1], k2 = mat2.sizes()[0],
                m = mat2.sizes()[1];
  EMBER_CHECK(k == k2, op, ": mat1 and mat2 shapes cannot be multiplied (", n, "x", k, " and ", k2,
              "x", m, ")");
  CheckSameDtype(op, "matrices", mat1, mat2);
  return {n, m};
}

Tensor Mm(const Tensor& self, const Tensor& other) {
  SizeVector shape = CheckMatrixProduct("mm", self, other);
  Tensor out = EmptyTensor(shape, self.dtype(), self.device());
  ops::gemm_out(out.unsqueeze(0), self.unsqueeze(0), other.unsqueeze(0), 0, 1);
  return out;
}

Tensor Bmm(const Tensor& self, const Tensor& other) {
  CheckDefinedOnOneDevice("bmm", self, other);
  CheckMatrix("bmm", "batch1", self, 3);
  CheckMatrix("bmm", "batch2", other, 3);
  const int64_t b = self.sizes()[0], n = self.sizes()[1], k = self.sizes()[2];
  const int64_t b2 = other.sizes()[0], k2 = other.sizes()[1], m = other.sizes()[2];
  EMBER_CHECK(b == b2, "bmm: batch1 and batch2 must have the same batch size, but got shapes ",
              ShapeToString(self.sizes()), " and ", ShapeToString(other.sizes()));
  EMBER_CHECK(k == k2, "bmm: batch1 and batch2 shapes cannot be multiplied (", n, "x", k, " and ",
              k2, "x", m, " matrices, from shapes ", ShapeToString(self.sizes()), " and ",
              ShapeToString(other.sizes()), ")");
  CheckSameDtype("bmm", "batches", self, other);
  Tensor out = EmptyTensor({b, n, m}, self.dtype(), self.device());
  ops::gemm_out(out, self, other, 0, 1);
  return out;
}

Tensor Addmm(const Tensor& self, const Tensor& mat1, const Tensor& mat2, const Scalar& beta,
             const Scalar& alpha) {
  SizeVector shape = CheckMatrixProduct("addmm", mat1, mat2);
  CheckDefinedOnOneDevice("addmm", self, mat1);
  EMBER_CHECK(self.dtype() == mat1.dtype(), "addmm: expected self and the matrices to have the "
              "same dtype, but found ", dtype_name(self.dtype()), " and ", dtype_name(mat1.dtype()));
  EMBER_CHECK(BroadcastShapes(self.sizes(), shape, "addmm") == shape, "addmm: self of shape ",
              ShapeToString(self.sizes()), " cannot be broadcast to the result shape ",
              ShapeToString(shape));
  if (!is_floating_point(self.dtype())) {
    EMBER_CHECK(!beta.is_floating_point() && !alpha.is_floating_point(),
                "addmm: for integer tensors beta and alpha must be integers, got beta=",
                beta.str(), " and alpha=", alpha.str());
  }
  Tensor out = EmptyTensor(shape, self.dtype(), self.device());
  if (self.dim() == 1 && is_floating_point(self.dtype()) && beta.to_double() == 1.0 &&
      alpha.to_double() == 1.0 && out.numel() > 0) {
    ops::gemm_bias_out(out, mat1, mat2, self);  // a bias on every row
    return out;
  }
  // beta == 0 ignores self entirely (its NaNs included), as torch does.
  const bool use_self = beta.to_double() != 0.0;
  if (use_self && out.numel() > 0) ops::copy_out(out, self.expand(shape));
  ops::gemm_out(out.unsqueeze(0), mat1.unsqueeze(0), mat2.unsqueeze(0), use_self ? beta : Scalar(0),
                alpha);
  return out;
}

Tensor Dot(const Tensor& self, const Tensor& other) {
  CheckDefinedOnOneDevice("dot", self, other);
  EMBER_CHECK(self.dim() == 1 && other.dim() == 1, "dot: 1D tensors expected, but got ",
              self.dim(), "D and ", other.dim(), "D tensors");
  EMBER_CHECK(self.numel() == other.numel(),
              "dot: inconsistent tensor size, expected tensor ", ShapeToString(self.sizes()),
              " and src ", ShapeToString(other.sizes()),
              " to have the same number of elements, but got ", self.numel(), " and ",
              other.numel(), " elements respectively");
  EMBER_CHECK(self.dtype() == other.dtype(),
              "dot: expected both vectors to have same dtype, but found ", dtype_name(self.dtype()),
              " and ", dtype_name(other.dtype()));
  CheckSameDtype("dot", "vectors", self, other);
  Tensor out = EmptyTensor({}, self.dtype(), self.device());
  // [1, 1, k] @ [1, k, 1] -> [1, 1, 1].
  ops::gemm_out(out.view({1, 1, 1}), self.unsqueeze(0).unsqueeze(0),
                other.unsqueeze(0).unsqueeze(2), 0, 1);
  return out;
}

EMBER_REGISTER_KERNEL(mm, kComposite, &Mm);
EMBER_REGISTER_KERNEL(bmm, kComposite, &Bmm);
EMBER_REGISTER_KERNEL(addmm, kComposite, &Addmm);
EMBER_REGISTER_KERNEL(dot, kComposite, &Dot);

// The devices without a fused bias: the rows, then one GEMM with beta 1.
void GemmBiasOut(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  ops::copy_out(out, bias.expand(out.sizes()));
  ops::gemm_out(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), 1, 1);
}
EMBER_REGISTER_KERNEL(gemm_bias_out, kComposite, &GemmBiasOut);

// GELU's tanh form, 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3))).
Tensor GeluTanh(const Tensor& z) {
  const double k = std::sqrt(2.0 / M_PI);
  return z * 0.5 * (((z + z * z * z * 0.044715) * k).tanh() + 1.0);
}

// The devices without a fused activation: the GEMM with its bias, then the
// activation.
void GemmBiasActOut(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b,
                    const Tensor& bias, int64_t act) {
  const auto activation = static_cast<GemmActivation>(act);
  EMBER_CHECK(activation == GemmActivation::kReLU || activation == GemmActivation::kGeluTanh,
              "gemm_bias_act_out: unknown activation ", act,
              " (GemmActivation::kReLU or kGeluTanh)");
  const Tensor& z = pre.defined() ? pre : out;
  ops::gemm_bias_out(z, a, b, bias);
  ops::copy_out(out, activation == GemmActivation::kReLU ? z.relu() : GeluTanh(z));
}
EMBER_REGISTER_KERNEL(gemm_bias_act_out, kComposite, &GemmBiasActOut);

// The devices without a fused bias gradient: the GEMM, then the sums.
void GemmBiasGradOut(const Tensor& out, const Tensor& bias_grad, const Tensor& a, const Tensor& b,
                     bool of_a) {
  ops::gemm_out(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), 0, 1);
  ops::copy_out(bias_grad, of_a ? a.sum(std::vector<int64_t>{1}) : b.sum(std::vector<int64_t>{0}));
}
EMBER_REGISTER_KERNEL(gemm_bias_grad_out, kComposite, &GemmBiasGradOut);

}  // namespace
}  // namespace ember
