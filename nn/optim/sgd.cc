#include "nn/optim/sgd.h"

#include "autograd/grad_mode.h"
#include "nn/optim/state_util.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"

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

// The update on contiguous CPU buffers of one floating dtype, in one pass
// (Note [Fused SGD]).
template <typename T>
void FusedSgd(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t n,
              const SGDOptions& o, bool first_step) {
  const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay);
  const T momentum = static_cast<T>(o.momentum), keep = static_cast<T>(1.0 - o.dampening);
  const T sign = o.maximize ? T(-1) : T(1);
  if (buf == nullptr && wd == T(0)) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * sign * g[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    T d = sign * g[i] + wd * p[i];
    if (buf != nullptr) {
      buf[i] = first_step ? d : momentum * buf[i] + keep * d;
      d = o.nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

bool CanFuse(const Tensor& p, const Tensor& g) {
  return p.is_cpu() && g.is_cpu() && p.is_contiguous() && g.is_contiguous() &&
         p.dtype() == g.dtype() && (p.dtype() == kFloat32 || p.dtype() == kFloat64) &&
         p.sizes() == g.sizes();
}

}  // namespace

// Note [Fused SGD]
// On the CPU with contiguous float32/float64 parameters and gradients (the
// common case) the whole update, weight decay and momentum included, is one
// loop over the elements; it computes exactly the formulas of the tensor-op
// path below (used for other devices and layouts), in the same order.
void SGD::step() {
  autograd::NoGradGuard no_grad;
  ForEachParamWithGrad(
      [](const Tensor& p, const Tensor& grad, const SGDOptions& o, SGDState& state) {
        if (CanFuse(p, grad)) {
          const bool first = o.momentum != 0.0 && !state.momentum_buffer.defined();
          if (first) state.momentum_buffer = empty_like(p);
          const Tensor& buf = state.momentum_buffer;
          const bool use_buf = o.momentum != 0.0 && buf.is_contiguous() && buf.dtype() == p.dtype();
          if (o.momentum == 0.0 || use_buf) {
            VisitFloatingDtype(p.dtype(), "SGD", [&]<typename T>() {
              if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
                FusedSgd<T>(p.data_ptr<T>(), grad.data_ptr<T>(),
                            use_buf ? buf.data_ptr<T>() : nullptr, p.numel(), o, first);
              }
            });
            BumpVersion(p);
            return;
          }
        }
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
