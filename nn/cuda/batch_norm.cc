// batch_norm's CUDA kernels (nn/batch_norm_kernels.h) through cuDNN's
// batch normalisation, for float32, float64, float16 and bfloat16: the input
// [N, C, *] is described as [N, C, S, 1] in CUDNN_BATCHNORM_SPATIAL mode
// (statistics per channel over N * S), which covers BatchNorm1d ([N, C] and
// [N, C, L]) and BatchNorm2d.
//
// Training: cudnnBatchNormalizationForwardTraining computes the batch
// statistics, normalises, updates the running statistics with the momentum
// (its exponential average factor; its running variance is the unbiased one,
// as torch's) and saves the mean and 1 / sqrt(var + eps) that
// cudnnBatchNormalizationBackward takes back. Eval: the running statistics
// through cudnnBatchNormalizationForwardInference; its backward has constant
// statistics, gx = g * weight * invstd with per-channel sums for weight and
// bias, which are tensor ops on the device (cuDNN's backward is for batch
// statistics only; Note [Eval backward in the parameter dtype]). cuDNN wants
// the scale, bias and statistics in the parameter dtype
// (internal::ParamDtype: the input's, float32 for float16 and bfloat16
// inputs), so an absent weight or bias is ones or zeros, weight and bias of
// another dtype go through converted copies (their gradients come back in
// their own dtype), and running statistics of another dtype (or not
// contiguous) go through a converted copy written back after the update.
// Both modes save the statistics in the parameter dtype: cuDNN's backward
// takes them so in training, and eval's backward computes in it.
//
// Note [Eval backward in the parameter dtype]
// With constant statistics, grad_weight = invstd * sum(g * (x - mean)) over
// a channel's N * S elements. Its terms are as large as g and x, and their
// sum is often much smaller (they cancel), so each term must not be
// rounded: with x - mean and g * (x - mean) formed in bfloat16 (8 bits),
// their roundings add up to errors of several percent of a small sum. So
// for float16 and bfloat16 inputs the eval backward converts g and x to
// float32 and computes x - mean, the products, the sums (float
// accumulation), weight * invstd and g * scale in float32 from float32
// statistics, rounding each gradient once to the input's dtype, as torch's
// batch_norm backward does in its float accumulation type. float32 and
// float64 inputs compute in their own dtype (no copies). The cost is
// float32 temporaries of g and x (4 bytes an element each) during the
// backward.
#include <cudnn.h>

#include <array>

#include "cuda/status.h"
#include "nn/batch_norm_kernels.h"
#include "nn/cuda/cudnn.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::cudnn {
namespace {

// The channel parameter `t` as cuDNN takes it (the parameter dtype for `x`,
// contiguous), or `fill` when `t` is undefined.
Tensor Param(const Tensor& t, const Tensor& x, double fill) {
  const Dtype dtype = internal::ParamDtype(x.dtype());
  if (!t.defined()) return full({x.size(1)}, fill, x.options().dtype(dtype));
  return t.to(dtype).contiguous();
}

std::array<Tensor, 3> BatchNormForwardCuda(const Tensor& x, const Tensor& weight,
                                           const Tensor& bias, const Tensor& running_mean,
                                           const Tensor& running_var, bool training,
                                           double momentum, double eps) {
  const char* op = "batch_norm";
  const cudnnDataType_t type = internal::DataType(x.dtype(), op);
  const Dtype param = internal::ParamDtype(x.dtype());
  DeviceGuard guard(x.device());
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / std::max<int64_t>(n * c, 1);
  Tensor out = empty(x.sizes(), x.options());
  if (!training) {
    // A copy: the saved statistics must not change with later updates.
    Tensor mean = running_mean.to(param).clone();
    Tensor var = running_var.to(param).contiguous();
    Tensor invstd = (var + eps).rsqrt();
    if (x.numel() > 0) {
      internal::TensorDescriptor xd, bnd;
      xd.Set(type, {n, c, s, 1}, op);
      EMBER_CUDA_CHECK(cudnnDeriveBNTensorDescriptor(bnd.get(), xd.get(), CUDNN_BATCHNORM_SPATIAL));
      internal::Scalars k(type);
      Tensor w = Param(weight, x, 1.0), b = Param(bias, x, 0.0);
      EMBER_CUDA_CHECK(cudnnBatchNormalizationForwardInference(
          internal::Handle(x.device()), CUDNN_BATCHNORM_SPATIAL, k.one(), k.zero(), xd.get(),
          x.raw_data(), xd.get(), out.raw_data(), bnd.get(), w.raw_data(), b.raw_data(),
          mean.raw_data(), var.raw_data(), eps));
    }
    return {out, mean, invstd};
  }
  // The layer has checked N * S > 1.
  const TensorOptions stats = x.options().dtype(param);
  Tensor mean = empty({c}, stats), invstd = empty({c}, stats);
  Tensor rm, rv;  // the running statistics cuDNN updates
  if (running_mean.defined()) {
    const bool direct = running_mean.dtype() == param && running_mean.is_contiguous() &&
                        running_var.dtype() == param && running_var.is_contiguous();
    rm = direct ? running_mean : running_mean.to(param).contiguous();
    rv = direct ? running_var : running_var.to(param).contiguous();
  }
  internal::TensorDescriptor xd, bnd;
  xd.Set(type, {n, c, s, 1}, op);
  EMBER_CUDA_CHECK(cudnnDeriveBNTensorDescriptor(bnd.get(), xd.get(), CUDNN_BATCHNORM_SPATIAL));
  internal::Scalars k(type);
  Tensor w = Param(weight, x, 1.0), b = Param(bias, x, 0.0);
  EMBER_CUDA_CHECK(cudnnBatchNormalizationForwardTraining(
      internal::Handle(x.device()), CUDNN_BATCHNORM_SPATIAL, k.one(), k.zero(), xd.get(),
      x.raw_data(), xd.get(), out.raw_data(), bnd.get(), w.raw_data(), b.raw_data(), momentum,
      rm.defined() ? rm.raw_data() : nullptr, rv.defined() ? rv.raw_data() : nullptr, eps,
      mean.raw_data(), invstd.raw_data()));
  if (rm.defined() && !rm.is_same(running_mean)) {
    running_mean.copy_(rm);
    running_var.copy_(rv);
  }
  return {out, mean, invstd};
}

std::array<Tensor, 3> BatchNormBackwardCuda(const Tensor& g, const Tensor& x, const Tensor& weight,
                                            const Tensor& mean, const Tensor& invstd, bool training,
                                            double eps, std::array<bool, 3> needs) {
  const char* op = "batch_norm backward";
  const cudnnDataType_t type = internal::DataType(x.dtype(), op);
  DeviceGuard guard(x.device());
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / std::max<int64_t>(n * c, 1);
  std::array<Tensor, 3> grads;
  if (!training || x.numel() == 0) {
    // Constant statistics: an affine map per channel, computed in the
    // parameter dtype (Note [Eval backward in the parameter dtype]).
    const Dtype param = internal::ParamDtype(x.dtype());
    const Tensor gp = g.view({n, c, s}).to(param);
    const Tensor is = invstd.to(param);
    if (needs[0]) {
      const Tensor scale = weight.defined() ? weight.to(param) * is : is;
      grads[0] = (gp * scale.view({1, c, 1})).to(x.dtype()).view(x.sizes());
    }
    if (needs[1] && weight.defined()) {
      // A new tensor (x itself is not written), multiplied in place.
      Tensor terms = x.view({n, c, s}).to(param) - mean.to(param).view({1, c, 1});
      terms.mul_(gp);
      grads[1] = (terms.sum({0, 2}) * is).to(x.dtype());
    }
    if (needs[2]) grads[2] = gp.sum({0, 2}).to(x.dtype());
    return grads;
  }
  internal::TensorDescriptor xd, bnd;
  xd.Set(type, {n, c, s, 1}, op);
  EMBER_CUDA_CHECK(cudnnDeriveBNTensorDescriptor(bnd.get(), xd.get(), CUDNN_BATCHNORM_SPATIAL));
  internal::Scalars k(type);
  Tensor w = Param(weight, x, 1.0);
  Tensor gx = empty(x.sizes(), x.options());
  const TensorOptions params = x.options().dtype(internal::ParamDtype(x.dtype()));
  Tensor gw = empty({c}, params), gb = empty({c}, params);
  EMBER_CUDA_CHECK(cudnnBatchNormalizationBackward(
      internal::Handle(x.device()), CUDNN_BATCHNORM_SPATIAL, k.one(), k.zero(), k.one(), k.zero(),
      xd.get(), x.raw_data(), xd.get(), g.raw_data(), xd.get(), gx.raw_data(), bnd.get(),
      w.raw_data(), gw.raw_data(), gb.raw_data(), eps, mean.raw_data(), invstd.raw_data()));
  // In the dtype of the weight and bias (the layer has checked they are x's).
  if (needs[0]) grads[0] = gx;
  if (needs[1] && weight.defined()) grads[1] = gw.to(x.dtype());
  if (needs[2]) grads[2] = gb.to(x.dtype());
  return grads;
}

EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::batch_norm_forward, DeviceType::kCUDA,
                         &BatchNormForwardCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::batch_norm_backward, DeviceType::kCUDA,
                         &BatchNormBackwardCuda);

}  // namespace
}  // namespace ember::nn::cudnn
