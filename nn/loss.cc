#include "nn/loss.h"

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/kernel_util.h"
#include "nn/loss_kernels.h"
#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn {

// The class-index losses' slots (nn/loss_kernels.h), filled per device type.
namespace internal {
constinit DeviceKernel<CrossEntropyForwardFn> cross_entropy_forward{"cross_entropy forward"};
constinit DeviceKernel<CrossEntropyBackwardFn> cross_entropy_backward{"cross_entropy backward"};
constinit DeviceKernel<NllForwardFn> nll_loss_forward{"nll_loss forward"};
constinit DeviceKernel<NllBackwardFn> nll_loss_backward{"nll_loss backward"};
}  // namespace internal

namespace {

using autograd::AutogradContext;
using internal::ClassLossGrad;
using internal::ClassLossRows;

Tensor Reduce(const Tensor& t, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return t;
    case Reduction::kMean:
      return t.mean();
    case Reduction::kSum:
      return t.sum();
  }
  EMBER_FAIL("unknown reduction ", static_cast<int>(reduction));
}

// Checks class-index targets against an [N, C] input (their values are
// checked by the forward kernels); returns them contiguous.
Tensor CheckClassTargets(const char* op, const Tensor& input, const Tensor& target) {
  EMBER_CHECK(input.defined(), op, ": input is an undefined tensor");
  internal::CheckDevice(target, input.device(), op, "target");
  EMBER_CHECK(target.dtype() == kInt64, op,
              ": expected target of dtype int64 (class indices), "
              "but got ",
              dtype_name(target.dtype()), "; convert it with .to(ember::kInt64)");
  EMBER_CHECK(input.dim() == 2, op, ": expected input [N, C] or [C], got shape ",
              ShapeToString(input.sizes()));
  EMBER_CHECK(target.dim() == 1, op, ": expected a 1-D target [N] for input [N, C], got shape ",
              ShapeToString(target.sizes()));
  EMBER_CHECK(input.size(0) == target.size(0), "Expected input batch_size (", input.size(0),
              ") to match target batch_size (", target.size(0), ").");
  internal::CheckNnDtype(input, op);
  return target.contiguous();
}

// The CPU kernels' target check (nn/loss_kernels.h).
void CheckTargetValues(const int64_t* t, int64_t n, int64_t c, int64_t ignore_index) {
  for (int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < c), "Target ", t[i],
                " is out of bounds.");
  }
}

// The factor each row's gradient gets from the incoming gradient.
template <typename T>
T RowScale(const ClassLossGrad& args, const T* g, int64_t row) {
  return args.per_row ? g[row] : static_cast<T>(g[0] / args.divisor);
}

// --- CPU kernels (nn/loss_kernels.h) ---------------------------------------------

ClassLossRows CrossEntropyForwardCpu(const Tensor& x, const Tensor& target, int64_t ignore_index,
                                     double smoothing) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t* t = target.data_ptr<int64_t>();
  CheckTargetValues(t, n, c, ignore_index);
  ClassLossRows r{zeros({n}, TensorOptions(kFloat64)), empty({n}, TensorOptions(kFloat64)), 0};
  double* rows = r.rows.data_ptr<double>();
  double* lse = r.lse.data_ptr<double>();
  internal::VisitNnDtype(x.dtype(), "cross_entropy", [&]<typename T>() {
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x.data_ptr<T>() + i * c;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < c; ++j) mx = std::max<double>(mx, row[j]);
      double sum = 0, total = 0;
      for (int64_t j = 0; j < c; ++j) {
        sum += std::exp(row[j] - mx);
        total += row[j];
      }
      const double l = mx + std::log(sum);
      lse[i] = l;
      if (t[i] == ignore_index) continue;
      r.count += 1;
      rows[i] = (1 - smoothing) * (l - row[t[i]]) + smoothing * (l - total / c);
    }
  });
  return r;
}

Tensor CrossEntropyBackwardCpu(const Tensor& g, const Tensor& x, const Tensor& target,
                               const Tensor& lse_rows, const ClassLossGrad& args) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t* t = target.data_ptr<int64_t>();
  const double* lse = lse_rows.data_ptr<double>();
  Tensor gx = empty(x.sizes(), x.options());
  internal::VisitNnDtype(x.dtype(), "cross_entropy backward", [&]<typename T>() {
    const T* pg = g.data_ptr<T>();
    const double uniform = args.label_smoothing / static_cast<double>(c);
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x.data_ptr<T>() + i * c;
      T* out = gx.data_ptr<T>() + i * c;
      if (t[i] == args.ignore_index) {
        for (int64_t j = 0; j < c; ++j) out[j] = T(0);
        continue;
      }
      const double scale = RowScale<T>(args, pg, i);
      for (int64_t j = 0; j < c; ++j) {
        double target_p = uniform + (j == t[i] ? 1 - args.label_smoothing : 0.0);
        out[j] = static_cast<T>(scale * (std::exp(row[j] - lse[i]) - target_p));
      }
    }
  });
  return gx;
}

ClassLossRows NllForwardCpu(const Tensor& x, const Tensor& target, int64_t ignore_index) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t* t = target.data_ptr<int64_t>();
  CheckTargetValues(t, n, c, ignore_index);
  ClassLossRows r{zeros({n}, TensorOptions(kFloat64)), Tensor(), 0};
  double* rows = r.rows.data_ptr<double>();
  internal::VisitNnDtype(x.dtype(), "nll_loss", [&]<typename T>() {
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] == ignore_index) continue;
      r.count += 1;
      rows[i] = -static_cast<double>(x.data_ptr<T>()[i * c + t[i]]);
    }
  });
  return r;
}

Tensor NllBackwardCpu(const Tensor& g, const Tensor& target, int64_t c, const ClassLossGrad& args) {
  const int64_t n = target.numel();
  const int64_t* t = target.data_ptr<int64_t>();
  Tensor gx = zeros({n, c}, g.options());
  internal::VisitNnDtype(g.dtype(), "nll_loss backward", [&]<typename T>() {
    const T* pg = g.data_ptr<T>();
    T* out = gx.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] == args.ignore_index) continue;
      out[i * c + t[i]] = -RowScale<T>(args, pg, i);
    }
  });
  return gx;
}

EMBER_REGISTER_NN_KERNEL(internal::cross_entropy_forward, DeviceType::kCPU,
                         &CrossEntropyForwardCpu);
EMBER_REGISTER_NN_KERNEL(internal::cross_entropy_backward, DeviceType::kCPU,
                         &CrossEntropyBackwardCpu);
EMBER_REGISTER_NN_KERNEL(internal::nll_loss_forward, DeviceType::kCPU, &NllForwardCpu);
EMBER_REGISTER_NN_KERNEL(internal::nll_loss_backward, DeviceType::kCPU, &NllBackwardCpu);

// --- Device-generic parts --------------------------------------------------------

// The reduced loss in `dtype`, on the rows' device.
Tensor ReducedOutput(Reduction reduction, const ClassLossRows& r, Dtype dtype) {
  switch (reduction) {
    case Reduction::kNone:
      return r.rows.to(dtype);
    case Reduction::kSum:
      return r.rows.sum().to(dtype);
    case Reduction::kMean:
      // NaN when every row is ignored, as torch.
      return (r.rows.sum() / static_cast<double>(r.count)).to(dtype);
  }
  EMBER_FAIL("unknown reduction ", static_cast<int>(reduction));
}

// How the backward scales each row, from what the forward saved.
ClassLossGrad GradArgs(AutogradContext* ctx) {
  const auto reduction = static_cast<Reduction>(std::get<int64_t>(ctx->saved_data["reduction"]));
  ClassLossGrad args;
  args.per_row = reduction == Reduction::kNone;
  args.divisor = reduction == Reduction::kMean ? std::get<double>(ctx->saved_data["count"]) : 1.0;
  args.ignore_index = std::get<int64_t>(ctx->saved_data["ignore_index"]);
  return args;
}

// The targets' one-hot rows [N, C] in `dtype` on their device (a row of
// zeros for a target outside [0, C)).
Tensor OneHot(const Tensor& target, int64_t c, Dtype dtype) {
  return target.unsqueeze(1).eq(arange(c, TensorOptions(kInt64).device(target.device()))).to(dtype);
}

// Each row's weight in the loss [N]: 0 for an ignored row, 1 / count under
// kMean, else 1.
Tensor RowWeights(const Tensor& target, const ClassLossGrad& args, Dtype dtype) {
  Tensor kept = target.ne(args.ignore_index).to(dtype);
  return args.per_row || args.divisor == 1.0 ? kept : kept * (1.0 / args.divisor);
}

// Note [Recorded loss backward]
// Under create_graph the losses' gradients are written in recorded tensor ops
// (on the input's device), so they can be differentiated again:
// cross-entropy's is (softmax(x) - q) * g * w per row (q the smoothed one-hot
// target, w the row weight), NLL's is -onehot * g * w. Without create_graph
// the kernels of the device run (nn/loss_kernels.h).

struct CrossEntropyFunction : autograd::Function<CrossEntropyFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& target,
                        int64_t reduction, int64_t ignore_index, double smoothing) {
    Tensor x = input.detach().contiguous();
    ClassLossRows r =
        internal::cross_entropy_forward(x.device())(x, target, ignore_index, smoothing);
    ctx->save_for_backward({input, target, r.lse});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["count"] = static_cast<double>(r.count);
    return ReducedOutput(static_cast<Reduction>(reduction), r, x.dtype());
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(5);
    if (!grad_outputs[0].defined() || !ctx->needs_input_grad(0)) return grads;
    std::vector<Tensor> saved = ctx->get_saved_variables();
    ClassLossGrad args = GradArgs(ctx);
    args.label_smoothing = std::get<double>(ctx->saved_data["smoothing"]);
    const Tensor& target = saved[1];
    if (autograd::GradMode::is_enabled()) {  // Note [Recorded loss backward]
      const Dtype dtype = saved[0].dtype();
      const int64_t c = saved[0].size(1);
      const double s = args.label_smoothing;
      Tensor q = OneHot(target, c, dtype) * (1 - s) + s / static_cast<double>(c);
      Tensor scale = (grad_outputs[0] * RowWeights(target, args, dtype)).unsqueeze(1);
      grads[0] = (saved[0].softmax(1) - q) * scale;
      return grads;
    }
    Tensor x = saved[0].detach().contiguous();
    Tensor g = grad_outputs[0].detach().contiguous();
    grads[0] = internal::cross_entropy_backward(x.device())(g, x, target, saved[2], args);
    return grads;
  }
};

struct NllFunction : autograd::Function<NllFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& target,
                        int64_t reduction, int64_t ignore_index) {
    Tensor x = input.detach().contiguous();
    ClassLossRows r = internal::nll_loss_forward(x.device())(x, target, ignore_index);
    ctx->save_for_backward({target});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["count"] = static_cast<double>(r.count);
    ctx->saved_data["classes"] = x.size(1);
    return ReducedOutput(static_cast<Reduction>(reduction), r, x.dtype());
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(4);
    if (!grad_outputs[0].defined() || !ctx->needs_input_grad(0)) return grads;
    const Tensor target = ctx->get_saved_variables()[0];
    const ClassLossGrad args = GradArgs(ctx);
    const int64_t c = std::get<int64_t>(ctx->saved_data["classes"]);
    if (autograd::GradMode::is_enabled()) {  // Note [Recorded loss backward]
      const Dtype dtype = grad_outputs[0].dtype();
      Tensor scale = (grad_outputs[0] * RowWeights(target, args, dtype)).unsqueeze(1);
      grads[0] = OneHot(target, c, dtype).neg() * scale;
      return grads;
    }
    Tensor g = grad_outputs[0].detach().contiguous();
    grads[0] = internal::nll_loss_backward(g.device())(g, target, c, args);
    return grads;
  }
};

// Runs `f` on [N, C] / [N], accepting [C] with a 0-dim target too.
template <typename F>
Tensor WithBatch(const Tensor& input, const Tensor& target, Reduction reduction, F f) {
  if (input.defined() && target.defined() && input.dim() == 1 && target.dim() == 0) {
    Tensor out = f(input.unsqueeze(0), target.unsqueeze(0));
    return reduction == Reduction::kNone ? out.squeeze(0) : out;
  }
  return f(input, target);
}

}  // namespace

namespace functional {

Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyOptions& options) {
  if (auto cast = ember::internal::MaybeAutocast("cross_entropy_loss", cross_entropy, input,
                                                 target, options)) {
    return *std::move(cast);
  }
  EMBER_CHECK(
      options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0,
      "cross_entropy: label_smoothing must be between 0.0 and 1.0. Got: ", options.label_smoothing);
  return WithBatch(input, target, options.reduction, [&](const Tensor& x, const Tensor& y) {
    Tensor t = CheckClassTargets("cross_entropy", x, y);
    return CrossEntropyFunction::apply(x, t, static_cast<int64_t>(options.reduction),
                                       options.ignore_index, options.label_smoothing);
  });
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& options) {
  if (auto cast = ember::internal::MaybeAutocast("nll_loss", nll_loss, input, target, options)) {
    return *std::move(cast);
  }
  return WithBatch(input, target, options.reduction, [&](const Tensor& x, const Tensor& y) {
    Tensor t = CheckClassTargets("nll_loss", x, y);
    return NllFunction::apply(x, t, static_cast<int64_t>(options.reduction), options.ignore_index);
  });
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto cast = ember::internal::MaybeAutocast("mse_loss", mse_loss, input, target, reduction)) {
    return *std::move(cast);
  }
  EMBER_CHECK(input.defined() && target.defined(), "mse_loss: input and target must be defined");
  Tensor d = input - target;
  return Reduce(d * d, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto cast = ember::internal::MaybeAutocast("l1_loss", l1_loss, input, target, reduction)) {
    return *std::move(cast);
  }
  EMBER_CHECK(input.defined() && target.defined(), "l1_loss: input and target must be defined");
  return Reduce((input - target).abs(), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction, const Tensor& pos_weight) {
  if (auto cast = ember::internal::MaybeAutocast("binary_cross_entropy_with_logits",
                                                 binary_cross_entropy_with_logits, input, target,
                                                 reduction, pos_weight)) {
    return *std::move(cast);
  }
  EMBER_CHECK(input.defined() && target.defined(),
              "binary_cross_entropy_with_logits: input and target must be defined");
  EMBER_CHECK(input.sizes() == target.sizes(), "Target size (", ShapeToString(target.sizes()),
              ") must be the same as input size (", ShapeToString(input.sizes()), ")");
  // (1 - y) x + w (log(1 + exp(-|x|)) + max(-x, 0)), w = 1 + (pos_weight - 1) y.
  Tensor softplus_neg = (-input.abs()).exp().log1p() + (-input).relu();
  Tensor weighted =
      pos_weight.defined() ? ((pos_weight - 1.0) * target + 1.0) * softplus_neg : softplus_neg;
  return Reduce((1.0 - target) * input + weighted, reduction);
}

}  // namespace functional
}  // namespace ember::nn
