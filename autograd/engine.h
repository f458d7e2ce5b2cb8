// The autograd engine: runs the backward graph (Note [Autograd graph]).
//
//   ```cpp
//   #include "autograd/engine.h"
//   #include "tensor/factories.h"
//   ember::Tensor x = ember::ones({3}).requires_grad_();
//   ember::Tensor y = (x * x).sum();
//   ember::autograd::variable_list g =
//       ember::autograd::grad({y}, {x}, /*grad_outputs=*/{}, /*retain_graph=*/true);
//   ember::autograd::backward({y});  // frees the graph; x.grad() == g[0] == 2 * x
//   ```
//
// Note [Engine]
// Execution: the engine walks the graph from the roots once to count, for
// each node, how many gradients it will receive (its dependencies). A node is
// ready when all have arrived; gradients arriving for the same input are
// summed in its input buffer. Ready nodes run highest sequence number first
// (most recent forward op first). Before a gradient is handed to a node it is
// made to match the node's input metadata: broadcast dims are summed away and
// the dtype converted (Note [Gradient layout]).
// Threads: a backward call runs every node on the thread that called it,
// which blocks until the graph is done. Its ready nodes wait in one priority
// queue, local to the call (its graph task); there are no worker threads and
// no per-device queues. Nodes of CUDA tensors run there too, their kernels
// queued on the calling thread's current streams (cuda/). Not yet as in
// torch, where such nodes go to a queue per device served by that device's
// worker thread while CPU nodes stay on the calling thread. Calls from
// different threads run independently (each has its own graph task).
// Grad mode during backward is `create_graph`: when true, the backward
// formulas record their own graph, giving higher-order gradients.
// Callbacks queued during backward (queue_callback) run on the calling thread
// after the last node, before backward returns.
//
// Errors: throws ember::Error for a user mistake (a root that does not
// require grad, a missing gradient for a non-scalar root, a second backward
// through freed saved tensors, a node whose gradient has the wrong shape).
// Anomaly mode (anomaly_mode.h) adds the forward op to the message.
#ifndef EMBER_AUTOGRAD_ENGINE_H_
#define EMBER_AUTOGRAD_ENGINE_H_

#include <functional>
#include <optional>

#include "autograd/node.h"
#include "tensor/tensor.h"

namespace ember::autograd {

// Accumulates the gradients of `tensors` (weighted by `grad_tensors`; may be
// empty or hold undefined entries for one-element tensors, meaning 1) into
// the grad() of the leaves. `retain_graph` defaults to `create_graph`.
// Blocks until done.
void backward(const variable_list& tensors, const variable_list& grad_tensors = {},
              std::optional<bool> retain_graph = std::nullopt, bool create_graph = false);

// The gradients of `outputs` with respect to `inputs`, without touching any
// grad(). An input the outputs do not depend on gives an error unless
// `allow_unused`, when its entry is undefined.
variable_list grad(const variable_list& outputs, const variable_list& inputs,
                   const variable_list& grad_outputs = {},
                   std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                   bool allow_unused = false);

// Queues `callback` to run when the backward pass running on this thread
// finishes (as Variable._execution_engine.queue_callback). Throws when no
// backward pass is running on this thread.
void queue_callback(std::function<void()> callback);

// Note [Gradient layout]
// A gradient must have the shape and dtype of the forward tensor it belongs
// to. Backward formulas may return it broadcast (the shape of the op's
// output) or in the op's compute dtype; the engine sums it back to the input's
// shape (SumToSize) and converts the dtype, so formulas need not.
//
// Sums `grad` over the dims that broadcasting added or expanded so that it has
// `shape` (torch's sum_to_size). Throws if `shape` does not broadcast to
// grad's shape.
Tensor SumToSize(const Tensor& grad, IntArrayRef shape);

// Runs the graph from `roots` with `inputs` (their gradients). When
// `outputs` is non-empty, the gradients flowing into those edges are
// returned instead of being accumulated, and only nodes leading to them run.
variable_list RunBackward(const edge_list& roots, variable_list inputs, bool keep_graph,
                          bool create_graph, const edge_list& outputs);

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_ENGINE_H_
