#include "autograd/graphed_callable.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/stream.h"

namespace ember::autograd {
namespace {

// What the two graphs read and write (Note [Graphed callables]).
struct GraphedState {
  cuda::CUDAGraph forward;
  cuda::CUDAGraph backward;
  std::vector<Tensor> static_inputs;
  std::vector<Tensor> static_outputs;
  std::vector<Tensor> params;
  // Outputs that require grad, and the buffers their gradients come in by.
  std::vector<size_t> differentiable_outputs;
  std::vector<Tensor> static_grad_outputs;
  // The inputs that require grad (positions), then every parameter: the
  // backward graph's results, in that order (undefined: unused).
  std::vector<size_t> differentiable_inputs;
  std::vector<Tensor> static_grad_inputs;
};

absl::Status Check(const Tensor& t, const std::string& what, std::optional<Device>& device) {
  if (!t.defined() || !t.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "make_graphed_callable: ", what, " must be a CUDA tensor, got ",
        t.defined() ? t.device().str() : std::string("an undefined tensor")));
  }
  if (device && *device != t.device()) {
    return absl::InvalidArgumentError(absl::StrCat("make_graphed_callable: ", what, " is on ",
                                                   t.device().str(), ", the others on ",
                                                   device->str(), "; use one device"));
  }
  device = t.device();
  return absl::OkStatus();
}

struct GraphedFunction : Function<GraphedFunction> {
  static variable_list forward(AutogradContext* ctx, std::shared_ptr<GraphedState> state,
                               const variable_list& args, const variable_list& params) {
    GraphedState& s = *state;
    EMBER_CHECK(args.size() == s.static_inputs.size(), "graphed callable: expected ",
                s.static_inputs.size(), " arguments (the samples'), got ", args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      const Tensor& want = s.static_inputs[i];
      EMBER_CHECK(args[i].defined() && args[i].sizes() == want.sizes() &&
                      args[i].dtype() == want.dtype() && args[i].device() == want.device(),
                  "graphed callable: argument ", i, " must match its sample (",
                  ShapeToString(want.sizes()), " ", dtype_name(want.dtype()), " on ",
                  want.device().str(), "), got ",
                  args[i].defined() ? ShapeToString(args[i].sizes()) + " " +
                                          std::string(dtype_name(args[i].dtype())) + " on " +
                                          args[i].device().str()
                                    : std::string("an undefined tensor"));
      if (!args[i].is_same(want)) want.detach().copy_(args[i]);
    }
    if (absl::Status st = s.forward.replay(); !st.ok()) EMBER_FAIL(st.message());
    ctx->saved_data["state"] = std::shared_ptr<void>(state);
    variable_list outputs;
    for (const Tensor& o : s.static_outputs) outputs.push_back(o.detach());
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = std::static_pointer_cast<GraphedState>(
        std::get<std::shared_ptr<void>>(ctx->saved_data["state"]));
    GraphedState& s = *state;
    for (size_t k = 0; k < s.differentiable_outputs.size(); ++k) {
      const Tensor& g = grads[s.differentiable_outputs[k]];
      if (g.defined()) {
        s.static_grad_outputs[k].copy_(g);
      } else {
        s.static_grad_outputs[k].zero_();
      }
    }
    if (absl::Status st = s.backward.replay(); !st.ok()) EMBER_FAIL(st.message());
    // One entry per flattened argument: the state, the inputs, the params.
    variable_list out(1 + s.static_inputs.size() + s.params.size());
    for (size_t k = 0; k < s.differentiable_inputs.size(); ++k) {
      const Tensor& g = s.static_grad_inputs[k];
      if (g.defined()) out[1 + s.differentiable_inputs[k]] = g.detach();
    }
    const size_t first_param = s.differentiable_inputs.size();
    for (size_t p = 0; p < s.params.size(); ++p) {
      const Tensor& g = s.static_grad_inputs[first_param + p];
      if (g.defined()) out[1 + s.static_inputs.size() + p] = g.detach();
    }
    return out;
  }
};

// The backward of `s`'s outputs with respect to its differentiable inputs and
// parameters, into the static gradient buffers.
variable_list Gradients(GraphedState& s) {
  variable_list outputs, inputs;
  for (size_t k : s.differentiable_outputs) outputs.push_back(s.static_outputs[k]);
  for (size_t i : s.differentiable_inputs) inputs.push_back(s.static_inputs[i]);
  for (const Tensor& p : s.params) inputs.push_back(p);
  return grad(outputs, inputs, s.static_grad_outputs, /*retain_graph=*/false,
              /*create_graph=*/false, /*allow_unused=*/true);
}

}  // namespace

absl::StatusOr<TensorFunction> make_graphed_callable(TensorFunction fn,
                                                     std::vector<Tensor> sample_args,
                                                     std::vector<Tensor> params,
                                                     GraphedCallableOptions options) {
  if (!fn) return absl::InvalidArgumentError("make_graphed_callable: fn is empty");
  if (!GradMode::is_enabled()) {
    return absl::FailedPreconditionError(
        "make_graphed_callable: grad mode is off; its backward graph needs it on");
  }
  std::optional<Device> device;
  for (size_t i = 0; i < sample_args.size(); ++i) {
    EMBER_RETURN_IF_ERROR(Check(sample_args[i], absl::StrCat("sample argument ", i), device));
  }
  for (size_t p = 0; p < params.size(); ++p) {
    EMBER_RETURN_IF_ERROR(Check(params[p], absl::StrCat("parameter ", p), device));
    if (!params[p].is_leaf() || !params[p].requires_grad()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "make_graphed_callable: parameter ", p, " must be a leaf that requires grad"));
    }
  }
  if (!device) {
    return absl::InvalidArgumentError(
        "make_graphed_callable: no sample argument or parameter says which device to capture on");
  }
  auto state = std::make_shared<GraphedState>();
  GraphedState& s = *state;
  s.params = std::move(params);
  for (size_t i = 0; i < sample_args.size(); ++i) {
    const bool needs_grad = sample_args[i].requires_grad();
    s.static_inputs.push_back(sample_args[i].detach().clone().requires_grad_(needs_grad));
    if (needs_grad) s.differentiable_inputs.push_back(i);
  }
  DeviceGuard device_guard(*device);
  EMBER_RETURN_IF_ERROR(cuda::run_on_side_stream(*device, [&] {
    for (int k = 0; k < options.num_warmup_iters; ++k) {
      s.static_outputs = fn(s.static_inputs);
      s.differentiable_outputs.clear();
      s.static_grad_outputs.clear();
      for (size_t j = 0; j < s.static_outputs.size(); ++j) {
        if (s.static_outputs[j].defined() && s.static_outputs[j].requires_grad()) {
          s.differentiable_outputs.push_back(j);
          s.static_grad_outputs.push_back(ones_like(s.static_outputs[j]));
        }
      }
      if (!s.differentiable_outputs.empty()) (void)Gradients(s);
    }
  }));
  const cuda::MempoolId pool = options.pool.value_or(cuda::graph_pool_handle());
  {
    cuda::graph capture(s.forward, pool);
    s.static_outputs = fn(s.static_inputs);
  }
  EMBER_RETURN_IF_ERROR(cuda::capture_status_of(s.forward));
  s.differentiable_outputs.clear();
  s.static_grad_outputs.clear();
  for (size_t j = 0; j < s.static_outputs.size(); ++j) {
    if (s.static_outputs[j].defined() && s.static_outputs[j].requires_grad()) {
      s.differentiable_outputs.push_back(j);
      s.static_grad_outputs.push_back(empty_like(s.static_outputs[j]));
    }
  }
  if (!s.differentiable_outputs.empty()) {
    {
      cuda::graph capture(s.backward, pool);
      s.static_grad_inputs = Gradients(s);
    }
    EMBER_RETURN_IF_ERROR(cuda::capture_status_of(s.backward));
  }
  // The static outputs leave the capture's autograd graph behind: calls
  // give them a node of their own.
  for (Tensor& o : s.static_outputs) o = o.detach();
  return TensorFunction([state](const std::vector<Tensor>& args) {
    return GraphedFunction::apply(state, args, state->params);
  });
}

}  // namespace ember::autograd
