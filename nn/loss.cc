#include "nn/loss.h"

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/kernel_util.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;

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

// Checks class-index targets against an [N, C] input; returns them as a flat
// contiguous int64 tensor.
Tensor CheckClassTargets(const char* op, const Tensor& input, const Tensor& target,
                         int64_t ignore_index) {
  internal::CheckCpu(input, op, "input");
  internal::CheckCpu(target, op, "target");
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
  internal::VisitNnDtype(input.dtype(), op, []<typename T>() {});
  Tensor t = target.contiguous();
  const int64_t* p = t.data_ptr<int64_t>();
  const int64_t c = input.size(1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    EMBER_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < c), "Target ", p[i],
                " is out of bounds.");
  }
  return t;
}

// The factor each row's gradient gets from the incoming gradient.
template <typename T>
T RowScale(Reduction reduction, const T* g, int64_t row, double count) {
  switch (reduction) {
    case Reduction::kNone:
      return g[row];
    case Reduction::kSum:
      return g[0];
    case Reduction::kMean:
      return static_cast<T>(g[0] / count);
  }
  return T(0);
}

Tensor ReducedOutput(Reduction reduction, const std::vector<double>& rows, double count,
                     const TensorOptions& options) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (reduction == Reduction::kNone) {
    return tensor(rows).to(options.dtype());
  }
  double total = 0;
  for (double v : rows) total += v;
  if (reduction == Reduction::kMean) total /= count;  // NaN when every row is ignored, as torch.
  (void)n;
  return full({}, total, options);
}

// Each row's weight in a reduced loss: 0 for an ignored row, 1 / count under
// kMean, else 1; as a float64 [N] tensor.
Tensor RowWeights(const int64_t* t, int64_t n, int64_t ignore_index, Reduction reduction,
                  double count) {
  Tensor w = empty({n}, TensorOptions(kFloat64));
  const double kept = reduction == Reduction::kMean ? 1.0 / count : 1.0;
  for (int64_t i = 0; i < n; ++i) w.data_ptr<double>()[i] = t[i] == ignore_index ? 0.0 : kept;
  return w;
}

// Note [Recorded loss backward]
// Under create_graph the losses' gradients are written in recorded tensor ops,
// so they can be differentiated again: cross-entropy's is
// (softmax(x) - q) * g * w per row (q the smoothed one-hot target, w the row
// weight), NLL's is -onehot * g * w. Without create_graph the fused loops run.

struct CrossEntropyFunction : autograd::Function<CrossEntropyFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& target,
                        int64_t reduction, int64_t ignore_index, double smoothing) {
    Tensor x = input.detach().contiguous();
    const int64_t n = x.size(0), c = x.size(1);
    const int64_t* t = target.data_ptr<int64_t>();
    std::vector<double> rows(n, 0.0);
    Tensor lse = empty({n}, TensorOptions(kFloat64));
    double count = 0;
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
        lse.data_ptr<double>()[i] = l;
        if (t[i] == ignore_index) continue;
        count += 1;
        rows[i] = (1 - smoothing) * (l - row[t[i]]) + smoothing * (l - total / c);
      }
    });
    ctx->save_for_backward({input, target, lse});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["count"] = count;
    return ReducedOutput(static_cast<Reduction>(reduction), rows, count, x.options());
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(5);
    if (!grad_outputs[0].defined() || !ctx->needs_input_grad(0)) return grads;
    std::vector<Tensor> saved = ctx->get_saved_variables();
    const int64_t* t = saved[1].data_ptr<int64_t>();
    const double* lse = saved[2].data_ptr<double>();
    const auto reduction = static_cast<Reduction>(std::get<int64_t>(ctx->saved_data["reduction"]));
    const int64_t ignore_index = std::get<int64_t>(ctx->saved_data["ignore_index"]);
    const double smoothing = std::get<double>(ctx->saved_data["smoothing"]);
    const double count = std::get<double>(ctx->saved_data["count"]);
    const int64_t n = saved[0].size(0), c = saved[0].size(1);
    if (autograd::GradMode::is_enabled()) {  // Note [Recorded loss backward]
      Tensor q = full({n, c}, smoothing / static_cast<double>(c), TensorOptions(kFloat64));
      for (int64_t i = 0; i < n; ++i) {
        if (t[i] != ignore_index) q.data_ptr<double>()[i * c + t[i]] += 1 - smoothing;
      }
      const Dtype dtype = saved[0].dtype();
      Tensor w = RowWeights(t, n, ignore_index, reduction, count).to(dtype);
      Tensor scale = (grad_outputs[0] * w).unsqueeze(1);
      grads[0] = (saved[0].softmax(1) - q.to(dtype)) * scale;
      return grads;
    }
    Tensor x = saved[0].detach().contiguous();
    Tensor g = grad_outputs[0].detach().contiguous();
    Tensor gx = empty(x.sizes(), x.options());
    internal::VisitNnDtype(x.dtype(), "cross_entropy backward", [&]<typename T>() {
      const T* pg = g.data_ptr<T>();
      for (int64_t i = 0; i < n; ++i) {
        const T* row = x.data_ptr<T>() + i * c;
        T* out = gx.data_ptr<T>() + i * c;
        if (t[i] == ignore_index) {
          for (int64_t j = 0; j < c; ++j) out[j] = T(0);
          continue;
        }
        const double scale = RowScale<T>(reduction, pg, i, count);
        const double uniform = smoothing / static_cast<double>(c);
        for (int64_t j = 0; j < c; ++j) {
          double target_p = uniform + (j == t[i] ? 1 - smoothing : 0.0);
          out[j] = static_cast<T>(scale * (std::exp(row[j] - lse[i]) - target_p));
        }
      }
    });
    grads[0] = gx;
    return grads;
  }
};

struct NllFunction : autograd::Function<NllFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& target,
                        int64_t reduction, int64_t ignore_index) {
    Tensor x = input.detach().contiguous();
    const int64_t n = x.size(0), c = x.size(1);
    const int64_t* t = target.data_ptr<int64_t>();
    std::vector<double> rows(n, 0.0);
    double count = 0;
    internal::VisitNnDtype(x.dtype(), "nll_loss", [&]<typename T>() {
      for (int64_t i = 0; i < n; ++i) {
        if (t[i] == ignore_index) continue;
        count += 1;
        rows[i] = -static_cast<double>(x.data_ptr<T>()[i * c + t[i]]);
      }
    });
    ctx->save_for_backward({target});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["count"] = count;
    ctx->saved_data["classes"] = c;
    return ReducedOutput(static_cast<Reduction>(reduction), rows, count, x.options());
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(4);
    if (!grad_outputs[0].defined() || !ctx->needs_input_grad(0)) return grads;
    const Tensor target = ctx->get_saved_variables()[0];
    const int64_t* t = target.data_ptr<int64_t>();
    const auto reduction = static_cast<Reduction>(std::get<int64_t>(ctx->saved_data["reduction"]));
    const int64_t ignore_index = std::get<int64_t>(ctx->saved_data["ignore_index"]);
    const double count = std::get<double>(ctx->saved_data["count"]);
    const int64_t c = std::get<int64_t>(ctx->saved_data["classes"]);
    const int64_t n = target.numel();
    if (autograd::GradMode::is_enabled()) {  // Note [Recorded loss backward]
      Tensor w = RowWeights(t, n, ignore_index, reduction, count);
      Tensor onehot = zeros({n, c}, TensorOptions(kFloat64));
      for (int64_t i = 0; i < n; ++i) {
        if (t[i] != ignore_index) onehot.data_ptr<double>()[i * c + t[i]] = -1;
      }
      const Dtype dtype = grad_outputs[0].dtype();
      grads[0] = onehot.to(dtype) * (grad_outputs[0] * w.to(dtype)).unsqueeze(1);
      return grads;
    }
    Tensor g = grad_outputs[0].detach().contiguous();
    Tensor gx = zeros({n, c}, g.options());
    internal::VisitNnDtype(g.dtype(), "nll_loss backward", [&]<typename T>() {
      const T* pg = g.data_ptr<T>();
      T* out = gx.data_ptr<T>();
      for (int64_t i = 0; i < n; ++i) {
        if (t[i] == ignore_index) continue;
        out[i * c + t[i]] = -RowScale<T>(reduction, pg, i, count);
      }
    });
    grads[0] = gx;
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
  EMBER_CHECK(
      options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0,
      "cross_entropy: label_smoothing must be between 0.0 and 1.0. Got: ", options.label_smoothing);
  return WithBatch(input, target, options.reduction, [&](const Tensor& x, const Tensor& y) {
    Tensor t = CheckClassTargets("cross_entropy", x, y, options.ignore_index);
    return CrossEntropyFunction::apply(x, t, static_cast<int64_t>(options.reduction),
                                       options.ignore_index, options.label_smoothing);
  });
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& options) {
  return WithBatch(input, target, options.reduction, [&](const Tensor& x, const Tensor& y) {
    Tensor t = CheckClassTargets("nll_loss", x, y, options.ignore_index);
    return NllFunction::apply(x, t, static_cast<int64_t>(options.reduction), options.ignore_index);
  });
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  EMBER_CHECK(input.defined() && target.defined(), "mse_loss: input and target must be defined");
  Tensor d = input - target;
  return Reduce(d * d, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  EMBER_CHECK(input.defined() && target.defined(), "l1_loss: input and target must be defined");
  return Reduce((input - target).abs(), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction, const Tensor& pos_weight) {
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
