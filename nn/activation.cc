#include "nn/activation.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using autograd::AutogradContext;

template <typename F>
void VisitFloat(Dtype dtype, F&& f) {
  if (dtype == kFloat32) {
    f.template operator()<float>();
  } else {
    f.template operator()<double>();
  }
}

struct ReluFunction : autograd::Function<ReluFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input) {
    Tensor out = empty(input.sizes(), input.options());
    VisitFloat(input.dtype(), [&]<typename T>() {
      const T* x = input.data_ptr<T>();
      T* y = out.data_ptr<T>();
      parallel_for(0, input.numel(), kDefaultGrainSize, [&](int64_t begin, int64_t end) {
        const T* __restrict in = x + begin;
        T* __restrict res = y + begin;
        // Branch-free (vectorises); NaN stays NaN, as in torch.
        for (int64_t i = 0; i < end - begin; ++i) {
          const T v = in[i];
          res[i] = v < T(0) ? T(0) : v;
        }
      });
    });
    ctx->save_for_backward({out});
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    Tensor out = ctx->get_saved_variables()[0];
    Tensor g = grad_outputs[0].contiguous();
    // A graph of the backward (create_graph) needs differentiable ops.
    if (autograd::GradMode::is_enabled() || g.dtype() != out.dtype()) {
      return {where(out.le(0), zeros({}, g.options()), g)};
    }
    Tensor gx = empty(out.sizes(), out.options());
    VisitFloat(out.dtype(), [&]<typename T>() {
      const T* y = out.data_ptr<T>();
      const T* pg = g.data_ptr<T>();
      T* px = gx.data_ptr<T>();
      parallel_for(0, out.numel(), kDefaultGrainSize, [&](int64_t begin, int64_t end) {
        const T* __restrict res = y + begin;
        const T* __restrict grads = pg + begin;
        T* __restrict gin = px + begin;
        for (int64_t i = 0; i < end - begin; ++i) {
          // As torch's threshold_backward: zero where the result is <= 0 (a
          // NaN result passes its gradient). The gradient is loaded
          // unconditionally, so the loop vectorises.
          const T grad = grads[i];
          gin[i] = res[i] <= T(0) ? T(0) : grad;
        }
      });
    });
    return {gx};
  }
};

}  // namespace

namespace functional {

Tensor relu(const Tensor& input) {
  const bool fast = input.defined() && input.is_cpu() && input.is_contiguous() &&
                    (input.dtype() == kFloat32 || input.dtype() == kFloat64);
  return fast ? ReluFunction::apply(input) : input.relu();
}

}  // namespace functional
namespace functional {

Tensor gelu(const Tensor& input, const std::string& approximate) {
  if (approximate == "none") return input.gelu();
  EMBER_CHECK(approximate == "tanh", "approximate argument must be either none or tanh, got '",
              approximate, "'");
  // Composed of differentiable ops, so autograd gives its derivative.
  const double k = std::sqrt(2.0 / M_PI);
  const Tensor inner = (input + input * input * input * 0.044715) * k;
  return input * 0.5 * (inner.tanh() + 1.0);
}

}  // namespace functional

GELU::GELU(std::string approximate) : approximate_(std::move(approximate)) {
  EMBER_CHECK(approximate_ == "none" || approximate_ == "tanh",
              "approximate argument must be either none or tanh, got '", approximate_, "'");
}

}  // namespace ember::nn
