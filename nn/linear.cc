#include "nn/linear.h"

#include <array>
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

// The gradients of linear(x, w, b) from the output's `g` [n, out], each only
// where `needs` asks: g W, and g^T x with g's column sums in one
// gemm_bias_grad_out (one GEMM with cuBLASLt's bias-gradient epilogue on
// CUDA, Note [Bias epilogue]) outside create_graph; under it recorded ops.
std::vector<Tensor> LinearGradients(const Tensor& g, const Tensor& x, const Tensor& w,
                                    const std::array<bool, 3>& needs) {
  Tensor gx, gw, gb;
  if (!g.defined()) return {gx, gw, gb};
  if (needs[0]) gx = g.mm(w);
  if (needs[1] && needs[2] && !autograd::GradMode::is_enabled() && g.numel() > 0 &&
      g.is_floating_point()) {
    gw = empty(w.sizes(), w.options());
    gb = empty({w.size(0)}, w.options());
    ops::gemm_bias_grad_out(gw, gb, g.t(), x, /*of_a=*/true);
  } else {
    if (needs[1]) gw = g.t().mm(x);
    if (needs[2]) gb = g.sum(/*dims=*/{0});
  }
  return {gx, gw, gb};
}

std::array<bool, 3> NeedsOfInputs(AutogradContext* ctx) {
  return {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
}

// x [n, in] @ w^T [in, out] (+ b) with an explicit backward.
struct LinearFunction : autograd::Function<LinearFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& b) {
    ctx->save_for_backward({x, w});
    return b.defined() ? addmm(b, x, w.t()) : x.mm(w.t());
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> saved = ctx->get_saved_variables();
    return LinearGradients(grad_outputs[0], saved[0], saved[1], NeedsOfInputs(ctx));
  }
};

constexpr double kGeluTanhCoefficient = 0.044715;

// d/dz of GELU's tanh form at z: 0.5 (1 + t) + 0.5 z (1 - t^2) k (1 + 3 c z^2),
// with t = tanh(k (z + c z^3)) and k = sqrt(2 / pi).
Tensor GeluTanhGrad(const Tensor& z) {
  const double k = std::sqrt(2.0 / M_PI), c = kGeluTanhCoefficient;
  const Tensor t = ((z + z * z * z * c) * k).tanh();
  return (t + 1.0) * 0.5 + z * 0.5 * (1.0 - t * t) * k * (z * z * (3 * c) + 1.0);
}

// activation(x [n, in] @ w^T + b) in one gemm_bias_act_out (Note [Linear and
// its activation]); b defined. Saved: x, w and what the activation's
// derivative reads (ReLU: its output; GELU: the pre-activation).
struct LinearActivationFunction : autograd::Function<LinearActivationFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& b,
                        int64_t act) {
    const bool relu = act == static_cast<int64_t>(GemmActivation::kReLU);
    Tensor out = empty({x.size(0), w.size(0)}, x.options());
    Tensor pre = relu ? Tensor() : empty({x.size(0), w.size(0)}, x.options());
    ops::gemm_bias_act_out(out, pre, x, w.t(), b, act);
    ctx->save_for_backward({x, w, b, relu ? out : pre});
    ctx->saved_data["act"] = act;
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    const bool relu =
        std::get<int64_t>(ctx->saved_data["act"]) == static_cast<int64_t>(GemmActivation::kReLU);
    const Tensor& g = grad_outputs[0];
    // The activation's derivative at the saved tensor; under create_graph at
    // the pre-activation recomputed in recorded ops, so it has a derivative.
    Tensor at = saved[3];
    if (autograd::GradMode::is_enabled()) at = addmm(saved[2], x, w.t());
    Tensor gz = relu ? where(at.le(0), zeros({}, g.options()), g) : g * GeluTanhGrad(at);
    std::vector<Tensor> grads = LinearGradients(gz, x, w, NeedsOfInputs(ctx));
    grads.push_back(Tensor());  // act
    return grads;
  }
};

void CheckLinear(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias) {
  EMBER_CHECK(input.defined() && weight.defined(), op, ": input and weight must be defined");
  EMBER_CHECK(weight.dim() == 2, op,
              ": expected a 2-D weight [out_features, in_features], got "
              "shape ",
              ShapeToString(weight.sizes()));
  EMBER_CHECK(input.dim() >= 1, op,
              ": expected an input with at least 1 dim, got a 0-dim tensor");
  const int64_t in = weight.size(1), out = weight.size(0);
  EMBER_CHECK(input.size(-1) == in, op, ": the input's last dim (", input.size(-1),
              ") doesn't match in_features (", in, "): input shape ", ShapeToString(input.sizes()),
              ", weight shape ", ShapeToString(weight.sizes()));
  EMBER_CHECK(input.dtype() == weight.dtype(), op,
              ": expected input and weight to have the "
              "same dtype, but got ",
              dtype_name(input.dtype()), " and ", dtype_name(weight.dtype()));
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == out, op, ": expected a bias of shape [", out,
                "], got ", ShapeToString(bias.sizes()));
    EMBER_CHECK(bias.dtype() == weight.dtype(), op,
                ": expected bias and weight to have the "
                "same dtype, but got ",
                dtype_name(bias.dtype()), " and ", dtype_name(weight.dtype()));
  }
}

// f(input [*, in]) as f of [n, in], reshaped back to [*, out].
template <typename F>
Tensor OnRows(const Tensor& input, int64_t out, F f) {
  if (input.dim() == 2) return f(input);
  SizeVector out_shape(input.sizes().begin(), input.sizes().end());
  out_shape.back() = out;
  return f(input.reshape({-1, input.size(-1)})).reshape(out_shape);
}

}  // namespace

namespace functional {

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  if (auto cast = ember::internal::MaybeAutocast("linear", linear, input, weight, bias)) {
    return *std::move(cast);
  }
  CheckLinear("linear", input, weight, bias);
  return OnRows(input, weight.size(0),
                [&](const Tensor& x) { return LinearFunction::apply(x, weight, bias); });
}

Tensor linear_activation(const Tensor& input, const Tensor& weight, const Tensor& bias,
                         LinearActivation activation) {
  auto cast_again = [activation](const Tensor& x, const Tensor& w, const Tensor& b) {
    return linear_activation(x, w, b, activation);
  };
  if (auto cast = ember::internal::MaybeAutocast("linear", cast_again, input, weight, bias)) {
    return *std::move(cast);
  }
  CheckLinear("linear_activation", input, weight, bias);
  EMBER_CHECK(bias.defined(), "linear_activation: the bias must be defined (a Linear without "
              "bias has no epilogue to fuse into: call linear and the activation)");
  const int64_t act = static_cast<int64_t>(activation == LinearActivation::kReLU
                                               ? GemmActivation::kReLU
                                               : GemmActivation::kGeluTanh);
  return OnRows(input, weight.size(0), [&](const Tensor& x) {
    return LinearActivationFunction::apply(x, weight, bias, act);
  });
}

bool fuses_linear_activation(Device device) {
  return ops::gemm_bias_act_out.HasKernel(DeviceDispatchKey(device.type()));
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
