// Composite kernels of the reductions (tensor/ops.inc): reduce (sum, prod,
// mean, amax, amin), max_dim / min_dim, var, std, norm, softmax and
// log_softmax. They validate dims and dtypes, work out the result dtype,
// allocate the result in its keepdim shape and call the device kernels (tensor/cpu/
// reduce_kernels.cc), then drop the reduced dims unless keepdim.
//
// Note [Reduction dtypes]
// As torch:
// - sum and prod of integer or bool inputs return int64; of floating inputs,
//   the input dtype. A `dtype` argument converts the input first
//   (sum(dtype=float64) of float32 sums in float64).
// - mean needs a floating input (or a floating `dtype`).
// - amax, amin, max(dim) and min(dim) keep the input dtype (bool included);
//   the indices of max(dim)/min(dim) are int64.
// - var, softmax and log_softmax need floating inputs.
// Empty reductions: sum gives 0, prod 1, mean nan; amax/amin/max(dim) refuse a
// reduced dim of size 0, as there is no identity to return.
// Accumulation (in the kernels): float for float16/bfloat16/float32, double
// for float64, 64-bit integers for integer and bool inputs.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/ops.h"

namespace ember {
namespace {

// The wrapped, sorted dims `dims` names; every dim when empty.
SizeVector ReducedDims(const Tensor& self, IntArrayRef dims, const char* op) {
  if (self.dim() == 0) {
    WrapDims(dims, 0, op);  // Only 0 and -1 name the single element.
    return {};
  }
  if (dims.empty()) {
    SizeVector all(self.dim());
    for (int64_t d = 0; d < self.dim(); ++d) all[d] = d;
    return all;
  }
  return WrapDims(dims, self.dim(), op);
}

// `sizes` with the reduced dims set to 1 (the kernels' output shape).
SizeVector KeepdimShape(IntArrayRef sizes, IntArrayRef reduced) {
  SizeVector shape(sizes.begin(), sizes.end());
  for (int64_t d : reduced) shape[d] = 1;
  return shape;
}

// `sizes` without the reduced dims.
SizeVector SqueezedShape(IntArrayRef sizes, IntArrayRef reduced) {
  SizeVector shape;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    if (std::find(reduced.begin(), reduced.end(), d) == reduced.end()) shape.push_back(sizes[d]);
  }
  return shape;
}

Tensor Reduce(ReduceOp op, const Tensor& self_in, IntArrayRef dims, bool keepdim,
              std::optional<Dtype> dtype) {
  const std::string name(ReduceOpName(op));
  EMBER_CHECK(self_in.defined(), name, ": the input tensor is undefined");
  EMBER_CHECK(op != ReduceOp::kArgmax && op != ReduceOp::kArgmin, name,
              ": use max(dim) / min(dim) (ops::max_dim, ops::min_dim) for index reductions");
  SizeVector reduced = ReducedDims(self_in, dims, name.c_str());
  Tensor self = self_in;
  Dtype out_dtype = self.dtype();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd:
      if (dtype) {
        out_dtype = *dtype;
      } else if (!self.is_floating_point()) {
        out_dtype = kInt64;  // Integer and bool inputs accumulate and return int64.
      }
      break;
    case ReduceOp::kMean:
      out_dtype = dtype.value_or(self.dtype());
      EMBER_CHECK(is_floating_point(out_dtype),
                  "mean(): could not infer the output dtype: the input dtype must be floating "
                  "point, got ",
                  dtype_name(out_dtype), "; convert it with .to(ember::kFloat32) first");
      break;
    case ReduceOp::kAmax:
    case ReduceOp::kAmin:
      EMBER_CHECK(!dtype.has_value() || *dtype == self.dtype(), name,
                  ": a dtype argument is not supported (got ", dtype_name(*dtype), " for a ",
                  dtype_name(self.dtype()), " input); convert the input instead");
      break;
    default:
      break;
  }
  // An explicit dtype converts the input first, as torch does.
  if (dtype && *dtype != self.dtype()) self = self.to(*dtype);

  if (op == ReduceOp::kAmax || op == ReduceOp::kAmin) {
    for (int64_t d : reduced) {
      EMBER_CHECK(self.sizes()[d] != 0, name, "(): Expected reduction dim ", d,
                  " to have non-zero size (input shape ", ShapeToString(self.sizes()), ")");
    }
  }

  SizeVector keep_shape = KeepdimShape(self.sizes(), reduced);
  Tensor out = EmptyTensor(keep_shape, out_dtype, self.device());
  if (out.numel() > 0) {
    if (self.numel() == 0) {
      // Nothing to reduce: the identity (mean: 0 / 0).
      Scalar identity = op == ReduceOp::kSum    ? Scalar(0)
                        : op == ReduceOp::kProd ? Scalar(1)
                                                : Scalar(std::numeric_limits<double>::quiet_NaN());
      ops::fill_out(out, identity);
    } else {
      ops::reduce_out(op, out, self, reduced);
    }
  }
  if (keepdim) return out;
  return out.view(SqueezedShape(self.sizes(), reduced));
}

MinMaxResult ArgReduce(ReduceOp op, const Tensor& self, int64_t dim, bool keepdim) {
  const char* name = op == ReduceOp::kArgmax ? "max" : "min";
  EMBER_CHECK(self.defined(), name, ": the input tensor is undefined");
  int64_t d = WrapDim(dim, self.dim(), name);
  // A 0-dim tensor reduces over its single element (dim 0 or -1).
  Tensor input = self.dim() == 0 ? self.view({1}) : self;
  EMBER_CHECK(input.sizes()[d] != 0, name, "(): Expected reduction dim ", d,
              " to have non-zero size (input shape ", ShapeToString(self.sizes()), ")");
  SizeVector keep_shape = KeepdimShape(input.sizes(), {d});
  Tensor values = EmptyTensor(keep_shape, self.dtype(), self.device());
  Tensor indices = EmptyTensor(keep_shape, kInt64, self.device());
  if (values.numel() > 0) ops::arg_reduce_out(op, values, indices, input, d);
  if (self.dim() == 0) return {values.view({}), indices.view({})};
  if (keepdim) return {values, indices};
  SizeVector shape = SqueezedShape(input.sizes(), {d});
  return {values.view(shape), indices.view(shape)};
}

MinMaxResult MaxDim(const Tensor& self, int64_t dim, bool keepdim) {
  return ArgReduce(ReduceOp::kArgmax, self, dim, keepdim);
}

MinMaxResult MinDim(const Tensor& self, int64_t dim, bool keepdim) {
  return ArgReduce(ReduceOp::kArgmin, self, dim, keepdim);
}

// Two passes (mean, then the sum of squared deviations), computed in float
// for the 16-bit floats and cast back.
Tensor Var(const Tensor& self, IntArrayRef dims, int64_t correction, bool keepdim) {
  EMBER_CHECK(self.defined(), "var: the input tensor is undefined");
  EMBER_CHECK(self.is_floating_point(), "var: std and var only support floating point dtypes, got ",
              dtype_name(self.dtype()), "; convert the input with .to(ember::kFloat32) first");
  SizeVector reduced = ReducedDims(self, dims, "var");
  int64_t n = 1;
  for (int64_t d : reduced) n *= self.sizes()[d];
  const bool half = self.dtype() == kFloat16 || self.dtype() == kBFloat16;
  Tensor x = half ? self.to(kFloat32) : self;
  Tensor mean = x.mean(reduced, /*keepdim=*/true);
  Tensor dev = x.sub(mean);
  Tensor sum_sq = dev.mul(dev).sum(reduced, keepdim);
  // No degrees of freedom left (n <= correction): nan, where torch warns and
  // returns nan or inf.
  const int64_t dof = n - correction;
  double scale =
      dof > 0 ? 1.0 / static_cast<double>(dof) : std::numeric_limits<double>::quiet_NaN();
  Tensor result = sum_sq.mul(scale);
  return half ? result.to(self.dtype()) : result;
}

Tensor Std(const Tensor& self, IntArrayRef dims, int64_t correction, bool keepdim) {
  return ops::var(self, dims, correction, keepdim).sqrt();
}

// The p-norm over `dims` (all when empty): max |x| for p = inf, min |x| for
// -inf, the count of non-zeros for 0, (sum |x|^p)^(1/p) otherwise.
Tensor Norm(const Tensor& self, const Scalar& p, IntArrayRef dims, bool keepdim) {
  EMBER_CHECK(self.defined(), "norm: the input tensor is undefined");
  EMBER_CHECK(self.is_floating_point(), "norm: expected a floating point tensor, got ",
              dtype_name(self.dtype()), "; convert the input with .to(ember::kFloat32) first");
  const double pv = p.to_double();
  if (std::isinf(pv)) {
    return pv > 0 ? self.abs().amax(dims, keepdim) : self.abs().amin(dims, keepdim);
  }
  if (pv == 0) return self.ne(0).to(self.dtype()).sum(dims, keepdim);
  if (pv == 1) return self.abs().sum(dims, keepdim);
  if (pv == 2) return self.square().sum(dims, keepdim).sqrt();
  return self.abs().pow(p).sum(dims, keepdim).pow(1.0 / pv);
}

Tensor Softmax(const Tensor& self, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  EMBER_CHECK(self.defined(), name, ": the input tensor is undefined");
  EMBER_CHECK(self.is_floating_point(), name, ": expected a floating point tensor, got ",
              dtype_name(self.dtype()), "; convert the input with .to(ember::kFloat32) first");
  int64_t d = WrapDim(dim, self.dim(), name);
  Tensor out = EmptyTensor(self.sizes(), self.dtype(), self.device());
  if (out.numel() == 0) return out;
  if (self.dim() == 0) {
    ops::softmax_out(out.view({1}), self.view({1}), 0, log);
  } else {
    ops::softmax_out(out, self, d, log);
  }
  return out;
}

Tensor SoftmaxOp(const Tensor& self, int64_t dim) { return Softmax(self, dim, false); }
Tensor LogSoftmaxOp(const Tensor& self, int64_t dim) { return Softmax(self, dim, true); }

EMBER_REGISTER_KERNEL(reduce, kComposite, &Reduce);
EMBER_REGISTER_KERNEL(max_dim, kComposite, &MaxDim);
EMBER_REGISTER_KERNEL(min_dim, kComposite, &MinDim);
EMBER_REGISTER_KERNEL(var, kComposite, &Var);
EMBER_REGISTER_KERNEL(std, kComposite, &Std);
EMBER_REGISTER_KERNEL(norm, kComposite, &Norm);
EMBER_REGISTER_KERNEL(softmax, kComposite, &SoftmaxOp);
EMBER_REGISTER_KERNEL(log_softmax, kComposite, &LogSoftmaxOp);

}  // namespace
}  // namespace ember
