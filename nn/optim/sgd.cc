#include "nn/optim/sgd.h"

#include "autograd/grad_mode.h"
#include "nn/optim/fused_kernels.h"
#include "nn/optim/state_util.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::optim {

void SGDOptions::Validate(const SGDOptions& o) {
  EMBER_CHECK(o.lr >= 0.0, "Invalid learning rate: ", o.lr);
  EMBER_CHECK(o.momentum >= 0.0, "Invalid momentum value: ", o.momentum);
  EMBER_CHECK(o.weight_decay >= 0.0, "Invalid weight_decay value: ", o.weight_decay);
  EMBER_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
              "Nesterov momentum requires a momentum and zero dampening (got momentum=", o.momentum,
              ", dampening=", o.dampening, ")");
}

std::vector<std::pair<std::string, double>> SGDOptions::ToPairs() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

absl::Status SGDOptions::FromPairs(const std::vector<std::pair<std::string, double>>& pairs) {
  for (const auto& [k, v] : pairs) {
    using internal::Assign;
    if (!(Assign(k, v, "lr", &lr) || Assign(k, v, "momentum", &momentum) ||
          Assign(k, v, "dampening", &dampening) || Assign(k, v, "weight_decay", &weight_decay) ||
          Assign(k, v, "nesterov", &nesterov) || Assign(k, v, "maximize", &maximize))) {
      return internal::UnknownOption(k, "SGD");
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, Tensor>> SGDState::ToPairs() const {
  return {{"momentum_buffer", momentum_buffer}};
}

absl::Status SGDState::FromPairs(const std::vector<std::pair<std::string, Tensor>>& pairs,
                                 const Tensor& param) {
  for (const auto& [k, v] : pairs) {
    if (k != "momentum_buffer") return internal::UnknownOption(k, "SGD state");
    absl::Status s = internal::LoadStateTensor(k, v, param, &momentum_buffer);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : OptimizerBase({ParamGroup{std::move(params), options}}) {}

namespace {

// The parameters of one group that one kernel call steps: one device, one
// dtype, and whether their momentum buffers are new.
struct Bucket {
  Device device;
  Dtype dtype;
  bool first_step;
  std::vector<Tensor> params, grads, buffers;
};

}  // namespace

// Gathers each group's parameters into lists for the device kernels (Note
// [Fused optimizer steps] in fused_kernels.h).
void SGD::step() {
  autograd::NoGradGuard no_grad;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const SGDOptions& o = param_groups()[g].options;
    std::vector<Bucket> buckets;
    ForEachParamWithGradOfGroup(g, [&](const Tensor& p, const Tensor& grad, SGDState& state) {
      const bool first = o.momentum != 0.0 && !state.momentum_buffer.defined();
      if (first) {
        state.momentum_buffer = empty(p.sizes(), TensorOptions(p.dtype()).device(p.device()));
      }
      Bucket* bucket = nullptr;
      for (Bucket& b : buckets) {
        if (b.device == p.device() && b.dtype == p.dtype() && b.first_step == first) bucket = &b;
      }
      if (bucket == nullptr) bucket = &buckets.emplace_back(Bucket{p.device(), p.dtype(), first});
      bucket->params.push_back(p);
      bucket->grads.push_back(grad);
      if (o.momentum != 0.0) bucket->buffers.push_back(state.momentum_buffer);
    });
    for (const Bucket& b : buckets) {
      const internal::SgdStepArgs args{.lr_tensor = o.capturable ? lr_tensor(g, b.device) : Tensor(),
                                       .lr = o.lr,
                                       .momentum = o.momentum,
                                       .dampening = o.dampening,
                                       .weight_decay = o.weight_decay,
                                       .nesterov = o.nesterov,
                                       .maximize = o.maximize,
                                       .first_step = b.first_step};
      internal::sgd_step(b.device)(b.params, b.grads, b.buffers, args);
    }
  }
}

}  // namespace ember::nn::optim
