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
// Threads: a backward call runs its CPU nodes on the thread that called it,
// which blocks until the graph is done; the nodes whose gradients live on a
// device (cuda:N) run on that device's worker thread, one per device, as in
// torch (Note [Device workers] in engine.cc). Each node's backward runs on
// the stream its forward ran on, a gradient crossing streams is waited for
// with an event, and the results (.grad, grad()'s return) are ready on the
// caller's current streams when backward returns (Note [Backward streams]).
// A graph of CPU tensors never leaves the calling thread. Calls from
// different threads run independently (each has its own graph task); an
// error raised by a node on any thread is rethrown to the caller once
// nothing of the graph runs any more. Hooks and custom Functions run on the
// thread of their node and may call backward again (re-entrant backward).
// Grad mode during backward is `create_graph`: when true, the backward
// formulas record their own graph, giving higher-order gradients. Every
// node runs under the saved-tensor hooks of the calling thread (Note
// [Saved-tensor hooks] in saved_tensors_hooks.h), on whichever thread it runs.
// Callbacks queued during backward (queue_callback, from any node's thread)
// run on the calling thread after the last node, before backward returns.
//
// Errors: throws ember::Error for a user mistake (a root that does not
// require grad, a missing gradient for a non-scalar root, a second backward
// through freed saved tensors, a node whose gradient has the wrong shape).
// Anomaly mode (anomaly_mode.h) adds the forward op to the message.
#ifndef EMBER_AUTOGRAD_ENGINE_H_
#define EMBER_AUTOGRAD_ENGINE_H_

#include <cstdint>
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

namespace internal {
// Tests only: when true, CPU nodes run on a worker thread of their own
// (device cpu:0) instead of the calling thread, so that the worker machinery
// of Note [Device workers] (hand-off, errors, re-entrant calls, hooks) runs
// on machines without a device. Process-wide; off by default.
void SetCpuNodesOnWorkerForTesting(bool enabled);

// The id of the backward run (graph task) whose node runs on this thread, or
// of the one this thread is running (torch's _current_graph_task_id); 0 when
// none is. Ids are unique in the process. checkpoint() recomputes once per
// backward run by it.
uint64_t CurrentGraphTaskId();
}  // namespace internal

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_ENGINE_H_
