#include "nn/conv.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/conv_kernels.h"
#include "nn/init.h"
#include "nn/kernel_util.h"
#include "nn/onednn.h"
#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;
namespace onednn = internal::onednn;
using IntVector = std::vector<int64_t>;

// The geometry of one convolution.
struct ConvShape {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // weight
  int64_t oh, ow;      // output
  Int2 stride, padding, dilation;
  int64_t groups;
  int64_t ckk() const { return c * kh * kw; }
  int64_t l() const { return oh * ow; }
};

// cols[(ci * kh + ki) * kw + kj][oy * ow + ox] = x[ci][iy][ix] (0 outside).
template <typename T>
void Im2Col(const T* x, const ConvShape& s, T* cols) {
  for (int64_t ci = 0; ci < s.c; ++ci) {
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        T* row = cols + ((ci * s.kh + ki) * s.kw + kj) * s.l();
        const T* plane = x + ci * s.h * s.w;
        for (int64_t oy = 0; oy < s.oh; ++oy) {
          const int64_t iy = oy * s.stride[0] - s.padding[0] + ki * s.dilation[0];
          T* out = row + oy * s.ow;
          if (iy < 0 || iy >= s.h) {
            for (int64_t ox = 0; ox < s.ow; ++ox) out[ox] = T(0);
            continue;
          }
          const T* in = plane + iy * s.w;
          for (int64_t ox = 0; ox < s.ow; ++ox) {
            const int64_t ix = ox * s.stride[1] - s.padding[1] + kj * s.dilation[1];
            out[ox] = (ix >= 0 && ix < s.w) ? in[ix] : T(0);
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds every cols entry back into gx.
template <typename T>
void Col2Im(const T* cols, const ConvShape& s, T* gx) {
  for (int64_t ci = 0; ci < s.c; ++ci) {
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        const T* row = cols + ((ci * s.kh + ki) * s.kw + kj) * s.l();
        T* plane = gx + ci * s.h * s.w;
        for (int64_t oy = 0; oy < s.oh; ++oy) {
          const int64_t iy = oy * s.stride[0] - s.padding[0] + ki * s.dilation[0];
          if (iy < 0 || iy >= s.h) continue;
          const T* in = row + oy * s.ow;
          T* out = plane + iy * s.w;
          for (int64_t ox = 0; ox < s.ow; ++ox) {
            const int64_t ix = ox * s.stride[1] - s.padding[1] + kj * s.dilation[1];
            if (ix >= 0 && ix < s.w) out[ix] += in[ox];
          }
        }
      }
    }
  }
}

// Unfolds sample `n` of x (contiguous) into cols [C*kh*kw, OH*OW].
void Unfold(const Tensor& x, int64_t n, const ConvShape& s, const Tensor& cols) {
  internal::VisitNnDtype(x.dtype(), "conv2d", [&]<typename T>() {
    Im2Col(x.data_ptr<T>() + n * s.c * s.h * s.w, s, cols.data_ptr<T>());
  });
}

// out = beta * out + a @ b on 2-D views.
void Gemm(const Tensor& out, const Tensor& a, const Tensor& b, double beta) {
  ops::gemm_out(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), beta, 1);
}

using internal::ConvParams;

ConvShape ShapeOf(IntArrayRef x, IntArrayRef w, const ConvParams& p) {
  ConvShape s;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3];
  s.o = w[0], s.kh = w[2], s.kw = w[3];
  s.stride = p.stride, s.padding = p.padding, s.dilation = p.dilation, s.groups = p.groups;
  s.oh = (s.h + 2 * p.padding[0] - p.dilation[0] * (s.kh - 1) - 1) / p.stride[0] + 1;
  s.ow = (s.w + 2 * p.padding[1] - p.dilation[1] * (s.kw - 1) - 1) / p.stride[1] + 1;
  return s;
}

// Whether oneDNN computes a convolution of `t`'s dtype (Note [oneDNN kernels]).
bool UseOneDnn(const Tensor& t) { return t.dtype() == kFloat32 && onednn::Enabled(); }

onednn::ConvGeometry GeometryOf(const ConvShape& s) {
  return {.n = s.n, .c = s.c, .h = s.h, .w = s.w, .o = s.o, .kh = s.kh, .kw = s.kw,
          .oh = s.oh, .ow = s.ow, .stride = s.stride, .padding = s.padding,
          .dilation = s.dilation, .groups = s.groups};
}

// Names `weight` for oneDNN's weight cache (Note [oneDNN weight cache]);
// nothing when the kernel convolves a contiguous copy of it instead.
onednn::WeightVersion VersionOf(const Tensor& weight) {
  if (!weight.is_contiguous()) return {};
  return {weight.impl()->version_counter(), weight.version()};
}

// Note [Strided 1x1 convolutions to one pixel]
// A 1x1 convolution with stride and no padding reads only x[:, :, ::sh,
// ::sw]; when that is a single pixel per plane (ResNet-18's last
// downsample on 32x32 images: 2x2 planes, stride 2), it is the same
// convolution at stride 1 over [N, C, 1, 1], whose NCHW bytes are oneDNN's
// nChw16c bytes, so no activation is reordered (Note [Activations in
// nChw16c] in onednn.cc): the forward gathers x[n][c][0][0], backward data
// scatters its [N, C] result into a zeroed input gradient.
bool StridedOneByOneToOnePixel(const ConvShape& s) {
  return s.kh == 1 && s.kw == 1 && s.padding == Int2{0, 0} && s.groups == 1 && s.l() == 1 &&
         s.h * s.w > 1;
}

// The geometry of that stride-1 convolution over [N, C, 1, 1].
onednn::ConvGeometry OnePixelGeometry(const ConvShape& s) {
  return {.n = s.n,
          .c = s.c,
          .h = 1,
          .w = 1,
          .o = s.o,
          .kh = 1,
          .kw = 1,
          .oh = 1,
          .ow = 1,
          .stride = {1, 1},
          .padding = {0, 0},
          .dilation = {1, 1},
          .groups = 1};
}

// y = conv(x, w) + bias (bias may be undefined).
Tensor ConvForward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const ConvParams& p) {
  Tensor x = input.detach().contiguous();
  Tensor w = weight.detach().contiguous();
  const ConvShape s = ShapeOf(x.sizes(), w.sizes(), p);
  Tensor out = empty({s.n, s.o, s.oh, s.ow}, x.options());
  if (out.numel() == 0) return out;
  if (UseOneDnn(x)) {
    Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (StridedOneByOneToOnePixel(s)) {
      Tensor corner = x.view({s.n * s.c, s.h * s.w}).select(1, 0).contiguous();  // [N * C]
      onednn::ConvForward(OnePixelGeometry(s), corner.data_ptr<float>(), w.data_ptr<float>(), bp,
                          out.data_ptr<float>(), /*relu=*/false, VersionOf(weight));
      return out;
    }
    onednn::ConvForward(GeometryOf(s), x.data_ptr<float>(), w.data_ptr<float>(), bp,
                        out.data_ptr<float>(), /*relu=*/false, VersionOf(weight));
    return out;
  }
  if (bias.defined()) out.copy_(bias.detach().view({1, s.o, 1, 1}));
  const double beta = bias.defined() ? 1.0 : 0.0;
  const int64_t og = s.o / p.groups, cg = s.ckk() / p.groups;
  Tensor w2d = w.view({s.o, cg});
  Tensor cols = empty({s.ckk(), s.l()}, x.options());
  for (int64_t n = 0; n < s.n; ++n) {
    Unfold(x, n, s, cols);
    Tensor out_n = out.select(0, n).view({s.o, s.l()});
    for (int64_t g = 0; g < p.groups; ++g) {
      Gemm(out_n.narrow(0, g * og, og), w2d.narrow(0, g * og, og), cols.narrow(0, g * cg, cg),
           beta);
    }
  }
  return out;
}

// The gradient of conv(x, w) with respect to x (of shape x_sizes), given go.
Tensor ConvInputGrad(const Tensor& grad, const Tensor& weight, const IntVector& x_sizes,
                     const ConvParams& p) {
  Tensor go = grad.detach().contiguous();
  Tensor w = weight.detach().contiguous();
  const ConvShape s = ShapeOf(x_sizes, w.sizes(), p);
  // oneDNN's backward data is slower than im2col for an image-like input of
  // a few channels (3-channel 7x7 stride 2: 2.9x, conv_benchmark's conv1).
  const bool few_channels = s.groups == 1 && s.c <= 4;
  if (UseOneDnn(go) && !few_channels && s.n * s.c * s.h * s.w > 0 && go.numel() > 0) {
    if (StridedOneByOneToOnePixel(s)) {
      Tensor corner = empty({s.n * s.c}, go.options());
      onednn::ConvBackwardData(OnePixelGeometry(s), go.data_ptr<float>(), w.data_ptr<float>(),
                               corner.data_ptr<float>(), VersionOf(weight));
      Tensor gx = zeros(x_sizes, go.options());
      gx.view({s.n * s.c, s.h * s.w}).select(1, 0).copy_(corner);
      return gx;
    }
    Tensor gx = empty(x_sizes, go.options());
    onednn::ConvBackwardData(GeometryOf(s), go.data_ptr<float>(), w.data_ptr<float>(),
                             gx.data_ptr<float>(), VersionOf(weight));
    return gx;
  }
  Tensor gx = zeros(x_sizes, go.options());
  if (gx.numel() == 0 || go.numel() == 0) return gx;
  const int64_t og = s.o / p.groups, cg = s.ckk() / p.groups;
  Tensor w2d = w.view({s.o, cg});
  Tensor cols = empty({s.ckk(), s.l()}, go.options());
  for (int64_t n = 0; n < s.n; ++n) {
    Tensor go_n = go.select(0, n).view({s.o, s.l()});
    for (int64_t g = 0; g < p.groups; ++g) {
      Gemm(cols.narrow(0, g * cg, cg), w2d.narrow(0, g * og, og).t(), go_n.narrow(0, g * og, og),
           0.0);
    }
    internal::VisitNnDtype(go.dtype(), "conv2d backward", [&]<typename T>() {
      Col2Im(cols.data_ptr<T>(), s, gx.data_ptr<T>() + n * s.c * s.h * s.w);
    });
  }
  return gx;
}

// Note [Weight gradients of one-pixel outputs]
// When every sample's output is a single pixel (ResNet-18's last stage on
// 32x32 images: 3x3 over a 1x1 plane with padding 1, or 3x3 stride 2 over
// 2x2), gw[o][c][ki][kj] = sum_n go[n][o] * x[n][c][iy(ki)][ix(kj)], and a
// tap whose input position falls in the padding contributes nothing. So the
// gradient is one GEMM, go^T [O, N] times the gathered inputs [N, C * T] of
// the T taps that land inside the image, spread into OIHW with zeros at the
// other taps: written once, in Ember's layout. oneDNN's primitive computes
// every tap and writes its blocked layout, which then has to come back to
// OIHW (512x512x3x3 at batch 16: 1.0-1.1 ms for the primitive alone, this
// path 0.41-0.47 ms; 256x512x3x3 at stride 2: 1.0 against 0.6 ms; in
// conv_benchmark's BM_Conv rows).
bool OnePixelOutput(const ConvShape& s) { return s.groups == 1 && s.l() == 1 && s.n > 0; }

Tensor OnePixelWeightGrad(const Tensor& x, const Tensor& go, const ConvShape& s) {
  std::vector<std::array<int64_t, 3>> taps;  // ki, kj, offset in the plane
  for (int64_t ki = 0; ki < s.kh; ++ki) {
    const int64_t iy = ki * s.dilation[0] - s.padding[0];
    for (int64_t kj = 0; kj < s.kw; ++kj) {
      const int64_t ix = kj * s.dilation[1] - s.padding[1];
      if (iy >= 0 && iy < s.h && ix >= 0 && ix < s.w) taps.push_back({ki, kj, iy * s.w + ix});
    }
  }
  const int64_t t = static_cast<int64_t>(taps.size()), k = s.kh * s.kw;
  Tensor gw = empty({s.o, s.c, s.kh, s.kw}, x.options());
  if (t == 0) return gw.zero_();
  Tensor cols = empty({s.n, s.c * t}, x.options());
  internal::VisitNnDtype(x.dtype(), "conv2d weight gradient", [&]<typename T>() {
    const T* xp = x.data_ptr<T>();
    T* cp = cols.data_ptr<T>();
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t c = 0; c < s.c; ++c) {
        const T* plane = xp + (n * s.c + c) * s.h * s.w;
        T* row = cp + (n * s.c + c) * t;
        for (int64_t j = 0; j < t; ++j) row[j] = plane[taps[j][2]];
      }
    }
  });
  Tensor go2 = go.view({s.n, s.o}).t();  // [O, N]
  if (t == k) {  // every tap inside: the GEMM writes OIHW itself
    Gemm(gw.view({s.o, s.c * k}), go2, cols, 0.0);
    return gw;
  }
  Tensor g = empty({s.o, s.c * t}, x.options());
  Gemm(g, go2, cols, 0.0);
  internal::VisitNnDtype(x.dtype(), "conv2d weight gradient", [&]<typename T>() {
    const T* gp = g.data_ptr<T>();
    T* out = gw.data_ptr<T>();
    std::vector<int64_t> at(t);  // each inside tap's place among the k
    for (int64_t j = 0; j < t; ++j) at[j] = taps[j][0] * s.kw + taps[j][1];
    // A row of gw is zeroed and filled while it is in cache.
    parallel_for(0, s.o, std::max<int64_t>(1, kDefaultGrainSize / (s.c * k)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t o = begin; o < end; ++o) {
                     T* row = out + o * s.c * k;
                     std::memset(row, 0, sizeof(T) * s.c * k);
                     for (int64_t c = 0; c < s.c; ++c) {
                       const T* from = gp + (o * s.c + c) * t;
                       for (int64_t j = 0; j < t; ++j) row[c * k + at[j]] = from[j];
                     }
                   }
                 });
  });
  return gw;
}

// The gradient of conv(x, w) with respect to w (of shape w_sizes), given go;
// and, when `grad_bias` is given, the bias's into it (through oneDNN's
// primitive, which computes both in one pass, or as go's sum).
Tensor ConvWeightGrad(const Tensor& input, const Tensor& grad, const IntVector& w_sizes,
                      const ConvParams& p, Tensor* grad_bias = nullptr) {
  Tensor x = input.detach().contiguous();
  Tensor go = grad.detach().contiguous();
  const ConvShape s = ShapeOf(x.sizes(), w_sizes, p);
  if (OnePixelOutput(s) && x.numel() > 0 && go.numel() > 0) {
    if (grad_bias != nullptr) *grad_bias = go.sum(/*dims=*/{0, 2, 3});
    return OnePixelWeightGrad(x, go, s);
  }
  if (UseOneDnn(x) && x.numel() > 0 && go.numel() > 0) {
    Tensor gw = empty(w_sizes, x.options());
    Tensor gb = grad_bias != nullptr ? empty({s.o}, x.options()) : Tensor();
    onednn::ConvBackwardWeights(GeometryOf(s), x.data_ptr<float>(), go.data_ptr<float>(),
                                gw.data_ptr<float>(), gb.defined() ? gb.data_ptr<float>() : nullptr);
    if (grad_bias != nullptr) *grad_bias = gb;
    return gw;
  }
  if (grad_bias != nullptr) *grad_bias = go.sum(/*dims=*/{0, 2, 3});
  const int64_t og = s.o / p.groups, cg = s.ckk() / p.groups;
  Tensor gw = zeros({s.o, cg}, x.options());
  if (x.numel() == 0 || go.numel() == 0) return gw.view(w_sizes);
  Tensor cols = empty({s.ckk(), s.l()}, x.options());
  for (int64_t n = 0; n < s.n; ++n) {
    Tensor go_n = go.select(0, n).view({s.o, s.l()});
    Unfold(x, n, s, cols);
    for (int64_t g = 0; g < p.groups; ++g) {
      Gemm(gw.narrow(0, g * og, og), go_n.narrow(0, g * og, og), cols.narrow(0, g * cg, cg).t(),
           1.0);
    }
  }
  return gw.view(w_sizes);
}

}  // namespace

// The conv2d slots (nn/conv_kernels.h), filled per device type.
namespace internal {
constinit DeviceKernel<ConvForwardFn> conv2d_forward{"conv2d forward"};
constinit DeviceKernel<ConvInputGradFn> conv2d_input_grad{"conv2d input gradient"};
constinit DeviceKernel<ConvWeightGradFn> conv2d_weight_grad{"conv2d weight gradient"};
}  // namespace internal

namespace {

EMBER_REGISTER_NN_KERNEL(internal::conv2d_forward, DeviceType::kCPU, internal::InFloat32<&ConvForward>);
EMBER_REGISTER_NN_KERNEL(internal::conv2d_input_grad, DeviceType::kCPU, internal::InFloat32<&ConvInputGrad>);
EMBER_REGISTER_NN_KERNEL(internal::conv2d_weight_grad, DeviceType::kCPU, internal::InFloat32<&ConvWeightGrad>);

// Each runs its slot's kernel for the device of its first argument.
Tensor ConvForwardOn(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p) {
  return internal::conv2d_forward(x.device())(x.detach(), w.detach(),
                                              b.defined() ? b.detach() : Tensor(), p);
}
Tensor ConvInputGradOn(const Tensor& go, const Tensor& w, const IntVector& x_sizes,
                       const ConvParams& p) {
  return internal::conv2d_input_grad(go.device())(go.detach(), w.detach(), x_sizes, p);
}
Tensor ConvWeightGradOn(const Tensor& x, const Tensor& go, const IntVector& w_sizes,
                        const ConvParams& p, Tensor* grad_bias = nullptr) {
  return internal::conv2d_weight_grad(x.device())(x.detach(), go.detach(), w_sizes, p, grad_bias);
}

void SaveParams(AutogradContext* ctx, const ConvParams& p) {
  ctx->saved_data["params"] = IntVector{p.stride[0],   p.stride[1],   p.padding[0], p.padding[1],
                                        p.dilation[0], p.dilation[1], p.groups};
}

ConvParams LoadParams(AutogradContext* ctx) {
  const IntVector v = std::get<IntVector>(ctx->saved_data["params"]);
  return {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, v[6]};
}

IntVector SizesOf(const Tensor& t) { return IntVector(t.sizes().begin(), t.sizes().end()); }

// Note [Convolution double backward]
// y = C(x, w) is bilinear, and so are its two gradients: gx = Cx(go, w) (a
// transposed convolution) and gw = Cw(x, go) (a correlation). From
// <ggx, Cx(go, w)> = <C(ggx, w), go> = <Cw(ggx, go), w> and
// <ggw, Cw(x, go)> = <C(x, ggw), go> = <Cx(go, ggw), x>, the backward of each of
// the three is written in the other two and itself, so Conv2dFunction,
// ConvInputGradFunction and ConvWeightGradFunction close under
// differentiation. The backward kernels run directly unless create_graph asks
// for a graph.
struct Conv2dFunction;

struct ConvInputGradFunction : autograd::Function<ConvInputGradFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& grad, const Tensor& weight,
                        IntVector x_sizes, ConvParams p) {
    ctx->save_for_backward({grad, weight});
    ctx->saved_data["x_sizes"] = x_sizes;
    SaveParams(ctx, p);
    return ConvInputGradOn(grad, weight, x_sizes, p);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs);
};
struct ConvWeightGradFunction : autograd::Function<ConvWeightGradFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& grad,
                        IntVector w_sizes, ConvParams p) {
    ctx->save_for_backward({input, grad});
    ctx->saved_data["w_sizes"] = w_sizes;
    SaveParams(ctx, p);
    return ConvWeightGradOn(input, grad, w_sizes, p);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs);
};

struct Conv2dFunction : autograd::Function<Conv2dFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, ConvParams p) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = bias.defined();
    SaveParams(ctx, p);
    return ConvForwardOn(input, weight, bias, p);
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(4);
    const Tensor& go = grad_outputs[0];
    if (!go.defined()) return grads;
    std::vector<Tensor> saved = ctx->get_saved_variables();
    const ConvParams p = LoadParams(ctx);
    const bool record = autograd::GradMode::is_enabled();
    if (ctx->needs_input_grad(0)) {
      grads[0] = record ? ConvInputGradFunction::apply(go, saved[1], SizesOf(saved[0]), p)
                        : ConvInputGradOn(go, saved[1], SizesOf(saved[0]), p);
    }
    const bool bias_grad = ctx->needs_input_grad(2) && std::get<bool>(ctx->saved_data["has_bias"]);
    if (ctx->needs_input_grad(1) && !record) {
      // The bias gradient comes with the weight's (one pass over go).
      grads[1] =
          ConvWeightGradOn(saved[0], go, SizesOf(saved[1]), p, bias_grad ? &grads[2] : nullptr);
      return grads;
    }
    if (ctx->needs_input_grad(1)) {
      grads[1] = ConvWeightGradFunction::apply(saved[0], go, SizesOf(saved[1]), p);
    }
    if (bias_grad) grads[2] = go.sum(/*dims=*/{0, 2, 3});  // Recorded under create_graph.
    return grads;
  }
};

std::vector<Tensor> ConvInputGradFunction::backward(AutogradContext* ctx,
                                                    std::vector<Tensor> grad_outputs) {
  // Inputs (go, w); ggx = grad_outputs[0] has x's shape.
  std::vector<Tensor> grads(4);
  const Tensor& ggx = grad_outputs[0];
  if (!ggx.defined()) return grads;
  std::vector<Tensor> saved = ctx->get_saved_variables();
  const ConvParams p = LoadParams(ctx);
  if (ctx->needs_input_grad(0)) grads[0] = Conv2dFunction::apply(ggx, saved[1], Tensor(), p);
  if (ctx->needs_input_grad(1)) {
    grads[1] = ConvWeightGradFunction::apply(ggx, saved[0], SizesOf(saved[1]), p);
  }
  return grads;
}

std::vector<Tensor> ConvWeightGradFunction::backward(AutogradContext* ctx,
                                                     std::vector<Tensor> grad_outputs) {
  // Inputs (x, go); ggw = grad_outputs[0] has w's shape.
  std::vector<Tensor> grads(4);
  const Tensor& ggw = grad_outputs[0];
  if (!ggw.defined()) return grads;
  std::vector<Tensor> saved = ctx->get_saved_variables();
  const ConvParams p = LoadParams(ctx);
  if (ctx->needs_input_grad(0)) {
    grads[0] = ConvInputGradFunction::apply(saved[1], ggw, SizesOf(saved[0]), p);
  }
  if (ctx->needs_input_grad(1)) grads[1] = Conv2dFunction::apply(saved[0], ggw, Tensor(), p);
  return grads;
}

std::string PairString(Int2 p) { return absl::StrCat("(", p[0], ", ", p[1], ")"); }

}  // namespace

namespace functional {

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Int2 stride,
              Int2 padding, Int2 dilation, int64_t groups) {
  if (auto cast = ember::internal::MaybeAutocast("conv2d", conv2d, input, weight, bias, stride,
                                                 padding, dilation, groups)) {
    return *std::move(cast);
  }
  EMBER_CHECK(input.defined(), "conv2d: input is an undefined tensor");
  internal::CheckDevice(weight, input.device(), "conv2d", "weight");
  if (input.dim() == 3) {
    return conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  }
  EMBER_CHECK(input.dim() == 4, "conv2d: expected a 3-D or 4-D input [N, C, H, W], got shape ",
              ShapeToString(input.sizes()));
  EMBER_CHECK(weight.dim() == 4, "conv2d: expected a 4-D weight [O, C/groups, kh, kw], got shape ",
              ShapeToString(weight.sizes()));
  internal::CheckSameDtype(input, weight, "conv2d", "input", "weight");
  EMBER_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups);
  for (int i = 0; i < 2; ++i) {
    EMBER_CHECK(stride[i] > 0, "conv2d: stride must be positive, got ", PairString(stride));
    EMBER_CHECK(padding[i] >= 0, "conv2d: padding must be non-negative, got ", PairString(padding));
    EMBER_CHECK(dilation[i] > 0, "conv2d: dilation must be positive, got ", PairString(dilation));
  }
  EMBER_CHECK(input.size(1) == weight.size(1) * groups, "conv2d: expected input ",
              ShapeToString(input.sizes()), " to have ", weight.size(1) * groups,
              " channels (weight ", ShapeToString(weight.sizes()), ", groups=", groups,
              "), but got ", input.size(1), " channels instead");
  EMBER_CHECK(weight.size(0) % groups == 0, "conv2d: out_channels (", weight.size(0),
              ") must be divisible by groups (", groups, ")");
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
                "conv2d: expected a bias of "
                "shape [",
                weight.size(0), "], got ", ShapeToString(bias.sizes()));
    internal::CheckSameDtype(bias, weight, "conv2d", "bias", "weight");
    internal::CheckDevice(bias, input.device(), "conv2d", "bias");
  }
  for (int i = 0; i < 2; ++i) {
    const int64_t padded = input.size(2 + i) + 2 * padding[i];
    const int64_t extent = dilation[i] * (weight.size(2 + i) - 1) + 1;
    EMBER_CHECK(padded >= extent, "conv2d: calculated padded input size per channel: (",
                input.size(2) + 2 * padding[0], " x ", input.size(3) + 2 * padding[1],
                "). Kernel size: (", dilation[0] * (weight.size(2) - 1) + 1, " x ",
                dilation[1] * (weight.size(3) - 1) + 1,
                "). Kernel size can't be greater than actual input size");
  }
  return Conv2dFunction::apply(input, weight, bias, ConvParams{stride, padding, dilation, groups});
}

}  // namespace functional

namespace grad {

namespace {
// Checks grad_output against the geometry that input and weight sizes give.
void CheckGradOutput(IntArrayRef x, IntArrayRef w, const Tensor& grad_output, const ConvParams& p,
                     const char* op) {
  EMBER_CHECK(grad_output.defined(), op, ": grad_output is an undefined tensor");
  EMBER_CHECK(x.size() == 4 && w.size() == 4, op, ": expected a 4-D input size and weight size, got ",
              ShapeToString(x), " and ", ShapeToString(w));
  EMBER_CHECK(p.groups > 0 && x[1] == w[1] * p.groups && w[0] % p.groups == 0, op,
              ": input size ", ShapeToString(x), " and weight size ", ShapeToString(w),
              " do not fit groups=", p.groups);
  const ConvShape s = ShapeOf(x, w, p);
  EMBER_CHECK(grad_output.dim() == 4 && grad_output.size(0) == s.n && grad_output.size(1) == s.o &&
                  grad_output.size(2) == s.oh && grad_output.size(3) == s.ow,
              op, ": expected grad_output of shape [", s.n, ", ", s.o, ", ", s.oh, ", ", s.ow,
              "] for input size ", ShapeToString(x), " and weight size ", ShapeToString(w),
              ", got ", ShapeToString(grad_output.sizes()));
}
}  // namespace

Tensor conv2d_input(IntArrayRef input_size, const Tensor& weight, const Tensor& grad_output,
                    Int2 stride, Int2 padding, Int2 dilation, int64_t groups) {
  const ConvParams p{stride, padding, dilation, groups};
  EMBER_CHECK(grad_output.defined(), "conv2d_input: grad_output is an undefined tensor");
  internal::CheckDevice(weight, grad_output.device(), "conv2d_input", "weight");
  CheckGradOutput(input_size, weight.sizes(), grad_output, p, "conv2d_input");
  internal::CheckSameDtype(grad_output, weight, "conv2d_input", "grad_output", "weight");
  return ConvInputGradFunction::apply(grad_output, weight,
                                      IntVector(input_size.begin(), input_size.end()), p);
}

Tensor conv2d_weight(const Tensor& input, IntArrayRef weight_size, const Tensor& grad_output,
                     Int2 stride, Int2 padding, Int2 dilation, int64_t groups) {
  const ConvParams p{stride, padding, dilation, groups};
  EMBER_CHECK(input.defined(), "conv2d_weight: input is an undefined tensor");
  internal::CheckDevice(grad_output, input.device(), "conv2d_weight", "grad_output");
  CheckGradOutput(input.sizes(), weight_size, grad_output, p, "conv2d_weight");
  internal::CheckSameDtype(grad_output, input, "conv2d_weight", "grad_output", "input");
  return ConvWeightGradFunction::apply(input, grad_output,
                                       IntVector(weight_size.begin(), weight_size.end()), p);
}

}  // namespace grad

Conv2d::Conv2d(Conv2dOptions options) : options_(options) {
  const Conv2dOptions& o = options_;
  EMBER_CHECK(o.in_channels > 0 && o.out_channels > 0,
              "Conv2d: in_channels and out_channels "
              "must be positive, got ",
              o.in_channels, " and ", o.out_channels);
  EMBER_CHECK(o.groups > 0, "Conv2d: groups must be positive, got ", o.groups);
  EMBER_CHECK(o.in_channels % o.groups == 0, "Conv2d: in_channels must be divisible by groups (",
              o.in_channels, " and ", o.groups, ")");
  EMBER_CHECK(o.out_channels % o.groups == 0, "Conv2d: out_channels must be divisible by groups (",
              o.out_channels, " and ", o.groups, ")");
  EMBER_CHECK(o.kernel_size[0] > 0 && o.kernel_size[1] > 0,
              "Conv2d: kernel_size must be positive, got ", PairString(o.kernel_size));
  reset();
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
               int64_t padding)
    : Conv2d(Conv2dOptions{.in_channels = in_channels,
                           .out_channels = out_channels,
                           .kernel_size = {kernel_size, kernel_size},
                           .stride = {stride, stride},
                           .padding = {padding, padding}}) {}

void Conv2d::reset() {
  const Conv2dOptions& o = options_;
  register_parameter("weight", empty({o.out_channels, o.in_channels / o.groups, o.kernel_size[0],
                                      o.kernel_size[1]}));
  register_parameter("bias", o.bias ? empty({o.out_channels}) : Tensor());
  if (!InClone()) reset_parameters();
}

void Conv2d::reset_parameters() {
  init::kaiming_uniform_(weight(), std::sqrt(5.0));
  if (bias().defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight()).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias(), -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  return functional::conv2d(input, weight(), bias(), options_.stride, options_.padding,
                            options_.dilation, options_.groups);
}

std::string Conv2d::extra_repr() const {
  const Conv2dOptions& o = options_;
  std::string s =
      absl::StrCat(o.in_channels, ", ", o.out_channels, ", kernel_size=", PairString(o.kernel_size),
                   ", stride=", PairString(o.stride));
  if (o.padding != Int2{0, 0}) absl::StrAppend(&s, ", padding=", PairString(o.padding));
  if (o.dilation != Int2{1, 1}) absl::StrAppend(&s, ", dilation=", PairString(o.dilation));
  if (o.groups != 1) absl::StrAppend(&s, ", groups=", o.groups);
  if (!o.bias) absl::StrAppend(&s, ", bias=False");
  return s;
}

}  // namespace ember::nn
