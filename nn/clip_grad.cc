#include "nn/clip_grad.h"

#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  EMBER_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    if (Tensor g = p.grad(); g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return zeros({});
  const bool inf = std::isinf(norm_type);
  double total = 0;
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    if (inf) {
      total = std::max(total, g.abs().max().item<double>());
    } else {
      total += std::pow(g.norm(norm_type).item<double>(), norm_type);
    }
  }
  if (!inf) total = std::pow(total, 1.0 / norm_type);
  EMBER_CHECK(!error_if_nonfinite || std::isfinite(total), "The total norm of order ", norm_type,
              " for gradients from `parameters` is non-finite, so it cannot be clipped. To "
              "disable this error and scale the gradients by the non-finite norm anyway, set "
              "`error_if_nonfinite=False`");
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (const Tensor& g : grads) g.mul_(coef);
  }
  return full({}, total, TensorOptions(grads[0].dtype()));
}

}  // namespace ember::nn
