#include "nn/pooling.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "nn/kernel_util.h"
#include "nn/pooling_kernels.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;
using IntVector = std::vector<int64_t>;

std::string PairString(Int2 p) { return absl::StrCat("(", p[0], ", ", p[1], ")"); }

// PyTorch's pooling output size, ceil_mode included.
int64_t PoolOutputSize(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation,
                       bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (span < 0 ? -((-span + stride - 1) / stride) : span / stride) + 1;
  // The last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// Checks an [N, C, H, W] input and the pool geometry; returns {OH, OW}.
Int2 CheckPool(const char* op, const Tensor& x, Int2 kernel, Int2 stride, Int2 padding,
               Int2 dilation, bool ceil_mode) {
  EMBER_CHECK(x.defined(), op, ": input is an undefined tensor");
  EMBER_CHECK(x.dim() == 4, op, ": expected a 3-D or 4-D input, got shape ",
              ShapeToString(x.sizes()));
  Int2 out;
  for (int i = 0; i < 2; ++i) {
    EMBER_CHECK(kernel[i] > 0, op, ": kernel_size must be greater than zero, but got ",
                PairString(kernel));
    EMBER_CHECK(stride[i] > 0, op, ": stride must be greater than zero, but got ",
                PairString(stride));
    EMBER_CHECK(dilation[i] > 0, op, ": dilation must be greater than zero, but got ",
                PairString(dilation));
    EMBER_CHECK(
        padding[i] >= 0 && padding[i] <= (dilation[i] * (kernel[i] - 1) + 1) / 2, op,
        ": pad should be at most half of effective kernel size, but got pad=", PairString(padding),
        ", kernel_size=", PairString(kernel), " and dilation=", PairString(dilation));
    out[i] =
        PoolOutputSize(x.size(2 + i), kernel[i], padding[i], stride[i], dilation[i], ceil_mode);
  }
  EMBER_CHECK(out[0] >= 1 && out[1] >= 1, op, ": given input size: (", x.size(1), "x", x.size(2),
              "x", x.size(3), "). Calculated output size: (", x.size(1), "x", out[0], "x", out[1],
              "). Output size is too small");
  return out;
}

Int2 DefaultStride(Int2 stride, Int2 kernel) { return stride == Int2{0, 0} ? kernel : stride; }

// Runs `f` on x viewed as [N, C, H, W], restoring a 3-D input's shape.
template <typename F>
Tensor With4d(const Tensor& x, F f) {
  if (x.defined() && x.dim() == 3) return f(x.unsqueeze(0)).squeeze(0);
  return f(x);
}

// Note [Pooling double backward]
// Max pooling's backward scatters g to the saved argmax indices, and the
// derivative of that scatter is the gather at the same indices (and back):
// MaxPoolScatterFunction and MaxPoolGatherFunction are each other's backward,
// so every order is exact. An average pool is linear, so its backward (the
// adjoint: each output's gradient spread over its window) has the pool itself
// as its backward. The backward kernels run directly unless create_graph
// asks for a graph.

// Planes per parallel_for chunk: about kDefaultGrainSize elements. Every
// plane is computed whole by one thread, so the split changes no result.
int64_t PlaneGrain(int64_t plane_elements) {
  return std::max<int64_t>(1, kDefaultGrainSize / std::max<int64_t>(1, plane_elements));
}

// gx[plane, indices[plane, j]] += g[plane, j] into an input-shaped zero tensor.
// Planes split across threads, each serial over its outputs (so in their
// order); the window is not needed.
Tensor MaxPoolScatter(const Tensor& grad, const Tensor& indices, const IntVector& sizes,
                      const internal::MaxPoolWindow& /*window*/) {
  Tensor g = grad.detach().contiguous();
  Tensor gx = zeros(sizes, g.options());
  const int64_t planes = sizes[0] * sizes[1], hw = sizes[2] * sizes[3];
  const int64_t l = indices.size(2) * indices.size(3);
  internal::VisitNnDtype(g.dtype(), "max_pool2d backward", [&]<typename T>() {
    const T* pg = g.data_ptr<T>();
    const int64_t* pi = indices.data_ptr<int64_t>();
    T* px = gx.data_ptr<T>();
    parallel_for(0, planes, PlaneGrain(hw), [&](int64_t first, int64_t last) {
      for (int64_t plane = first; plane < last; ++plane) {
        for (int64_t j = 0; j < l; ++j) {
          const int64_t idx = pi[plane * l + j];
          if (idx >= 0) px[plane * hw + idx] += pg[plane * l + j];
        }
      }
    });
  });
  return gx;
}

// out[plane, j] = x[plane, indices[plane, j]] (0 for an empty window).
Tensor MaxPoolGather(const Tensor& input, const Tensor& indices) {
  Tensor x = input.detach().contiguous();
  Tensor out = empty(indices.sizes(), x.options());
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  const int64_t l = indices.size(2) * indices.size(3);
  internal::VisitNnDtype(x.dtype(), "max_pool2d double backward", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    const int64_t* pi = indices.data_ptr<int64_t>();
    T* po = out.data_ptr<T>();
    parallel_for(0, planes, PlaneGrain(hw), [&](int64_t first, int64_t last) {
      for (int64_t plane = first; plane < last; ++plane) {
        for (int64_t j = 0; j < l; ++j) {
          const int64_t idx = pi[plane * l + j];
          po[plane * l + j] = idx >= 0 ? px[plane * hw + idx] : T(0);
        }
      }
    });
  });
  return out;
}

// The unsigned integer of T's width, for selecting without branches.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

// The max pool's CPU kernel: each window's maximum and its index in the plane.
std::array<Tensor, 2> MaxPool2dCpu(const Tensor& input, Int2 kernel, Int2 stride, Int2 padding,
                                   Int2 dilation, Int2 out_size) {
  Tensor x = input.detach().contiguous();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = out_size[0], ow = out_size[1];
  Tensor out = empty({n, c, oh, ow}, x.options());
  Tensor indices = empty({n, c, oh, ow}, kInt64);
  internal::VisitNnDtype(x.dtype(), "max_pool2d", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    int64_t* pi = indices.data_ptr<int64_t>();
    // Tap by tap over a whole output row, so that the inner loop runs over
    // output columns without branches (random data mispredicts a per-window
    // comparison) and keeps, per column, the first maximum in window order
    // or the first NaN. The geometry is copied into locals, which the stores
    // could otherwise alias.
    const int64_t kh = kernel[0], kw = kernel[1], sy = stride[0], sx = stride[1];
    const int64_t pad_y = padding[0], pad_x = padding[1], dy = dilation[0], dx = dilation[1];
    // Per kernel column kj, the output columns [first, last) whose tap
    // ix = ox * sx + off (off = kj * dx - pad_x) lies inside the row.
    std::vector<int64_t> first(kw), last(kw);
    for (int64_t kj = 0; kj < kw; ++kj) {
      const int64_t off = kj * dx - pad_x;
      first[kj] = off >= 0 ? 0 : (-off + sx - 1) / sx;
      last[kj] = off >= w ? 0 : std::min(ow, (w - 1 - off) / sx + 1);
    }
    parallel_for(0, n * c, PlaneGrain(h * w), [&](int64_t first_plane, int64_t last_plane) {
      for (int64_t plane = first_plane; plane < last_plane; ++plane) {
        const T* in = px + plane * h * w;
        for (int64_t oy = 0; oy < oh; ++oy) {
          T* __restrict best = po + (plane * oh + oy) * ow;
          int64_t* __restrict best_index = pi + (plane * oh + oy) * ow;
          std::fill(best, best + ow, -std::numeric_limits<T>::infinity());
          std::fill(best_index, best_index + ow, int64_t{-1});
          for (int64_t ki = 0; ki < kh; ++ki) {
            const int64_t iy = oy * sy - pad_y + ki * dy;
            if (iy < 0 || iy >= h) continue;
            const T* __restrict row = in + iy * w;
            for (int64_t kj = 0; kj < kw; ++kj) {
              const int64_t off = kj * dx - pad_x;
              for (int64_t ox = first[kj]; ox < last[kj]; ++ox) {
                const int64_t ix = ox * sx + off;
                const T v = row[ix];
                const T b = best[ox];
                const int64_t i = best_index[ox];
                // All ones where this tap wins: no window value yet, a larger
                // value, or the first NaN.
                const int64_t take =
                    -static_cast<int64_t>((i < 0) | (v > b) | ((v != v) & (b == b)));
                best[ox] =
                    std::bit_cast<T>((std::bit_cast<Bits<T>>(v) & static_cast<Bits<T>>(take)) |
                                     (std::bit_cast<Bits<T>>(b) & ~static_cast<Bits<T>>(take)));
                best_index[ox] = ((iy * w + ix) & take) | (i & ~take);
              }
            }
          }
        }
      }
    });
  });
  return {out, indices};
}

}  // namespace

// The pooling slots (nn/pooling_kernels.h), filled per device type.
namespace internal {
constinit DeviceKernel<MaxPool2dForwardFn> max_pool2d_forward{"max_pool2d forward"};
constinit DeviceKernel<MaxPool2dScatterFn> max_pool2d_scatter{"max_pool2d backward"};
constinit DeviceKernel<MaxPool2dGatherFn> max_pool2d_gather{"max_pool2d double backward"};
constinit DeviceKernel<AvgPool2dForwardFn> avg_pool2d_forward{"avg_pool2d forward"};
constinit DeviceKernel<AvgPool2dAdjointFn> avg_pool2d_adjoint{"avg_pool2d backward"};
}  // namespace internal

namespace {

EMBER_REGISTER_NN_KERNEL(internal::max_pool2d_forward, DeviceType::kCPU, internal::InFloat32<&MaxPool2dCpu>);
EMBER_REGISTER_NN_KERNEL(internal::max_pool2d_scatter, DeviceType::kCPU, internal::InFloat32<&MaxPoolScatter>);
EMBER_REGISTER_NN_KERNEL(internal::max_pool2d_gather, DeviceType::kCPU, internal::InFloat32<&MaxPoolGather>);

struct MaxPoolGatherFunction;

// A window as saved data (kernel, stride, padding, dilation; rows then
// columns) and back.
IntVector WindowData(const internal::MaxPoolWindow& w) {
  return {w.kernel[0],  w.kernel[1],  w.stride[0],   w.stride[1],
          w.padding[0], w.padding[1], w.dilation[0], w.dilation[1]};
}
internal::MaxPoolWindow SavedWindow(AutogradContext* ctx) {
  const IntVector v = std::get<IntVector>(ctx->saved_data["window"]);
  return {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, {v[6], v[7]}};
}

struct MaxPoolScatterFunction : autograd::Function<MaxPoolScatterFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& grad, const Tensor& indices,
                        IntVector sizes, const internal::MaxPoolWindow& window) {
    ctx->save_for_backward({indices});
    ctx->saved_data["window"] = WindowData(window);
    return internal::max_pool2d_scatter(grad.device())(grad.detach(), indices, sizes, window);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs);
};

struct MaxPoolGatherFunction : autograd::Function<MaxPoolGatherFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& indices,
                        const internal::MaxPoolWindow& window) {
    ctx->save_for_backward({indices});
    ctx->saved_data["input_sizes"] = IntVector(input.sizes().begin(), input.sizes().end());
    ctx->saved_data["window"] = WindowData(window);
    return internal::max_pool2d_gather(input.device())(input.detach(), indices);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(3);
    if (!grad_outputs[0].defined()) return grads;
    grads[0] = MaxPoolScatterFunction::apply(
        grad_outputs[0], ctx->get_saved_variables()[0],
        std::get<std::vector<int64_t>>(ctx->saved_data["input_sizes"]), SavedWindow(ctx));
    return grads;
  }
};

std::vector<Tensor> MaxPoolScatterFunction::backward(AutogradContext* ctx,
                                                     std::vector<Tensor> grad_outputs) {
  std::vector<Tensor> grads(4);
  if (!grad_outputs[0].defined()) return grads;
  grads[0] = MaxPoolGatherFunction::apply(grad_outputs[0], ctx->get_saved_variables()[0],
                                          SavedWindow(ctx));
  return grads;
}

struct MaxPool2dFunction : autograd::Function<MaxPool2dFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, Int2 kernel, Int2 stride,
                        Int2 padding, Int2 dilation, Int2 out_size) {
    auto [out, indices] = internal::max_pool2d_forward(input.device())(
        input.detach(), kernel, stride, padding, dilation, out_size);
    ctx->save_for_backward({indices});
    ctx->saved_data["input_sizes"] = IntVector(input.sizes().begin(), input.sizes().end());
    ctx->saved_data["window"] = WindowData({kernel, stride, padding, dilation});
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(6);
    if (!grad_outputs[0].defined()) return grads;
    Tensor indices = ctx->get_saved_variables()[0];
    const IntVector sizes = std::get<std::vector<int64_t>>(ctx->saved_data["input_sizes"]);
    const internal::MaxPoolWindow window = SavedWindow(ctx);
    grads[0] = autograd::GradMode::is_enabled()
                   ? MaxPoolScatterFunction::apply(grad_outputs[0], indices, sizes, window)
                   : internal::max_pool2d_scatter(indices.device())(grad_outputs[0].detach(),
                                                                    indices, sizes, window);
    return grads;
  }
};

// The windows of an average pool along one dim: [start, end) clipped to the
// input, and the count each output divides by.
struct Windows {
  IntVector start, end, count;
};

Windows AvgWindows(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t pad,
                   bool count_include_pad) {
  Windows w;
  for (int64_t o = 0; o < out; ++o) {
    int64_t s = o * stride - pad;
    int64_t e = std::min(s + kernel, in + pad);
    const int64_t padded = e - s;
    s = std::max<int64_t>(s, 0);
    e = std::min(e, in);
    w.start.push_back(s);
    w.end.push_back(e);
    w.count.push_back(count_include_pad ? padded : e - s);
  }
  return w;
}

Windows AdaptiveWindows(int64_t in, int64_t out) {
  Windows w;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t s = (o * in) / out;
    const int64_t e = ((o + 1) * in + out - 1) / out;
    w.start.push_back(s);
    w.end.push_back(e);
    w.count.push_back(e - s);
  }
  return w;
}

using internal::AvgPlan;

// Averages x over the product of row and column windows.
Tensor AvgPool(const Tensor& input, const AvgPlan& p) {
  Tensor x = input.detach().contiguous();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = static_cast<int64_t>(p.ys.size()), ow = static_cast<int64_t>(p.xs.size());
  Tensor out = empty({n, c, oh, ow}, x.options());
  internal::VisitNnDtype(x.dtype(), "avg_pool2d", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(0, n * c, PlaneGrain(h * w), [&](int64_t first_plane, int64_t last_plane) {
      for (int64_t plane = first_plane; plane < last_plane; ++plane) {
        const T* in = px + plane * h * w;
        for (int64_t oy = 0; oy < oh; ++oy) {
          for (int64_t ox = 0; ox < ow; ++ox) {
            T sum = 0;
            for (int64_t iy = p.ys[oy]; iy < p.ye[oy]; ++iy) {
              for (int64_t ix = p.xs[ox]; ix < p.xe[ox]; ++ix) sum += in[iy * w + ix];
            }
            const int64_t count = p.yc[oy] * p.xc[ox];
            po[(plane * oh + oy) * ow + ox] = count > 0 ? sum / static_cast<T>(count) : T(0);
          }
        }
      }
    });
  });
  return out;
}

// The adjoint of AvgPool: each output's gradient spread evenly over its window.
Tensor AvgPoolAdjoint(const Tensor& grad, const AvgPlan& p) {
  Tensor g = grad.detach().contiguous();
  Tensor gx = zeros(p.sizes, g.options());
  const int64_t planes = p.sizes[0] * p.sizes[1], w = p.sizes[3];
  const int64_t oh = static_cast<int64_t>(p.ys.size()), ow = static_cast<int64_t>(p.xs.size());
  internal::VisitNnDtype(g.dtype(), "avg_pool2d backward", [&]<typename T>() {
    const T* pg = g.data_ptr<T>();
    T* px = gx.data_ptr<T>();
    parallel_for(0, planes, PlaneGrain(p.sizes[2] * w), [&](int64_t first, int64_t last) {
      for (int64_t plane = first; plane < last; ++plane) {
        T* out = px + plane * p.sizes[2] * w;
        for (int64_t oy = 0; oy < oh; ++oy) {
          for (int64_t ox = 0; ox < ow; ++ox) {
            const int64_t count = p.yc[oy] * p.xc[ox];
            if (count == 0) continue;
            const T share = pg[(plane * oh + oy) * ow + ox] / static_cast<T>(count);
            for (int64_t iy = p.ys[oy]; iy < p.ye[oy]; ++iy) {
              for (int64_t ix = p.xs[ox]; ix < p.xe[ox]; ++ix) out[iy * w + ix] += share;
            }
          }
        }
      }
    });
  });
  return gx;
}

EMBER_REGISTER_NN_KERNEL(internal::avg_pool2d_forward, DeviceType::kCPU, internal::InFloat32<&AvgPool>);
EMBER_REGISTER_NN_KERNEL(internal::avg_pool2d_adjoint, DeviceType::kCPU, internal::InFloat32<&AvgPoolAdjoint>);

void SavePlan(AutogradContext* ctx, const AvgPlan& p) {
  ctx->saved_data["sizes"] = p.sizes;
  ctx->saved_data["ys"] = p.ys;
  ctx->saved_data["ye"] = p.ye;
  ctx->saved_data["yc"] = p.yc;
  ctx->saved_data["xs"] = p.xs;
  ctx->saved_data["xe"] = p.xe;
  ctx->saved_data["xc"] = p.xc;
}

AvgPlan LoadPlan(AutogradContext* ctx) {
  auto get = [&](const char* key) { return std::get<IntVector>(ctx->saved_data[key]); };
  return {get("sizes"), get("ys"), get("ye"), get("yc"), get("xs"), get("xe"), get("xc")};
}

// Note [Pooling double backward]: AvgPoolFunction and AvgPoolAdjointFunction
// are each other's backward.
struct AvgPoolAdjointFunction;

struct AvgPoolFunction : autograd::Function<AvgPoolFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, AvgPlan plan) {
    SavePlan(ctx, plan);
    return internal::avg_pool2d_forward(input.device())(input.detach(), plan);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs);
};

struct AvgPoolAdjointFunction : autograd::Function<AvgPoolAdjointFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& grad, AvgPlan plan) {
    SavePlan(ctx, plan);
    return internal::avg_pool2d_adjoint(grad.device())(grad.detach(), plan);
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    std::vector<Tensor> grads(2);
    if (grad_outputs[0].defined())
      grads[0] = AvgPoolFunction::apply(grad_outputs[0], LoadPlan(ctx));
    return grads;
  }
};

std::vector<Tensor> AvgPoolFunction::backward(AutogradContext* ctx,
                                              std::vector<Tensor> grad_outputs) {
  std::vector<Tensor> grads(2);
  if (!grad_outputs[0].defined()) return grads;
  const AvgPlan plan = LoadPlan(ctx);
  grads[0] =
      autograd::GradMode::is_enabled()
          ? AvgPoolAdjointFunction::apply(grad_outputs[0], plan)
          : internal::avg_pool2d_adjoint(grad_outputs[0].device())(grad_outputs[0].detach(), plan);
  return grads;
}

}  // namespace

namespace functional {

Tensor max_pool2d(const Tensor& input, const MaxPool2dOptions& options) {
  return With4d(input, [&](const Tensor& x) {
    const Int2 stride = DefaultStride(options.stride, options.kernel_size);
    const Int2 out = CheckPool("max_pool2d", x, options.kernel_size, stride, options.padding,
                               options.dilation, options.ceil_mode);
    internal::CheckNnDtype(x, "max_pool2d");
    return MaxPool2dFunction::apply(x, options.kernel_size, stride, options.padding,
                                    options.dilation, out);
  });
}

Tensor avg_pool2d(const Tensor& input, const AvgPool2dOptions& options) {
  return With4d(input, [&](const Tensor& x) {
    const Int2 stride = DefaultStride(options.stride, options.kernel_size);
    const Int2 k = options.kernel_size, p = options.padding;
    for (int i = 0; i < 2; ++i) {
      EMBER_CHECK(p[i] <= k[i] / 2,
                  "avg_pool2d: pad should be at most half of kernel size, but "
                  "got pad=",
                  PairString(p), " and kernel_size=", PairString(k));
    }
    const Int2 out = CheckPool("avg_pool2d", x, k, stride, p, {1, 1}, options.ceil_mode);
    internal::CheckNnDtype(x, "avg_pool2d");
    Windows rows = AvgWindows(x.size(2), out[0], k[0], stride[0], p[0], options.count_include_pad);
    Windows cols = AvgWindows(x.size(3), out[1], k[1], stride[1], p[1], options.count_include_pad);
    return AvgPoolFunction::apply(
        x, AvgPlan{IntVector(x.sizes().begin(), x.sizes().end()), rows.start, rows.end, rows.count,
                   cols.start, cols.end, cols.count});
  });
}

Tensor adaptive_avg_pool2d(const Tensor& input, Int2 output_size) {
  return With4d(input, [&](const Tensor& x) {
    EMBER_CHECK(x.defined(), "adaptive_avg_pool2d: input is an undefined tensor");
    EMBER_CHECK(x.dim() == 4, "adaptive_avg_pool2d: expected a 3-D or 4-D input, got shape ",
                ShapeToString(x.sizes()));
    EMBER_CHECK(output_size[0] > 0 && output_size[1] > 0,
                "adaptive_avg_pool2d: output_size must be positive, got ", PairString(output_size));
    EMBER_CHECK(x.size(2) > 0 && x.size(3) > 0,
                "adaptive_avg_pool2d: expected an input with "
                "non-zero spatial size, got shape ",
                ShapeToString(x.sizes()));
    internal::CheckNnDtype(x, "adaptive_avg_pool2d");
    Windows rows = AdaptiveWindows(x.size(2), output_size[0]);
    Windows cols = AdaptiveWindows(x.size(3), output_size[1]);
    return AvgPoolFunction::apply(
        x, AvgPlan{IntVector(x.sizes().begin(), x.sizes().end()), rows.start, rows.end, rows.count,
                   cols.start, cols.end, cols.count});
  });
}

}  // namespace functional

std::string MaxPool2d::extra_repr() const {
  return absl::StrCat("kernel_size=", PairString(options_.kernel_size),
                      ", stride=", PairString(DefaultStride(options_.stride, options_.kernel_size)),
                      ", padding=", PairString(options_.padding),
                      ", dilation=", PairString(options_.dilation),
                      ", ceil_mode=", options_.ceil_mode ? "True" : "False");
}

std::string AvgPool2d::extra_repr() const {
  return absl::StrCat("kernel_size=", PairString(options_.kernel_size),
                      ", stride=", PairString(DefaultStride(options_.stride, options_.kernel_size)),
                      ", padding=", PairString(options_.padding));
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return absl::StrCat("output_size=", PairString(output_size_));
}

}  // namespace ember::nn
