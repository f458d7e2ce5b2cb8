// CUDA kernels of reduce_out, arg_reduce_out and softmax_out: the host side
// of reduce_kernels.cu (Note [CUDA reduction strategy]) and
// softmax_kernels.cu. The composite ops (tensor/reduce.cc) have validated
// dims and dtypes and allocated the keepdim-shaped outputs.
#include <vector>

#include "cuda/kernels.h"
#include "tensor/device_guard.h"

namespace ember::cuda {
namespace {

using internal::CheckLaunch;
using internal::DtypeCode;
using internal::Ptr;
using internal::StreamOf;

void ReduceOut(ReduceOp op, const Tensor& out, const Tensor& self, IntArrayRef /*dims*/) {
  EMBER_INTERNAL_ASSERT(out.dim() == self.dim(), "reduce_out: out must have the keepdim shape");
  if (out.numel() == 0 || self.numel() == 0) return;
  EMBER_CHECK(op != ReduceOp::kArgmax && op != ReduceOp::kArgmin, "reduce_out: ", ReduceOpName(op),
              " is not a value reduction");
  EMBER_CHECK(op != ReduceOp::kMean || self.is_floating_point(), "mean: unsupported dtype ",
              dtype_name(self.dtype()));
  internal::CheckSameDevice("reduce", {&out, &self});
  EMBER_INTERNAL_ASSERT(out.dtype() == self.dtype() || out.dtype() == kInt64,
                        "reduce_out: output dtype ", dtype_name(out.dtype()), " for input dtype ",
                        dtype_name(self.dtype()));
  DeviceGuard guard(out.device());
  const std::string name(ReduceOpName(op));
  kernels::ReduceArgs args;
  args.op = static_cast<int>(op);
  args.dtype = DtypeCode(self.dtype());
  args.out_int64 = out.dtype() != self.dtype();
  const int64_t es = static_cast<int64_t>(self.element_size());
  // Kept dims: the output's shape (reduced dims have size 1 there).
  args.kept = internal::GeometryOf<2>(name.c_str(), out.sizes(), {out.strides(), self.strides()},
                                      {static_cast<int64_t>(out.element_size()), es});
  // Reduced dims: the input's sizes where the output has size 1.
  SizeVector reduced_sizes(self.sizes().begin(), self.sizes().end());
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (out.sizes()[d] != 1) reduced_sizes[d] = 1;
  }
  args.reduced = internal::GeometryOf<1>(name.c_str(), reduced_sizes, {self.strides()}, {es});
  args.out = Ptr(out);
  args.self = Ptr(self);
  args.sm_count = internal::SmCount(out.device());
  const size_t bytes = kernels::ReduceWorkspaceBytes(args);
  Tensor workspace;
  if (bytes > 0) workspace = EmptyTensor({static_cast<int64_t>(bytes)}, kUInt8, out.device());
  CheckLaunch(kernels::LaunchReduce(StreamOf(out.device()), args,
                                    bytes > 0 ? workspace.raw_data() : nullptr),
              "reduce kernel");
}

void ArgReduceOut(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& self,
                  int64_t dim) {
  EMBER_INTERNAL_ASSERT(op == ReduceOp::kArgmax || op == ReduceOp::kArgmin);
  if (values.numel() == 0) return;
  internal::CheckSameDevice(op == ReduceOp::kArgmax ? "max" : "min", {&values, &indices, &self});
  DeviceGuard guard(values.device());
  const int64_t es = static_cast<int64_t>(self.element_size());
  const auto kept = internal::GeometryOf<3>("max/min", values.sizes(),
                                            {values.strides(), indices.strides(), self.strides()},
                                            {es, int64_t{8}, es});
  CheckLaunch(
      kernels::LaunchArgReduce(StreamOf(values.device()), op == ReduceOp::kArgmax, kept,
                               Ptr(values), Ptr(indices), Ptr(self), DtypeCode(self.dtype()),
                               self.sizes()[dim], self.strides()[dim] * es),
      "max/min kernel");
}

void SoftmaxOut(const Tensor& out, const Tensor& self, int64_t dim, bool log) {
  if (out.numel() == 0) return;
  const char* name = log ? "log_softmax" : "softmax";
  EMBER_CHECK(self.is_floating_point(), name, ": expected a floating point tensor, got ",
              dtype_name(self.dtype()));
  internal::CheckSameDevice(name, {&out, &self});
  DeviceGuard guard(out.device());
  const int64_t es = static_cast<int64_t>(self.element_size());
  SizeVector rows(self.sizes().begin(), self.sizes().end());
  rows[dim] = 1;
  const auto g = internal::GeometryOf<2>(name, rows, {out.strides(), self.strides()}, {es, es});
  CheckLaunch(kernels::LaunchSoftmax(StreamOf(out.device()), g, Ptr(out), Ptr(self),
                                     DtypeCode(self.dtype()), self.sizes()[dim],
                                     out.strides()[dim] * es, self.strides()[dim] * es, log),
              "softmax kernel");
}

EMBER_REGISTER_KERNEL(reduce_out, kCUDA, &ReduceOut);
EMBER_REGISTER_KERNEL(arg_reduce_out, kCUDA, &ArgReduceOut);
EMBER_REGISTER_KERNEL(softmax_out, kCUDA, &SoftmaxOut);

}  // namespace
}  // namespace ember::cuda
