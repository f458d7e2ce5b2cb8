// The CUDA kernels of nn/optim's sgd_step and adam_step slots (Note [Fused
// optimizer steps] in nn/optim/fused_kernels.h) and of GradScaler's
// amp_unscale and amp_update_scale (grad_scaler_kernels.h): the tensors that fuse
// (contiguous, and gradient and states of the parameter's dtype, one of
// float32, float64, float16, bfloat16) are stepped per dtype by a few
// multi-tensor launches on the current stream (optim_kernels.cu); any other
// tensor through the tensor-op formulas, on the device as well.
#include "nn/cuda/optim_kernels.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <vector>

#include "cuda/kernels.h"
#include "nn/device_kernels.h"
#include "nn/optim/fused_kernels.h"
#include "nn/optim/grad_scaler_kernels.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace ember::nn::cuda {
namespace {

std::atomic<int64_t> launch_count{0};

}  // namespace

int64_t kernels::StepLaunchCount() { return launch_count.load(std::memory_order_relaxed); }

namespace {

using optim::internal::AdamStepArgs;
using optim::internal::SgdStepArgs;

std::optional<int> StepDtypeOf(Dtype dtype) {
  switch (dtype) {
    case kFloat32:
      return kernels::kStepFloat32;
    case kFloat64:
      return kernels::kStepFloat64;
    case kFloat16:
      return kernels::kStepFloat16;
    case kBFloat16:
      return kernels::kStepBFloat16;
    default:
      return std::nullopt;
  }
}

// Whether parameter i fuses: itself and every defined tensor of `lists` at i
// contiguous, of its dtype and shape.
bool Fuses(const Tensor& p, std::initializer_list<const std::vector<Tensor>*> lists, size_t i) {
  if (!p.is_contiguous() || !StepDtypeOf(p.dtype())) return false;
  for (const std::vector<Tensor>* list : lists) {
    if (list->empty()) continue;
    const Tensor& t = (*list)[i];
    if (!t.is_contiguous() || t.dtype() != p.dtype() || t.sizes() != p.sizes()) return false;
  }
  return true;
}

// A capturable step's scalar (Note [Capturable steps]): its float32 value's
// address on `device`, or null when undefined.
const float* DeviceScalar(const Tensor& t, Device device, const char* what) {
  if (!t.defined()) return nullptr;
  EMBER_CHECK(t.dtype() == kFloat32 && t.numel() == 1 && t.device() == device, "optimizer step: ",
              what, " must be a float32 one-element tensor on ", device.str(), ", got ",
              dtype_name(t.dtype()), " with ", t.numel(), " elements on ", t.device().str());
  return t.data_ptr<float>();
}

// The lists of one dtype's fusing tensors, as the launchers take them.
struct PointerLists {
  std::vector<void*> lists[5];
  std::vector<int64_t> numels;
  std::vector<Tensor> written;  // to bump versions

  // The parameter first, its gradient second (read only), then its states.
  void Add(std::initializer_list<const Tensor*> tensors) {
    int k = 0;
    for (const Tensor* t : tensors) {
      lists[k].push_back(t->defined() ? t->raw_data() : nullptr);
      if (k != 1 && t->defined()) written.push_back(*t);
      ++k;
    }
    numels.push_back(tensors.begin()[0]->numel());
  }
  void* const* Data(int k) { return lists[k].empty() ? nullptr : lists[k].data(); }
};

void SgdStepCuda(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& bufs, const SgdStepArgs& a) {
  optim::internal::CheckStepLists("SGD step", params, {&grads, &bufs});
  if (params.empty()) return;
  const bool momentum = a.momentum != 0.0;
  EMBER_CHECK(!momentum || bufs.size() == params.size(),
              "SGD step: momentum needs a buffer per parameter");
  const Device device = params[0].device();
  DeviceGuard guard(device);
  std::vector<PointerLists> by_dtype(4);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor none;
    const Tensor& buf = momentum ? bufs[i] : none;
    if (!Fuses(params[i], {&grads, &bufs}, i)) {
      optim::internal::SgdStepWithTensorOps(params[i], grads[i], buf, a);
      continue;
    }
    by_dtype[*StepDtypeOf(params[i].dtype())].Add({&params[i], &grads[i], &buf});
  }
  const kernels::SgdScalars s{.lr_ptr = DeviceScalar(a.lr_tensor, device, "lr_tensor"),
                              .lr = a.lr,
                              .momentum = a.momentum,
                              .dampening = a.dampening,
                              .weight_decay = a.weight_decay,
                              .nesterov = a.nesterov,
                              .maximize = a.maximize,
                              .first_step = a.first_step};
  const cudaStream_t stream = ember::cuda::internal::StreamOf(device);
  for (int dtype = 0; dtype < 4; ++dtype) {
    PointerLists& l = by_dtype[dtype];
    if (l.numels.empty()) continue;
    int launches = 0;
    ember::cuda::internal::CheckLaunch(
        kernels::LaunchSgdStep(stream, dtype, static_cast<int64_t>(l.numels.size()), l.Data(0),
                               l.Data(1), momentum ? l.Data(2) : nullptr, l.numels.data(), s,
                               &launches),
        "SGD step kernel");
    launch_count.fetch_add(launches, std::memory_order_relaxed);
    for (const Tensor& t : l.written) BumpVersion(t);
  }
}

void AdamStepCuda(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                  const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepArgs& a) {
  optim::internal::CheckStepLists("Adam step", params,
                                  {&grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs});
  if (params.empty()) return;
  EMBER_CHECK(exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size(),
              "Adam step: exp_avg and exp_avg_sq are needed per parameter");
  EMBER_CHECK(!a.amsgrad || max_exp_avg_sqs.size() == params.size(),
              "Adam step: amsgrad needs max_exp_avg_sq per parameter");
  const Device device = params[0].device();
  DeviceGuard guard(device);
  std::vector<PointerLists> by_dtype(4);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor none;
    const Tensor& vmax = a.amsgrad ? max_exp_avg_sqs[i] : none;
    if (!Fuses(params[i], {&grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs}, i)) {
      optim::internal::AdamStepWithTensorOps(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i],
                                             vmax, a);
      continue;
    }
    by_dtype[*StepDtypeOf(params[i].dtype())].Add(
        {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i], &vmax});
  }
  EMBER_CHECK(a.lr_tensor.defined() == a.step_tensor.defined(),
              "Adam step: a capturable step passes both lr_tensor and step_tensor");
  const double t = static_cast<double>(a.step);
  const kernels::AdamScalars s{
      .lr_ptr = DeviceScalar(a.lr_tensor, device, "lr_tensor"),
      .step_ptr = DeviceScalar(a.step_tensor, device, "step_tensor"),
      .lr = a.lr,
      .beta1 = a.beta1,
      .beta2 = a.beta2,
      .eps = a.eps,
      .weight_decay = a.weight_decay,
      .step_size = a.lr / (1.0 - std::pow(a.beta1, t)),
      .bias_correction2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, t)),
      .amsgrad = a.amsgrad,
      .maximize = a.maximize,
      .decoupled = a.decoupled};
  const cudaStream_t stream = ember::cuda::internal::StreamOf(device);
  for (int dtype = 0; dtype < 4; ++dtype) {
    PointerLists& l = by_dtype[dtype];
    if (l.numels.empty()) continue;
    int launches = 0;
    ember::cuda::internal::CheckLaunch(
        kernels::LaunchAdamStep(stream, dtype, static_cast<int64_t>(l.numels.size()), l.Data(0),
                                l.Data(1), l.Data(2), l.Data(3), a.amsgrad ? l.Data(4) : nullptr,
                                l.numels.data(), s, &launches),
        "Adam step kernel");
    launch_count.fetch_add(launches, std::memory_order_relaxed);
    for (const Tensor& t : l.written) BumpVersion(t);
  }
}

// GradScaler's unscale: contiguous gradients by multi-tensor launches per
// dtype; another layout through a contiguous copy, written back.
void AmpUnscaleCuda(const std::vector<Tensor>& grads, const Tensor& found_inf,
                    const Tensor& inv_scale) {
  if (grads.empty()) return;
  const Device device = grads[0].device();
  DeviceGuard guard(device);
  EMBER_CHECK(found_inf.device() == device && inv_scale.device() == device &&
                  found_inf.dtype() == kFloat32 && inv_scale.dtype() == kFloat32,
              "GradScaler unscale: found_inf and inv_scale must be float32 on ", device.str());
  std::vector<PointerLists> by_dtype(4);
  std::vector<std::pair<Tensor, Tensor>> copies;  // (gradient, its contiguous copy)
  for (const Tensor& grad : grads) {
    EMBER_CHECK(grad.device() == device, "GradScaler unscale: gradients on ", device.str(),
                " and ", grad.device().str(), " in one list");
    const std::optional<int> dtype = StepDtypeOf(grad.dtype());
    EMBER_CHECK(dtype.has_value(), "GradScaler: gradients must be floating point, got ",
                dtype_name(grad.dtype()));
    Tensor g = grad;
    if (!grad.is_contiguous()) {
      g = grad.contiguous();
      copies.emplace_back(grad, g);
    }
    const Tensor none;
    by_dtype[*dtype].Add({&g, &none});
  }
  const cudaStream_t stream = ember::cuda::internal::StreamOf(device);
  for (int dtype = 0; dtype < 4; ++dtype) {
    PointerLists& l = by_dtype[dtype];
    if (l.numels.empty()) continue;
    int launches = 0;
    ember::cuda::internal::CheckLaunch(
        kernels::LaunchAmpUnscale(stream, dtype, static_cast<int64_t>(l.numels.size()),
                                  l.Data(0), l.numels.data(), found_inf.data_ptr<float>(),
                                  inv_scale.data_ptr<float>(), &launches),
        "GradScaler unscale kernel");
    for (const Tensor& t : l.written) BumpVersion(t);
  }
  for (auto& [grad, copy] : copies) grad.copy_(copy);
}

void AmpUpdateScaleCuda(const Tensor& scale, const Tensor& growth_tracker,
                        const Tensor& found_inf, double growth_factor, double backoff_factor,
                        int64_t growth_interval) {
  DeviceGuard guard(scale.device());
  ember::cuda::internal::CheckLaunch(
      kernels::LaunchAmpUpdateScale(ember::cuda::internal::StreamOf(scale.device()),
                                    scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
                                    found_inf.data_ptr<float>(), growth_factor, backoff_factor,
                                    growth_interval),
      "GradScaler update kernel");
  BumpVersion(scale);
  BumpVersion(growth_tracker);
}

EMBER_REGISTER_NN_KERNEL(optim::internal::amp_unscale, DeviceType::kCUDA, &AmpUnscaleCuda);
EMBER_REGISTER_NN_KERNEL(optim::internal::amp_update_scale, DeviceType::kCUDA,
                         &AmpUpdateScaleCuda);
EMBER_REGISTER_NN_KERNEL(optim::internal::sgd_step, DeviceType::kCUDA, &SgdStepCuda);
EMBER_REGISTER_NN_KERNEL(optim::internal::adam_step, DeviceType::kCUDA, &AdamStepCuda);

}  // namespace
}  // namespace ember::nn::cuda
