#include "nn/optim/grad_scaler.h"

#include <cmath>
#include <utility>

#include "autograd/grad_mode.h"
#include "nn/optim/grad_scaler_kernels.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::optim {
namespace {

void CheckOptions(const GradScalerOptions& o) {
  EMBER_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale),
              "GradScaler: init_scale must be a positive finite number, got ", o.init_scale);
  EMBER_CHECK(o.growth_factor > 1.0, "The growth factor must be > 1.0, got ", o.growth_factor);
  EMBER_CHECK(o.backoff_factor < 1.0 && o.backoff_factor > 0.0,
              "The backoff factor must be < 1.0 (and > 0), got ", o.backoff_factor);
  EMBER_CHECK(o.growth_interval > 0, "GradScaler: growth_interval must be > 0, got ",
              o.growth_interval);
}

}  // namespace

GradScaler::GradScaler(DeviceType device_type, GradScalerOptions options)
    : device_type_(device_type), options_(options), pending_scale_(options.init_scale) {
  if (options_.enabled) CheckOptions(options_);
}

void GradScaler::CheckScale(const char* call) const {
  EMBER_CHECK(scale_.defined(), "Attempted ", call,
              " but _scale is None.  This may indicate your script did not use "
              "scaler.scale(loss or outputs) earlier in the iteration.");
}

Tensor GradScaler::scale(const Tensor& outputs) {
  if (!options_.enabled) return outputs;
  EMBER_CHECK(outputs.defined() && outputs.is_floating_point(),
              "GradScaler.scale: expected a floating-point tensor (the loss), got ",
              outputs.defined() ? dtype_name(outputs.dtype()) : "an undefined tensor");
  EMBER_CHECK(outputs.device().type() == device_type_, "GradScaler.scale: the scaler is for ",
              DeviceTypeName(device_type_), " tensors, but outputs are on ",
              outputs.device().str(), "; construct GradScaler(DeviceType::k",
              outputs.is_cuda() ? "CUDA" : "CPU", ") for them");
  if (!scale_.defined()) {
    TensorOptions on = TensorOptions().device(outputs.device());
    scale_ = full({1}, pending_scale_, on.dtype(kFloat32));
    growth_tracker_ = full({1}, pending_tracker_, on.dtype(kInt32));
  }
  return outputs * scale_.to(outputs.device());
}

std::vector<Tensor> GradScaler::scale(const std::vector<Tensor>& outputs) {
  std::vector<Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const Tensor& t : outputs) scaled.push_back(scale(t));
  return scaled;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  CheckScale("unscale_");
  PerOptimizer& state = per_optimizer_[&optimizer];
  EMBER_CHECK(state.stage != Stage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update().");
  EMBER_CHECK(state.stage != Stage::kStepped, "unscale_() is being called after step().");
  autograd::NoGradGuard no_grad;
  // 1 / scale in float64, then float32 (torch's scale.double().reciprocal().float()).
  const Tensor inv_scale = scale_.to(kFloat64).reciprocal().to(kFloat32);
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    for (const Tensor& p : optimizer.params(g)) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      EMBER_CHECK(grad.dtype() != kFloat16, "Attempting to unscale FP16 gradients.");
      auto it = by_device.begin();
      while (it != by_device.end() && it->first != grad.device()) ++it;
      if (it == by_device.end()) {
        by_device.emplace_back(grad.device(), std::vector<Tensor>());
        it = by_device.end() - 1;
      }
      it->second.push_back(grad);
    }
  }
  std::vector<Tensor> found_infs;
  for (auto& [device, grads] : by_device) {
    Tensor found = zeros({1}, TensorOptions().dtype(kFloat32).device(device));
    internal::amp_unscale(device)(grads, found, inv_scale.to(device));
    found_infs.push_back(found);
  }
  reduce_found_inf(found_infs, scale_.device());
  state.found_inf_per_device = std::move(found_infs);
  state.stage = Stage::kUnscaled;
}

void GradScaler::reduce_found_inf(std::vector<Tensor>& /*found_infs*/, Device /*scale_device*/) {}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  CheckScale("step");
  PerOptimizer& state = per_optimizer_[&optimizer];
  EMBER_CHECK(state.stage != Stage::kStepped,
              "step() has already been called since the last update().");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  EMBER_CHECK(!state.found_inf_per_device.empty(),
              "No inf checks were recorded for this optimizer: none of its parameters has a "
              "gradient; call backward on the scaled loss first");
  double found = 0;
  for (const Tensor& f : state.found_inf_per_device) found += f.item<float>();
  const bool stepped = found == 0;
  if (stepped) optimizer.step();
  state.stage = Stage::kStepped;
  return stepped;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled) return;
  CheckScale("update");
  autograd::NoGradGuard no_grad;
  if (new_scale) {
    EMBER_CHECK(*new_scale > 0 && std::isfinite(*new_scale),
                "GradScaler.update: new_scale must be a positive finite number, got ", *new_scale);
    scale_.fill_(*new_scale);
  } else {
    Tensor found = zeros({1}, TensorOptions().dtype(kFloat32).device(scale_.device()));
    bool any = false;
    for (const auto& [opt, state] : per_optimizer_) {
      for (const Tensor& f : state.found_inf_per_device) {
        found.add_(f.to(scale_.device()));
        any = true;
      }
    }
    EMBER_CHECK(any, "No inf checks were recorded prior to update.");
    internal::amp_update_scale(scale_.device())(scale_, growth_tracker_, found,
                                                options_.growth_factor, options_.backoff_factor,
                                                options_.growth_interval);
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<float>() : pending_scale_;
}

void GradScaler::set_growth_factor(double growth_factor) {
  EMBER_CHECK(growth_factor > 1.0, "The growth factor must be > 1.0, got ", growth_factor);
  options_.growth_factor = growth_factor;
}

void GradScaler::set_backoff_factor(double backoff_factor) {
  EMBER_CHECK(backoff_factor < 1.0 && backoff_factor > 0.0,
              "The backoff factor must be < 1.0 (and > 0), got ", backoff_factor);
  options_.backoff_factor = backoff_factor;
}

void GradScaler::set_growth_interval(int64_t growth_interval) {
  EMBER_CHECK(growth_interval > 0, "GradScaler: growth_interval must be > 0, got ",
              growth_interval);
  options_.growth_interval = growth_interval;
}

std::optional<GradScalerState> GradScaler::state_dict() const {
  if (!options_.enabled) return std::nullopt;
  GradScalerState s;
  s.scale = get_scale();
  s.growth_factor = options_.growth_factor;
  s.backoff_factor = options_.backoff_factor;
  s.growth_interval = options_.growth_interval;
  s.growth_tracker = growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : pending_tracker_;
  return s;
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled) return;
  GradScalerOptions loaded = options_;
  loaded.init_scale = state.scale;
  loaded.growth_factor = state.growth_factor;
  loaded.backoff_factor = state.backoff_factor;
  loaded.growth_interval = state.growth_interval;
  CheckOptions(loaded);
  EMBER_CHECK(state.growth_tracker >= 0 && state.growth_tracker < state.growth_interval,
              "GradScaler.load_state_dict: _growth_tracker must be in [0, growth_interval), got ",
              state.growth_tracker);
  options_.growth_factor = state.growth_factor;
  options_.backoff_factor = state.backoff_factor;
  options_.growth_interval = state.growth_interval;
  pending_scale_ = state.scale;
  pending_tracker_ = state.growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(state.scale);
    growth_tracker_.fill_(state.growth_tracker);
  }
}

}  // namespace ember::nn::optim
