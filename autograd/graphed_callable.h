// make_graphed_callable: a function of CUDA tensors whose forward and
// backward are each captured once into a CUDA graph and replayed on every
// call, as torch.cuda.make_graphed_callables. A module is graphed as the
// function [&](in) { return {(*module)(in[0])}; } with module->parameters().
//
//   ```cpp compile-only
//   #include "autograd/graphed_callable.h"
//   #include "tensor/factories.h"
//   const ember::TensorOptions gpu = ember::TensorOptions().device(ember::Device(ember::DeviceType::kCUDA, 0));
//   ember::Tensor w = ember::randn({64, 64}, gpu).requires_grad_();
//   auto fn = [&](const std::vector<ember::Tensor>& in) {
//     return std::vector<ember::Tensor>{in[0].matmul(w).relu()};
//   };
//   EMBER_ASSIGN_OR_RETURN(auto graphed, ember::autograd::make_graphed_callable(
//                                            fn, {ember::randn({32, 64}, gpu)}, {w}));
//   ember::Tensor y = graphed({ember::randn({32, 64}, gpu)})[0];  // one graph launch
//   y.sum().backward();                                              // one more; w.grad() set
//   ```
//
// Note [Graphed callables]
// make_graphed_callable runs `fn` with its backward num_warmup_iters times
// on a side stream (lazy initialisation, algorithm choices and the
// allocator's first segments happen there, not in the graphs), then captures
// fn(static inputs) into one graph and autograd::grad of its outputs with
// respect to the inputs that require grad and `params` into a second, both
// in one private pool (Note [Graph memory pools] in cuda/caching_allocator.h).
// The static inputs are copies of `sample_args` (same shapes, dtypes,
// devices and requires_grad); every call copies its arguments into them,
// replays the forward graph and returns the static outputs (detached, in an
// autograd node of its own: the next call overwrites them, so use or clone
// them first). Its backward copies the incoming gradients into static
// buffers, replays the backward graph and returns the static gradients, which
// reach the parameters' .grad through their AccumulateGrad as any gradient
// does. So: every call must take arguments of the samples' shapes, fn must be
// capturable (no host syncs, no CPU work that changes between calls: control
// flow is frozen at capture), and the backward of a call must run before the
// next call's forward. Gradients of the outputs must not need create_graph.
//
// Errors: InvalidArgument naming the offending sample or parameter (not a
// CUDA tensor, devices that differ, a parameter that is not a leaf
// requiring grad); the capture's own failure (Note [Capturing a graph] in
// cuda/graphs.h). A call with an argument of another shape, dtype or
// device throws ember::Error naming its position.
#ifndef EMBER_AUTOGRAD_GRAPHED_CALLABLE_H_
#define EMBER_AUTOGRAD_GRAPHED_CALLABLE_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda/graphs.h"
#include "tensor/tensor.h"

namespace ember::autograd {

using TensorFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct GraphedCallableOptions {
  int num_warmup_iters = 3;  // torch's default
  // The private pool to capture into (default: a new graph_pool_handle()).
  std::optional<cuda::MempoolId> pool;
};

absl::StatusOr<TensorFunction> make_graphed_callable(TensorFunction fn,
                                                     std::vector<Tensor> sample_args,
                                                     std::vector<Tensor> params = {},
                                                     GraphedCallableOptions options = {});

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_GRAPHED_CALLABLE_H_
