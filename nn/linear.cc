#include "nn/linear.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;

// x [n, in] @ w^T [in, out] (+ b) with an explicit backward.
struct LinearFunction : autograd::Function<LinearFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& b) {
    ctx->save_for_backward({x, w});
    return b.defined() ? addmm(b, x, w.t()) : x.mm(w.t());
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    const Tensor& g = grad_outputs[0];
    std::vector<Tensor> saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    Tensor gx, gw, gb;
    if (g.defined()) {
      if (ctx->needs_input_grad(0)) gx = g.mm(w);
      const bool need_w = ctx->needs_input_grad(1), need_b = ctx->needs_input_grad(2);
      if (need_w && need_b && !autograd::GradMode::is_enabled() && g.numel() > 0 &&
          g.is_floating_point()) {
        // The weight's g^T x and the bias's column sums of g in one call
        // (one GEMM with cuBLASLt's bias-gradient epilogue on CUDA, Note
        // [Bias epilogue]). Under create_graph the recorded ops below run.
        gw = empty(w.sizes(), w.options());
        gb = empty({w.size(0)}, w.options());
        ops::gemm_bias_grad_out(gw, gb, g.t(), x, /*of_a=*/true);
      } else {
        if (need_w) gw = g.t().mm(x);
        if (need_b) gb = g.sum(/*dims=*/{0});
      }
    }
    return {gx, gw, gb};
  }
};

}  // namespace

namespace functional {

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  if (auto cast = ember::internal::MaybeAutocast("linear", linear, input, weight, bias)) {
    return *std::move(cast);
  }
  EMBER_CHECK(input.defined() && weight.defined(), "linear: input and weight must be defined");
  EMBER_CHECK(weight.dim() == 2,
              "linear: expected a 2-D weight [out_features, in_features], got "
              "shape ",
              ShapeToString(weight.sizes()));
  EMBER_CHECK(input.dim() >= 1,
              "linear: expected an input with at least 1 dim, got a 0-dim tensor");
  const int64_t in = weight.size(1), out = weight.size(0);
  EMBER_CHECK(input.size(-1) == in, "linear: the input's last dim (", input.size(-1),
              ") doesn't match in_features (", in, "): input shape ", ShapeToString(input.sizes()),
              ", weight shape ", ShapeToString(weight.sizes()));
  EMBER_CHECK(input.dtype() == weight.dtype(),
              "linear: expected input and weight to have the "
              "same dtype, but got ",
              dtype_name(input.dtype()), " and ", dtype_name(weight.dtype()));
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == out, "linear: expected a bias of shape [", out,
                "], got ", ShapeToString(bias.sizes()));
    EMBER_CHECK(bias.dtype() == weight.dtype(),
                "linear: expected bias and weight to have the "
                "same dtype, but got ",
                dtype_name(bias.dtype()), " and ", dtype_name(weight.dtype()));
  }
  if (input.dim() == 2) return LinearFunction::apply(input, weight, bias);
  // [*, in] -> [n, in] -> [n, out] -> [*, out].
  SizeVector out_shape(input.sizes().begin(), input.sizes().end());
  out_shape.back() = out;
  return LinearFunction::apply(input.reshape({-1, in}), weight, bias).reshape(out_shape);
}

}  // namespace functional

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features), has_bias_(bias) {
  EMBER_CHECK(in_features >= 0 && out_features >= 0,
              "Linear: in_features and out_features must be non-negative, got ", in_features,
              " and ", out_features);
  reset();
}

void Linear::reset() {
  register_parameter("weight", empty({out_features_, in_features_}));
  register_parameter("bias", has_bias_ ? empty({out_features_}) : Tensor());
  if (!InClone()) reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight(), std::sqrt(5.0));
  if (bias().defined()) {
    const double bound = in_features_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features_)) : 0;
    init::uniform_(bias(), -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) { return functional::linear(input, weight(), bias()); }

std::string Linear::extra_repr() const {
  return absl::StrCat("in_features=", in_features_, ", out_features=", out_features_,
                      ", bias=", has_bias_ ? "True" : "False");
}

}  // namespace ember::nn
