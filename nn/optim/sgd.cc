#include "nn/optim/sgd.h"

#include "autograd/grad_mode.h"
#include "nn/optim/state_util.h"
#include "tensor/error.h"

namespace ember::nn::optim {

void SGDOptions::Validate(const SGDOptions& o) {
  EMBER_CHECK(o.lr >= 0.0, "Invalid learning rate: ", o.lr);
  EMBER_CHECK(o.momentum >= 0.0, "Invalid momentum value: ", o.momentum);
  EMBER_CHECK(o.weight_decay >= 0.0, "Invalid weight_decay value: ", o.weight_decay);
  EMBER_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
              "Nesterov momentum requires a momentum and zero dampening (got momentum=",
              o.momentum, ", dampening=", o.dampening, ")");
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

void SGD::step() {
  autograd::NoGradGuard no_grad;
  ForEachParamWithGrad([](const Tensor& p, const Tensor& grad, const SGDOptions& o,
                          SGDState& state) {
    Tensor d = o.maximize ? grad.neg() : grad;
    if (o.weight_decay != 0.0) d = d.add(p, o.weight_decay);
    if (o.momentum != 0.0) {
      Tensor& buf = state.momentum_buffer;
      if (!buf.defined()) {
        buf = d.clone();
      } else {
        buf.mul_(o.momentum).add_(d, 1.0 - o.dampening);
      }
      d = o.nesterov ? d.add(buf, o.momentum) : buf;
    }
    p.add_(d, -o.lr);
  });
}

}  // namespace ember::nn::optim
