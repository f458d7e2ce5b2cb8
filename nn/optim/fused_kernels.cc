// The optimizers' step slots, their tensor-op formulas and their CPU kernels
// (Note [Fused optimizer steps] in fused_kernels.h).
#include "nn/optim/fused_kernels.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

namespace ember::nn::optim::internal {

constinit ::ember::nn::internal::DeviceKernel<SgdStepFn> sgd_step{"SGD step"};
constinit ::ember::nn::internal::DeviceKernel<AdamStepFn> adam_step{"Adam step"};

void CheckStepLists(const char* op, const std::vector<Tensor>& params,
                    std::initializer_list<const std::vector<Tensor>*> others) {
  if (params.empty()) return;
  const Device device = params[0].device();
  for (const std::vector<Tensor>* list : others) {
    EMBER_CHECK(list->empty() || list->size() == params.size(), op, ": a list of ", list->size(),
                " state tensors for ", params.size(), " parameters");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EMBER_CHECK(params[i].device() == device, op, ": parameter ", i, " is on ",
                params[i].device().str(), " but parameter 0 on ", device.str(),
                "; a step's lists share one device");
    for (const std::vector<Tensor>* list : others) {
      if (list->empty()) continue;
      const Tensor& t = (*list)[i];
      EMBER_CHECK(t.defined() && t.device() == device, op, ": the state or gradient of parameter ",
                  i, " is ", t.defined() ? "on " + t.device().str() : std::string("undefined"),
                  ", expected ", device.str(),
                  " (the parameter's device; move gradients and state with the model)");
    }
  }
}

// Note [16-bit optimizer math]
// float16 and bfloat16 parameters step in float32, as PyTorch's optimizers
// do (opmath): the parameter, gradient and states are read as float32, the
// update runs there, and each result is rounded once, as it is stored. In
// float16 itself Adam's eps (1e-8) rounds to 0, and a second moment that
// underflows (a gradient under about 0.005) then divides by zero: inf, then
// NaN. The CUDA kernels compute the same way (nn/cuda/optim_kernels.cu).
namespace {
bool IsSixteenBit(const Tensor& t) { return t.dtype() == kFloat16 || t.dtype() == kBFloat16; }
Tensor AsFloat32(const Tensor& t) { return t.defined() ? t.to(kFloat32) : t; }
void StoreBack(const Tensor& dst, const Tensor& src) {
  if (dst.defined() && !src.is_same(dst)) dst.copy_(src);
}
}  // namespace

void SgdStepWithTensorOps(const Tensor& p, const Tensor& grad, const Tensor& buf,
                          const SgdStepArgs& a) {
  if (IsSixteenBit(p)) {
    const Tensor p32 = AsFloat32(p), buf32 = AsFloat32(buf);
    SgdStepWithTensorOps(p32, AsFloat32(grad), buf32, a);
    StoreBack(p, p32);
    StoreBack(buf, buf32);
    return;
  }
  Tensor d = a.maximize ? grad.neg() : grad;
  if (a.weight_decay != 0.0) d = d.add(p, a.weight_decay);
  if (a.momentum != 0.0) {
    if (a.first_step) {
      buf.copy_(d);
    } else {
      buf.mul_(a.momentum).add_(d, 1.0 - a.dampening);
    }
    d = a.nesterov ? d.add(buf, a.momentum) : buf;
  }
  if (a.lr_tensor.defined()) {  // Note [Capturable steps]
    p.sub_(d * a.lr_tensor.to(p.dtype()));
  } else {
    p.add_(d, -a.lr);
  }
}

namespace {

// Adam's formulas with the learning rate and the step count read from
// tensors on the parameter's device (Note [Capturable steps]).
void AdamStepWithDeviceScalars(const Tensor& p, Tensor grad, const Tensor& exp_avg,
                               const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq,
                               const AdamStepArgs& a) {
  const TensorOptions on = TensorOptions(p.dtype()).device(p.device());
  const Tensor lr = a.lr_tensor.defined() ? a.lr_tensor.to(p.dtype()) : full({1}, a.lr, on);
  const Tensor step = a.step_tensor.defined() ? a.step_tensor.to(p.dtype())
                                              : full({1}, static_cast<double>(a.step), on);
  if (a.weight_decay != 0.0) {
    if (a.decoupled) {
      p.mul_(1.0 - lr * a.weight_decay);
    } else {
      grad = grad.add(p, a.weight_decay);
    }
  }
  exp_avg.mul_(a.beta1).add_(grad, 1.0 - a.beta1);
  exp_avg_sq.mul_(a.beta2).add_(grad * grad, 1.0 - a.beta2);
  const Tensor bias_correction1 = 1.0 - full({1}, a.beta1, on).pow(step);
  const Tensor bias_correction2_sqrt = (1.0 - full({1}, a.beta2, on).pow(step)).sqrt();
  Tensor second = exp_avg_sq;
  if (a.amsgrad) {
    max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq));
    second = max_exp_avg_sq;
  }
  const Tensor denom = (second.sqrt() / bias_correction2_sqrt).add_(a.eps);
  p.sub_(exp_avg / denom * (lr / bias_correction1));
}

}  // namespace

void AdamStepWithTensorOps(const Tensor& p, const Tensor& grad_in, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq,
                           const AdamStepArgs& a) {
  if (IsSixteenBit(p)) {  // Note [16-bit optimizer math]
    const Tensor p32 = AsFloat32(p), m32 = AsFloat32(exp_avg), v32 = AsFloat32(exp_avg_sq),
                 vmax32 = AsFloat32(max_exp_avg_sq);
    AdamStepWithTensorOps(p32, AsFloat32(grad_in), m32, v32, vmax32, a);
    StoreBack(p, p32);
    StoreBack(exp_avg, m32);
    StoreBack(exp_avg_sq, v32);
    StoreBack(max_exp_avg_sq, vmax32);
    return;
  }
  Tensor grad = a.maximize ? grad_in.neg() : grad_in;
  if (a.lr_tensor.defined() || a.step_tensor.defined()) {
    AdamStepWithDeviceScalars(p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, a);
    return;
  }
  if (a.weight_decay != 0.0) {
    if (a.decoupled) {
      p.mul_(1.0 - a.lr * a.weight_decay);
    } else {
      grad = grad.add(p, a.weight_decay);
    }
  }
  exp_avg.mul_(a.beta1).add_(grad, 1.0 - a.beta1);
  exp_avg_sq.mul_(a.beta2).add_(grad * grad, 1.0 - a.beta2);
  const double t = static_cast<double>(a.step);
  const double bias_correction1 = 1.0 - std::pow(a.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(a.beta2, t);
  Tensor second = exp_avg_sq;
  if (a.amsgrad) {
    max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq));
    second = max_exp_avg_sq;
  }
  Tensor denom = (second.sqrt() / std::sqrt(bias_correction2)).add_(a.eps);
  p.add_(exp_avg / denom, -a.lr / bias_correction1);
}

namespace {

// Note [Fused SGD]
// On the CPU with contiguous float32/float64 parameters, gradients and
// buffers (the common case) the whole update, weight decay and momentum
// included, is one loop over the elements, split across Ember's threads; it
// computes exactly the formulas of SgdStepWithTensorOps, in the same order.
template <typename T>
void FusedSgd(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t n,
              const SgdStepArgs& a) {
  const T lr = static_cast<T>(a.lr), wd = static_cast<T>(a.weight_decay);
  const T momentum = static_cast<T>(a.momentum), keep = static_cast<T>(1.0 - a.dampening);
  const T sign = a.maximize ? T(-1) : T(1);
  if (buf == nullptr && wd == T(0)) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * sign * g[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    T d = sign * g[i] + wd * p[i];
    if (buf != nullptr) {
      buf[i] = a.first_step ? d : momentum * buf[i] + keep * d;
      d = a.nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

bool CanFuseOnCpu(const Tensor& p, const Tensor& g, const Tensor* buf) {
  auto dense_like_p = [&](const Tensor& t) {
    return t.is_cpu() && t.is_contiguous() && t.dtype() == p.dtype() && t.sizes() == p.sizes();
  };
  return p.is_cpu() && p.is_contiguous() && (p.dtype() == kFloat32 || p.dtype() == kFloat64) &&
         dense_like_p(g) && (buf == nullptr || dense_like_p(*buf));
}

// The CPU reads capturable scalars once per call (Note [Capturable steps]).
SgdStepArgs OnHost(SgdStepArgs a) {
  if (a.lr_tensor.defined()) a.lr = a.lr_tensor.item<double>();
  a.lr_tensor = Tensor();
  return a;
}
AdamStepArgs OnHost(AdamStepArgs a) {
  if (a.lr_tensor.defined()) a.lr = a.lr_tensor.item<double>();
  if (a.step_tensor.defined()) a.step = static_cast<int64_t>(a.step_tensor.item<double>());
  a.lr_tensor = Tensor();
  a.step_tensor = Tensor();
  return a;
}

void SgdStepCpu(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& bufs, const SgdStepArgs& args) {
  const SgdStepArgs a = OnHost(args);
  CheckStepLists("SGD step", params, {&grads, &bufs});
  const bool momentum = a.momentum != 0.0;
  EMBER_CHECK(!momentum || bufs.size() == params.size(),
              "SGD step: momentum needs a buffer per parameter");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Tensor& g = grads[i];
    const Tensor* buf = momentum ? &bufs[i] : nullptr;
    if (!CanFuseOnCpu(p, g, buf)) {
      SgdStepWithTensorOps(p, g, momentum ? bufs[i] : Tensor(), a);
      continue;
    }
    VisitFloatingDtype(p.dtype(), "SGD", [&]<typename T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        T* pp = p.data_ptr<T>();
        const T* pg = g.data_ptr<T>();
        T* pb = buf ? buf->data_ptr<T>() : nullptr;
        parallel_for(0, p.numel(), kDefaultGrainSize, [&](int64_t begin, int64_t end) {
          FusedSgd<T>(pp + begin, pg + begin, pb ? pb + begin : nullptr, end - begin, a);
        });
      }
    });
    BumpVersion(p);
    if (buf) BumpVersion(*buf);
  }
}

void AdamStepCpu(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                 const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepArgs& args) {
  const AdamStepArgs a = OnHost(args);
  CheckStepLists("Adam step", params, {&grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs});
  EMBER_CHECK(!a.amsgrad || max_exp_avg_sqs.size() == params.size(),
              "Adam step: amsgrad needs max_exp_avg_sq per parameter");
  for (size_t i = 0; i < params.size(); ++i) {
    AdamStepWithTensorOps(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i],
                          a.amsgrad ? max_exp_avg_sqs[i] : Tensor(), a);
  }
}

EMBER_REGISTER_NN_KERNEL(sgd_step, DeviceType::kCPU, &SgdStepCpu);
EMBER_REGISTER_NN_KERNEL(adam_step, DeviceType::kCPU, &AdamStepCpu);

}  // namespace
}  // namespace ember::nn::optim::internal
