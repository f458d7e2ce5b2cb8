#include "nn/optim/adam.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "nn/optim/state_util.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/scalar.h"

namespace ember::nn::optim {
namespace {

template <typename O>
void ValidateAdam(const O& o) {
  EMBER_CHECK(o.lr >= 0.0, "Invalid learning rate: ", o.lr);
  EMBER_CHECK(o.eps >= 0.0, "Invalid epsilon value: ", o.eps);
  EMBER_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "Invalid beta parameter at index 0: ", o.beta1);
  EMBER_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "Invalid beta parameter at index 1: ", o.beta2);
  EMBER_CHECK(o.weight_decay >= 0.0, "Invalid weight_decay value: ", o.weight_decay);
}

template <typename O>
std::vector<std::pair<std::string, double>> AdamPairs(const O& o) {
  return {{"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

template <typename O>
absl::Status AdamFromPairs(const std::vector<std::pair<std::string, double>>& pairs, O* o,
                           const char* name) {
  for (const auto& [k, v] : pairs) {
    using internal::Assign;
    if (!(Assign(k, v, "lr", &o->lr) || Assign(k, v, "beta1", &o->beta1) ||
          Assign(k, v, "beta2", &o->beta2) || Assign(k, v, "eps", &o->eps) ||
          Assign(k, v, "weight_decay", &o->weight_decay) || Assign(k, v, "amsgrad", &o->amsgrad) ||
          Assign(k, v, "maximize", &o->maximize))) {
      return internal::UnknownOption(k, name);
    }
  }
  return absl::OkStatus();
}

// One Adam update of `p`; `decoupled` selects AdamW's weight decay.
template <typename O>
void AdamUpdate(const Tensor& p, const Tensor& grad_in, const O& o, AdamState& st, bool decoupled) {
  if (!st.exp_avg.defined()) {
    st.exp_avg = zeros_like(p);
    st.exp_avg_sq = zeros_like(p);
    if (o.amsgrad) st.max_exp_avg_sq = zeros_like(p);
  }
  st.step += 1;
  Tensor grad = o.maximize ? grad_in.neg() : grad_in;
  if (o.weight_decay != 0.0) {
    if (decoupled) {
      p.mul_(1.0 - o.lr * o.weight_decay);
    } else {
      grad = grad.add(p, o.weight_decay);
    }
  }
  st.exp_avg.mul_(o.beta1).add_(grad, 1.0 - o.beta1);
  st.exp_avg_sq.mul_(o.beta2).add_(grad * grad, 1.0 - o.beta2);
  const double t = static_cast<double>(st.step);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  Tensor second = st.exp_avg_sq;
  if (o.amsgrad) {
    st.max_exp_avg_sq.copy_(maximum(st.max_exp_avg_sq, st.exp_avg_sq));
    second = st.max_exp_avg_sq;
  }
  Tensor denom = (second.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
  p.add_(st.exp_avg / denom, -o.lr / bias_correction1);
}

}  // namespace

void AdamOptions::Validate(const AdamOptions& o) { ValidateAdam(o); }
std::vector<std::pair<std::string, double>> AdamOptions::ToPairs() const {
  return AdamPairs(*this);
}
absl::Status AdamOptions::FromPairs(const std::vector<std::pair<std::string, double>>& pairs) {
  return AdamFromPairs(pairs, this, "Adam");
}

void AdamWOptions::Validate(const AdamWOptions& o) { ValidateAdam(o); }
std::vector<std::pair<std::string, double>> AdamWOptions::ToPairs() const {
  return AdamPairs(*this);
}
absl::Status AdamWOptions::FromPairs(const std::vector<std::pair<std::string, double>>& pairs) {
  return AdamFromPairs(pairs, this, "AdamW");
}

std::vector<std::pair<std::string, Tensor>> AdamState::ToPairs() const {
  std::vector<std::pair<std::string, Tensor>> out = {
      {"step", scalar_tensor(static_cast<double>(step), TensorOptions(kFloat32))},
      {"exp_avg", exp_avg},
      {"exp_avg_sq", exp_avg_sq}};
  if (max_exp_avg_sq.defined()) out.emplace_back("max_exp_avg_sq", max_exp_avg_sq);
  return out;
}

absl::Status AdamState::FromPairs(const std::vector<std::pair<std::string, Tensor>>& pairs,
                                  const Tensor& param) {
  for (const auto& [k, v] : pairs) {
    absl::Status s = absl::OkStatus();
    if (k == "step") {
      if (!v.defined() || v.numel() != 1) {
        return absl::InvalidArgumentError(
            "loaded Adam state \"step\" must be a one-element tensor");
      }
      step = static_cast<int64_t>(v.item<double>());
    } else if (k == "exp_avg") {
      s = internal::LoadStateTensor(k, v, param, &exp_avg);
    } else if (k == "exp_avg_sq") {
      s = internal::LoadStateTensor(k, v, param, &exp_avg_sq);
    } else if (k == "max_exp_avg_sq") {
      s = internal::LoadStateTensor(k, v, param, &max_exp_avg_sq);
    } else {
      return internal::UnknownOption(k, "Adam state");
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : OptimizerBase({ParamGroup{std::move(params), options}}) {}

void Adam::step() {
  autograd::NoGradGuard no_grad;
  ForEachParamWithGrad([](const Tensor& p, const Tensor& g, const AdamOptions& o, AdamState& st) {
    AdamUpdate(p, g, o, st, /*decoupled=*/false);
  });
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : OptimizerBase({ParamGroup{std::move(params), options}}) {}

void AdamW::step() {
  autograd::NoGradGuard no_grad;
  ForEachParamWithGrad([](const Tensor& p, const Tensor& g, const AdamWOptions& o, AdamState& st) {
    AdamUpdate(p, g, o, st, /*decoupled=*/true);
  });
}

}  // namespace ember::nn::optim
