#include "nn/optim/adam.h"

#include "autograd/grad_mode.h"
#include "nn/optim/fused_kernels.h"
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
          {"maximize", o.maximize ? 1.0 : 0.0},
          {"capturable", o.capturable ? 1.0 : 0.0}};
}

template <typename O>
absl::Status AdamFromPairs(const std::vector<std::pair<std::string, double>>& pairs, O* o,
                           const char* name) {
  for (const auto& [k, v] : pairs) {
    using internal::Assign;
    if (!(Assign(k, v, "lr", &o->lr) || Assign(k, v, "beta1", &o->beta1) ||
          Assign(k, v, "beta2", &o->beta2) || Assign(k, v, "eps", &o->eps) ||
          Assign(k, v, "weight_decay", &o->weight_decay) || Assign(k, v, "amsgrad", &o->amsgrad) ||
          Assign(k, v, "maximize", &o->maximize) || Assign(k, v, "capturable", &o->capturable))) {
      return internal::UnknownOption(k, name);
    }
  }
  return absl::OkStatus();
}

// Steps every parameter of `groups` that has a gradient, in lists of one
// device, dtype and step count (Note [Fused optimizer steps] in
// fused_kernels.h). for_each(g, fn) calls fn(param, grad, state) for the
// parameters of group g that have a gradient; `decoupled` selects AdamW's
// weight decay.
// With capturable options, the step counts and learning rates go by tensor
// (Note [Capturable steps]): lr_tensor(g, device) is the group's; a bucket's
// step tensor is its first parameter's, whose count every parameter of the
// bucket shares.
template <typename Groups, typename ForEach, typename LrTensor>
void AdamSteps(const Groups& groups, ForEach for_each, LrTensor lr_tensor, bool decoupled) {
  struct Bucket {
    Device device;
    Dtype dtype;
    int64_t step;
    Tensor step_tensor;
    std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  };
  autograd::NoGradGuard no_grad;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = groups[g].options;
    std::vector<Bucket> buckets;
    for_each(g, [&](const Tensor& p, const Tensor& grad, AdamState& st) {
      const TensorOptions like_p = TensorOptions(p.dtype()).device(p.device());
      if (!st.exp_avg.defined()) {
        st.exp_avg = zeros(p.sizes(), like_p);
        st.exp_avg_sq = zeros(p.sizes(), like_p);
      }
      if (o.amsgrad && !st.max_exp_avg_sq.defined()) st.max_exp_avg_sq = zeros(p.sizes(), like_p);
      if (o.capturable) {
        if (!st.step_tensor.defined()) {
          st.step_tensor = full({1}, static_cast<double>(st.step),
                                TensorOptions(kFloat32).device(p.device()));
        }
        st.step_tensor.add_(1.0);
      }
      st.step += 1;
      Bucket* bucket = nullptr;
      for (Bucket& b : buckets) {
        if (b.device == p.device() && b.dtype == p.dtype() && b.step == st.step) bucket = &b;
      }
      if (bucket == nullptr) {
        bucket = &buckets.emplace_back(Bucket{p.device(), p.dtype(), st.step, st.step_tensor});
      }
      bucket->params.push_back(p);
      bucket->grads.push_back(grad);
      bucket->exp_avgs.push_back(st.exp_avg);
      bucket->exp_avg_sqs.push_back(st.exp_avg_sq);
      if (o.amsgrad) bucket->max_exp_avg_sqs.push_back(st.max_exp_avg_sq);
    });
    for (const Bucket& b : buckets) {
      const internal::AdamStepArgs args{.lr_tensor = o.capturable ? lr_tensor(g, b.device) : Tensor(),
                                        .step_tensor = o.capturable ? b.step_tensor : Tensor(),
                                        .lr = o.lr,
                                        .beta1 = o.beta1,
                                        .beta2 = o.beta2,
                                        .eps = o.eps,
                                        .weight_decay = o.weight_decay,
                                        .amsgrad = o.amsgrad,
                                        .maximize = o.maximize,
                                        .decoupled = decoupled,
                                        .step = b.step};
      internal::adam_step(b.device)(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs,
                                    b.max_exp_avg_sqs, args);
    }
  }
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
      // A capturable step's count is the device's (replays run no host code).
      {"step", step_tensor.defined() ? step_tensor.detach().cpu().reshape({})
                                     : scalar_tensor(static_cast<double>(step),
                                                     TensorOptions(kFloat32))},
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
      step_tensor = Tensor();  // a capturable step makes it again from `step`
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
  AdamSteps(
      param_groups(), [this](size_t g, auto fn) { ForEachParamWithGradOfGroup(g, fn); },
      [this](size_t g, Device d) { return lr_tensor(g, d); }, /*decoupled=*/false);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : OptimizerBase({ParamGroup{std::move(params), options}}) {}

void AdamW::step() {
  AdamSteps(
      param_groups(), [this](size_t g, auto fn) { ForEachParamWithGradOfGroup(g, fn); },
      [this](size_t g, Device d) { return lr_tensor(g, d); }, /*decoupled=*/true);
}

}  // namespace ember::nn::optim
