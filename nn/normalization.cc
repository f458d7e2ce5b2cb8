#include "nn/normalization.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "nn/batch_norm_kernels.h"
#include "nn/kernel_util.h"
#include "nn/layer_norm_kernels.h"
#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;

// Note [Normalisation double backward]
// Under create_graph the backward is written in recorded tensor ops: the
// statistics are recomputed from the saved input (they depend on it), then
//   x^ = (x - mean) * rstd,  gw = sum(g x^),  gb = sum(g),
//   gx = w rstd (g - mean(g) - x^ mean(g x^))   (batch statistics), or
//   gx = w rstd g                               (running statistics),
// each reduction over the normalised elements. Without create_graph the fused
// loops run. Empty inputs are not differentiated twice (their means are NaN).

// saved = {input, weight, mean, invstd}; the gradients of BatchNormFunction's
// eight arguments.
std::vector<Tensor> BatchNormRecordedBackward(const std::vector<Tensor>& saved, const Tensor& grad,
                                              bool training, double eps) {
  const Tensor& input = saved[0];
  const int64_t n = input.size(0), c = input.size(1);
  const SizeVector view{n, c, -1};
  Tensor x = input.reshape(view), g = grad.reshape(view);
  Tensor mean, rstd;
  if (training) {
    mean = x.mean({0, 2}, /*keepdim=*/true);
    rstd = ((x - mean).square().mean({0, 2}, /*keepdim=*/true) + eps).rsqrt();
  } else {
    mean = saved[2].view({1, c, 1});
    rstd = saved[3].view({1, c, 1});
  }
  Tensor xhat = (x - mean) * rstd;
  Tensor scale = saved[1].defined() ? saved[1].view({1, c, 1}) * rstd : rstd;
  Tensor gx = training ? scale * (g - g.mean({0, 2}, true) - xhat * (g * xhat).mean({0, 2}, true))
                       : scale * g;
  std::vector<Tensor> grads(8);
  grads[0] = gx.reshape(input.sizes());
  if (saved[1].defined()) grads[1] = (g * xhat).sum({0, 2});
  grads[2] = g.sum({0, 2});
  return grads;
}

// saved = {input, weight, mean, rstd}; the gradients of LayerNormFunction's
// five arguments.
std::vector<Tensor> LayerNormRecordedBackward(const std::vector<Tensor>& saved, const Tensor& grad,
                                              const std::vector<int64_t>& shape, double eps) {
  int64_t d = 1;
  for (int64_t v : shape) d *= v;
  const Tensor& input = saved[0];
  Tensor x = input.reshape({-1, d}), g = grad.reshape({-1, d});
  Tensor mean = x.mean({1}, /*keepdim=*/true);
  Tensor rstd = ((x - mean).square().mean({1}, /*keepdim=*/true) + eps).rsqrt();
  Tensor xhat = (x - mean) * rstd;
  Tensor dy = saved[1].defined() ? g * saved[1].reshape({1, d}) : g;
  Tensor gx = rstd * (dy - dy.mean({1}, true) - xhat * (dy * xhat).mean({1}, true));
  std::vector<Tensor> grads(5);
  grads[0] = gx.reshape(input.sizes());
  if (saved[1].defined()) grads[1] = (g * xhat).sum({0}).view(shape);
  grads[2] = g.sum({0}).view(shape);
  return grads;
}

}  // namespace

// The batch_norm slots (nn/batch_norm_kernels.h), filled per device type.
namespace internal {
constinit DeviceKernel<BatchNormForwardFn> batch_norm_forward{"batch_norm forward"};
constinit DeviceKernel<BatchNormBackwardFn> batch_norm_backward{"batch_norm backward"};
}  // namespace internal

namespace {

// batch_norm's CPU kernels: per channel, float64 accumulation, channels
// split over the intra-op pool. A channel's sums run in 8 independent
// partial sums (LaneSum): the same order on every run and thread count, and
// 8 chains instead of one for the CPU to overlap.

// The sum of f(j) for j in [0, len), as double.
template <typename F>
double LaneSum(int64_t len, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += f(j + k);
  }
  double tail = 0;
  for (; j < len; ++j) tail += f(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// Channels per parallel_for chunk: about kDefaultGrainSize elements.
int64_t ChannelGrain(int64_t per_channel) {
  return std::max<int64_t>(1, kDefaultGrainSize / std::max<int64_t>(per_channel, 1));
}

std::array<Tensor, 3> BatchNormForwardCpu(const Tensor& x, const Tensor& w, const Tensor& b,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          bool training, double momentum, double eps) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / std::max<int64_t>(n * c, 1);
  const int64_t m = n * s;
  Tensor mean = empty({c}, x.options()), invstd = empty({c}, x.options());
  Tensor out = empty(x.sizes(), x.options());
  Tensor stats_mean, stats_var;  // float64 copies of the running stats in eval mode
  if (!training) {
    stats_mean = running_mean.to(kFloat64).contiguous();
    stats_var = running_var.to(kFloat64).contiguous();
  }
  internal::VisitNnDtype(x.dtype(), "batch_norm", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* pm = mean.data_ptr<T>();
    T* pv = invstd.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(0, c, ChannelGrain(m), [&](int64_t first, int64_t last) {
      for (int64_t ch = first; ch < last; ++ch) {
        double mu, var;
        if (training) {
          double sum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* p = px + (i * c + ch) * s;
            sum += LaneSum(s, [p](int64_t j) { return static_cast<double>(p[j]); });
          }
          mu = sum / static_cast<double>(m);
          double sq = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* p = px + (i * c + ch) * s;
            sq += LaneSum(s, [p, mu](int64_t j) {
              const double d = p[j] - mu;
              return d * d;
            });
          }
          var = sq / static_cast<double>(m);
          if (running_mean.defined()) {
            VisitDtype(running_mean.dtype(), [&]<typename R>() {
              if constexpr (std::is_floating_point_v<R>) {
                R* rm = running_mean.data_ptr<R>();
                R* rv = running_var.data_ptr<R>();
                const double unbiased = m > 1 ? sq / static_cast<double>(m - 1) : var;
                rm[ch] = static_cast<R>((1 - momentum) * rm[ch] + momentum * mu);
                rv[ch] = static_cast<R>((1 - momentum) * rv[ch] + momentum * unbiased);
              }
            });
          }
        } else {
          mu = stats_mean.data_ptr<double>()[ch];
          var = stats_var.data_ptr<double>()[ch];
        }
        const double is = 1.0 / std::sqrt(var + eps);
        pm[ch] = static_cast<T>(mu);
        pv[ch] = static_cast<T>(is);
        const double scale = w.defined() ? w.data_ptr<T>()[ch] * is : is;
        const double shift = (b.defined() ? b.data_ptr<T>()[ch] : 0.0) - mu * scale;
        for (int64_t i = 0; i < n; ++i) {
          const T* p = px + (i * c + ch) * s;
          T* q = po + (i * c + ch) * s;
          for (int64_t j = 0; j < s; ++j) q[j] = static_cast<T>(p[j] * scale + shift);
        }
      }
    });
  });
  return {out, mean, invstd};
}

std::array<Tensor, 3> BatchNormBackwardCpu(const Tensor& g, const Tensor& x, const Tensor& w,
                                           const Tensor& mean, const Tensor& invstd,
                                           bool training, double /*eps*/,
                                           std::array<bool, 3> needs) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / std::max<int64_t>(n * c, 1);
  const double m = static_cast<double>(n * s);
  const bool need_x = needs[0];
  Tensor gx = need_x ? empty(x.sizes(), x.options()) : Tensor();
  Tensor gw = empty({c}, x.options()), gb = empty({c}, x.options());
  internal::VisitNnDtype(x.dtype(), "batch_norm backward", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    const T* pg = g.data_ptr<T>();
    T* pgx = need_x ? gx.data_ptr<T>() : nullptr;
    parallel_for(0, c, ChannelGrain(n * s), [&](int64_t first, int64_t last) {
      for (int64_t ch = first; ch < last; ++ch) {
        const double mu = mean.data_ptr<T>()[ch], is = invstd.data_ptr<T>()[ch];
        double sum_g = 0, sum_gx = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t base = (i * c + ch) * s;
          const T* q = pg + base;
          const T* p = px + base;
          sum_g += LaneSum(s, [q](int64_t j) { return static_cast<double>(q[j]); });
          sum_gx += LaneSum(s, [p, q, mu](int64_t j) { return q[j] * (p[j] - mu); });
        }
        gw.data_ptr<T>()[ch] = static_cast<T>(sum_gx * is);
        gb.data_ptr<T>()[ch] = static_cast<T>(sum_g);
        if (!need_x) continue;
        const double scale = (w.defined() ? w.data_ptr<T>()[ch] : 1.0) * is;
        // gx = scale * (g - mean(g) - xhat * mean(g * xhat)) in training,
        // scale * g in eval; as a * g + k * x + d per element.
        const double mean_g = training ? sum_g / m : 0.0;
        const double k = training ? -(sum_gx * is) / m * is : 0.0;
        const double a = scale, kx = scale * k, d = scale * (-mean_g - k * mu);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t base = (i * c + ch) * s;
          for (int64_t j = 0; j < s; ++j) {
            pgx[base + j] = static_cast<T>(a * pg[base + j] + kx * px[base + j] + d);
          }
        }
      }
    });
  });
  return {gx, needs[1] && w.defined() ? gw : Tensor(), needs[2] ? gb : Tensor()};
}

EMBER_REGISTER_NN_KERNEL(internal::batch_norm_forward, DeviceType::kCPU, internal::InFloat32<&BatchNormForwardCpu>);
EMBER_REGISTER_NN_KERNEL(internal::batch_norm_backward, DeviceType::kCPU, internal::InFloat32<&BatchNormBackwardCpu>);

// The gradients {input, weight, bias, ...} in the dtypes of what they are
// gradients of: a 16-bit input may come with float32 parameters
// (CheckParamDtype), and the kernels give parameter gradients in float32
// (Note [16-bit floats on the CPU] in kernel_util.h).
std::vector<Tensor> InInputDtypes(std::vector<Tensor> grads, const Tensor& input,
                                  const Tensor& weight) {
  const Dtype param = weight.defined() ? weight.dtype() : input.dtype();
  if (grads[0].defined()) grads[0] = grads[0].to(input.dtype());
  for (size_t i : {1, 2}) {
    if (grads[i].defined()) grads[i] = grads[i].to(param);
  }
  return grads;
}

// x viewed as [N, C, S]; statistics per channel, by the kernels of x's device.
struct BatchNormFunction : autograd::Function<BatchNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                        bool training, double momentum, double eps) {
    Tensor x = input.detach().contiguous();
    Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
    Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
    auto [out, mean, invstd] = internal::batch_norm_forward(x.device())(
        x, w, b, running_mean, running_var, training, momentum, eps);
    if (training && running_mean.defined()) {
      BumpVersion(running_mean);
      BumpVersion(running_var);
    }
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["training"] = training;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(8);
    if (!grad_outputs[0].defined()) return grads;
    std::vector<Tensor> saved = ctx->get_saved_variables();
    if (autograd::GradMode::is_enabled()) {
      grads = BatchNormRecordedBackward(saved, grad_outputs[0],
                                        std::get<bool>(ctx->saved_data["training"]),
                                        std::get<double>(ctx->saved_data["eps"]));
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!ctx->needs_input_grad(i)) grads[i] = Tensor();
      }
      return InInputDtypes(std::move(grads), saved[0], saved[1]);
    }
    Tensor x = saved[0].detach().contiguous();
    Tensor w = saved[1].defined() ? saved[1].detach().contiguous() : Tensor();
    Tensor g = grad_outputs[0].detach().contiguous();
    auto [gx, gw, gb] = internal::batch_norm_backward(x.device())(
        g, x, w, saved[2], saved[3], std::get<bool>(ctx->saved_data["training"]),
        std::get<double>(ctx->saved_data["eps"]),
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)});
    grads[0] = gx;
    grads[1] = gw;
    grads[2] = gb;
    return InInputDtypes(std::move(grads), saved[0], saved[1]);
  }
};

}  // namespace

// The layer_norm slots (nn/layer_norm_kernels.h), filled per device type.
namespace internal {
constinit DeviceKernel<LayerNormForwardFn> layer_norm_forward{"layer_norm forward"};
constinit DeviceKernel<LayerNormBackwardFn> layer_norm_backward{"layer_norm backward"};
}  // namespace internal

namespace {

// layer_norm's CPU kernels: per row, float64 accumulation.
std::array<Tensor, 3> LayerNormForwardCpu(const Tensor& x, const Tensor& w, const Tensor& b,
                                          int64_t d, double eps) {
  const int64_t r = d > 0 ? x.numel() / d : 0;
  Tensor out = empty(x.sizes(), x.options());
  Tensor mean = empty({r}, x.options()), rstd = empty({r}, x.options());
  internal::VisitNnDtype(x.dtype(), "layer_norm", [&]<typename T>() {
    const T* pw = w.defined() ? w.data_ptr<T>() : nullptr;
    const T* pb = b.defined() ? b.data_ptr<T>() : nullptr;
    for (int64_t row = 0; row < r; ++row) {
      const T* p = x.data_ptr<T>() + row * d;
      T* q = out.data_ptr<T>() + row * d;
      double sum = 0, sq = 0;
      for (int64_t j = 0; j < d; ++j) sum += p[j];
      const double mu = sum / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) sq += (p[j] - mu) * (p[j] - mu);
      const double rs = 1.0 / std::sqrt(sq / static_cast<double>(d) + eps);
      mean.data_ptr<T>()[row] = static_cast<T>(mu);
      rstd.data_ptr<T>()[row] = static_cast<T>(rs);
      for (int64_t j = 0; j < d; ++j) {
        double v = (p[j] - mu) * rs;
        if (pw) v *= pw[j];
        if (pb) v += pb[j];
        q[j] = static_cast<T>(v);
      }
    }
  });
  return {out, mean, rstd};
}

std::array<Tensor, 3> LayerNormBackwardCpu(const Tensor& g, const Tensor& x, const Tensor& w,
                                           const Tensor& mean, const Tensor& rstd, int64_t d,
                                           std::array<bool, 3> needs) {
  const int64_t r = d > 0 ? x.numel() / d : 0;
  Tensor gx = needs[0] ? empty(x.sizes(), x.options()) : Tensor();
  Tensor gw = zeros({d}, TensorOptions(kFloat64)), gb = zeros({d}, TensorOptions(kFloat64));
  internal::VisitNnDtype(x.dtype(), "layer_norm backward", [&]<typename T>() {
    const T* pw = w.defined() ? w.data_ptr<T>() : nullptr;
    double* pgw = gw.data_ptr<double>();
    double* pgb = gb.data_ptr<double>();
    for (int64_t row = 0; row < r; ++row) {
      const T* p = x.data_ptr<T>() + row * d;
      const T* pg = g.data_ptr<T>() + row * d;
      const double mu = mean.data_ptr<T>()[row], rs = rstd.data_ptr<T>()[row];
      double sum_dy = 0, sum_dyx = 0;
      for (int64_t j = 0; j < d; ++j) {
        const double xhat = (p[j] - mu) * rs;
        const double dy = pg[j] * (pw ? pw[j] : 1.0);
        sum_dy += dy;
        sum_dyx += dy * xhat;
        pgw[j] += pg[j] * xhat;
        pgb[j] += pg[j];
      }
      if (!gx.defined()) continue;
      T* q = gx.data_ptr<T>() + row * d;
      for (int64_t j = 0; j < d; ++j) {
        const double xhat = (p[j] - mu) * rs;
        const double dy = pg[j] * (pw ? pw[j] : 1.0);
        q[j] = static_cast<T>(rs * (dy - sum_dy / d - xhat * sum_dyx / d));
      }
    }
  });
  return {gx, needs[1] && w.defined() ? gw.to(x.dtype()) : Tensor(),
          needs[2] ? gb.to(x.dtype()) : Tensor()};
}

EMBER_REGISTER_NN_KERNEL(internal::layer_norm_forward, DeviceType::kCPU, internal::InFloat32<&LayerNormForwardCpu>);
EMBER_REGISTER_NN_KERNEL(internal::layer_norm_backward, DeviceType::kCPU, internal::InFloat32<&LayerNormBackwardCpu>);

// x viewed as [R, D]; statistics per row, by the kernels of x's device.
struct LayerNormFunction : autograd::Function<LayerNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, std::vector<int64_t> shape, double eps) {
    int64_t d = 1;
    for (int64_t v : shape) d *= v;
    Tensor x = input.detach().contiguous();
    Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
    Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
    auto [out, mean, rstd] = internal::layer_norm_forward(x.device())(x, w, b, d, eps);
    ctx->save_for_backward({input, weight, mean, rstd});
    ctx->saved_data["shape"] = shape;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(5);
    if (!grad_outputs[0].defined()) return grads;
    std::vector<Tensor> saved = ctx->get_saved_variables();
    if (autograd::GradMode::is_enabled()) {
      grads = LayerNormRecordedBackward(saved, grad_outputs[0],
                                        std::get<std::vector<int64_t>>(ctx->saved_data["shape"]),
                                        std::get<double>(ctx->saved_data["eps"]));
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!ctx->needs_input_grad(i)) grads[i] = Tensor();
      }
      return InInputDtypes(std::move(grads), saved[0], saved[1]);
    }
    Tensor x = saved[0].detach().contiguous();
    Tensor w = saved[1].defined() ? saved[1].detach().contiguous() : Tensor();
    const std::vector<int64_t> shape = std::get<std::vector<int64_t>>(ctx->saved_data["shape"]);
    int64_t d = 1;
    for (int64_t v : shape) d *= v;
    Tensor g = grad_outputs[0].detach().contiguous();
    auto [gx, gw, gb] = internal::layer_norm_backward(x.device())(
        g, x, w, saved[2], saved[3], d,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)});
    grads[0] = gx;
    if (gw.defined()) grads[1] = gw.view(shape);
    if (gb.defined()) grads[2] = gb.view(shape);
    return InInputDtypes(std::move(grads), saved[0], saved[1]);
  }
};

}  // namespace

namespace functional {

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  EMBER_CHECK(input.defined(), "batch_norm: input is an undefined tensor");
  EMBER_CHECK(input.dim() >= 2,
              "batch_norm: expected an input of at least 2 dims [N, C, *], "
              "got shape ",
              ShapeToString(input.sizes()));
  const int64_t c = input.size(1);
  auto check_channel = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    EMBER_CHECK(t.dim() == 1 && t.size(0) == c, "batch_norm: expected ", what, " of shape [", c,
                "] (the input's channels), got ", ShapeToString(t.sizes()));
    internal::CheckDevice(t, input.device(), "batch_norm", what);
  };
  check_channel(running_mean, "running_mean");
  check_channel(running_var, "running_var");
  check_channel(weight, "weight");
  check_channel(bias, "bias");
  EMBER_CHECK(running_mean.defined() == running_var.defined(),
              "batch_norm: running_mean and running_var must both be given or both be undefined");
  EMBER_CHECK(training || running_mean.defined(),
              "batch_norm: running_mean and running_var are needed in eval mode");
  if (weight.defined()) internal::CheckParamDtype(input, weight, "batch_norm", "weight");
  if (bias.defined()) internal::CheckParamDtype(input, bias, "batch_norm", "bias");
  if (training) {
    const int64_t per_channel = c > 0 ? input.numel() / c : 0;
    EMBER_CHECK(per_channel > 1,
                "Expected more than 1 value per channel when training, got "
                "input size ",
                ShapeToString(input.sizes()));
  }
  return BatchNormFunction::apply(input, weight, bias, running_mean, running_var, training,
                                  momentum, eps);
}

Tensor layer_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  if (auto cast = ember::internal::MaybeAutocast("layer_norm", layer_norm, input,
                                                 normalized_shape, weight, bias, eps)) {
    return *std::move(cast);
  }
  EMBER_CHECK(input.defined(), "layer_norm: input is an undefined tensor");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  EMBER_CHECK(k >= 1, "layer_norm: normalized_shape must have at least one dim");
  bool matches = input.dim() >= k;
  for (int64_t i = 0; matches && i < k; ++i) {
    matches = input.size(input.dim() - k + i) == normalized_shape[i];
  }
  EMBER_CHECK(matches, "Given normalized_shape=", ShapeToString(normalized_shape),
              ", expected input with shape [*, ", ShapeToString(normalized_shape).substr(1),
              ", but got input of size ", ShapeToString(input.sizes()));
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    EMBER_CHECK(t->sizes() == normalized_shape, "layer_norm: expected weight and bias of shape ",
                ShapeToString(normalized_shape), ", got ", ShapeToString(t->sizes()));
    internal::CheckParamDtype(input, *t, "layer_norm", "weight/bias");
    internal::CheckDevice(*t, input.device(), "layer_norm", "weight/bias");
  }
  return LayerNormFunction::apply(
      input, weight, bias, std::vector<int64_t>(normalized_shape.begin(), normalized_shape.end()),
      eps);
}

}  // namespace functional

// --- BatchNorm -----------------------------------------------------------------

void BatchNormBase::RegisterState() {
  const int64_t c = options_.num_features;
  register_parameter("weight", options_.affine ? empty({c}) : Tensor());
  register_parameter("bias", options_.affine ? empty({c}) : Tensor());
  if (options_.track_running_stats) {
    register_buffer("running_mean", zeros({c}));
    register_buffer("running_var", ones({c}));
    register_buffer("num_batches_tracked", zeros({}, TensorOptions(kInt64)));
  } else {
    register_buffer("running_mean", Tensor());
    register_buffer("running_var", Tensor());
    register_buffer("num_batches_tracked", Tensor());
  }
  if (!InClone()) reset_parameters();
}

void BatchNormBase::reset_running_stats() {
  if (!options_.track_running_stats) return;
  init::zeros_(running_mean());
  init::ones_(running_var());
  init::zeros_(num_batches_tracked());
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (options_.affine) {
    init::ones_(weight());
    init::zeros_(bias());
  }
}

Tensor BatchNormBase::forward(const Tensor& input) {
  CheckInputDim(input);
  EMBER_CHECK(input.size(1) == options_.num_features, name(), ": expected ", options_.num_features,
              " channels (dim 1), got input of shape ", ShapeToString(input.sizes()));
  double momentum = options_.momentum.value_or(0.0);
  const bool tracking = options_.track_running_stats;
  if (is_training() && tracking) {
    autograd::NoGradGuard no_grad;
    const Tensor& count = num_batches_tracked();
    count.add_(1);
    if (!options_.momentum) momentum = 1.0 / static_cast<double>(count.item<int64_t>());
  }
  // Running stats are used in eval mode when tracked, and updated in training.
  const bool use_batch_stats = is_training() || !tracking;
  return functional::batch_norm(input, tracking ? running_mean() : Tensor(),
                                tracking ? running_var() : Tensor(), weight(), bias(),
                                use_batch_stats, momentum, options_.eps);
}

std::string BatchNormBase::extra_repr() const {
  return absl::StrCat(options_.num_features, ", eps=", options_.eps,
                      ", momentum=", options_.momentum ? absl::StrCat(*options_.momentum) : "None",
                      ", affine=", options_.affine ? "True" : "False",
                      ", track_running_stats=", options_.track_running_stats ? "True" : "False");
}

BatchNorm1d::BatchNorm1d(BatchNormOptions options) : Cloneable(options) { reset(); }

void BatchNorm1d::CheckInputDim(const Tensor& input) const {
  EMBER_CHECK(input.defined() && (input.dim() == 2 || input.dim() == 3),
              "BatchNorm1d: expected 2D or 3D input (got ", input.defined() ? input.dim() : 0,
              "D input)");
}

BatchNorm2d::BatchNorm2d(BatchNormOptions options) : Cloneable(options) { reset(); }

void BatchNorm2d::CheckInputDim(const Tensor& input) const {
  EMBER_CHECK(input.defined() && input.dim() == 4, "BatchNorm2d: expected 4D input (got ",
              input.defined() ? input.dim() : 0, "D input)");
}

// --- LayerNorm -----------------------------------------------------------------

LayerNorm::LayerNorm(SizeVector normalized_shape, double eps, bool elementwise_affine, bool bias)
    : normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      elementwise_affine_(elementwise_affine),
      bias_(bias) {
  EMBER_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  reset();
}

void LayerNorm::reset() {
  register_parameter("weight",
                     elementwise_affine_ ? ember::empty(IntArrayRef(normalized_shape_)) : Tensor());
  register_parameter("bias", elementwise_affine_ && bias_
                                 ? ember::empty(IntArrayRef(normalized_shape_))
                                 : Tensor());
  if (!InClone()) reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!elementwise_affine_) return;
  init::ones_(weight());
  if (bias().defined()) init::zeros_(bias());
}

Tensor LayerNorm::forward(const Tensor& input) {
  return functional::layer_norm(input, normalized_shape_, weight(), bias(), eps_);
}

std::string LayerNorm::extra_repr() const {
  return absl::StrCat("(", absl::StrJoin(normalized_shape_, ", "), ",), eps=", eps_,
                      ", elementwise_affine=", elementwise_affine_ ? "True" : "False");
}

}  // namespace ember::nn
