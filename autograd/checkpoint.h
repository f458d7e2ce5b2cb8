// Activation checkpointing: torch.utils.checkpoint.checkpoint in its
// non-reentrant form (use_reentrant=False). The forward pass runs `function`
// without keeping the tensors its ops save for backward; the backward pass
// runs it again to get them back.
//
//   ```cpp
//   #include "autograd/checkpoint.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::randn({64, 64}).requires_grad_();
//   ember::Tensor x = ember::randn({32, 64});
//   auto block = [&w](const ember::Tensor& h) { return h.matmul(w).tanh().matmul(w).tanh(); };
//   ember::Tensor y = ember::autograd::checkpoint(block, x);  // keeps x, not the activations
//   y.sum().backward();  // runs `block` again, then the backward: w.grad() as without checkpoint
//   ```
//
// Note [Activation checkpointing]
// checkpoint() is built on saved-tensor hooks (Note [Saved-tensor hooks] in
// saved_tensors_hooks.h). With grad mode on, it saves its inputs as any node
// saves a tensor (so the hooks around it apply to them), records the RNG
// state, and runs `function` inside a scope whose pack hook keeps, for each
// tensor an op saves, only a placeholder (a holder) and the tensor's shape,
// dtype and device; the ops record their graph as usual, so the outputs are
// the real outputs with their history. The first time a backward run needs
// one of those tensors, the unpack hook runs `function` again on the saved
// inputs, with grad mode on and the forward's RNG state, under a second scope
// whose pack hook fills the holders in order with the tensors the ops save;
// each unpack then hands out its holder's tensor once (it is freed once
// used). Recomputation happens once per backward run (per graph task: a
// second backward with retain_graph recomputes again) and, with early_stop,
// stops as soon as every holder is filled. Then the recomputed tensors are
// checked against the forward's: the same number, and (determinism_check
// kDefault) the same shape, dtype and device for each, or a CheckpointError
// naming the tensor's index and both descriptions. Around the recomputation
// the RNG states are swapped (torch.random.fork_rng): the CPU default
// generator's, and that of the device of every input on a device whose
// backend registered generators (CUDA's: Philox seed and offset), are set to
// what they were when the forward started and restored afterwards, so
// dropout draws the same masks and the random stream outside is untouched.
// Nested checkpoints follow torch's rules: a tensor is held by the innermost
// checkpoint that saw it; an inner checkpoint's inputs are tensors saved
// under the outer one, so recomputing the inner one first recomputes the
// outer one (which re-runs the inner call as part of it). The recomputation
// runs on the thread of the node that needs the tensor (the caller's, or a
// device's worker: Note [Device workers] in engine.cc) with that node's
// stream current; concurrent unpacks of one checkpoint wait for one
// recomputation.
//
// Early stop ends the recomputation by an exception (not an ember::Error)
// thrown from the op that saves the last tensor needed, caught by
// checkpoint(); a function that swallows every exception (catch (...)) needs
// early_stop = false.
//
// Not done: the reentrant form (use_reentrant=True), context_fn, debug logs,
// selective checkpointing, set_checkpoint_early_stop (use the option).
//
// Errors: ember::Error (CheckpointError for a recomputation that differs from
// the forward or a tensor unpacked twice in one backward run); whatever
// `function` throws. Under disable_saved_tensors_hooks, checkpoint() throws
// its message.
//
// Thread-safety: call from any thread; `function` must be safe to call again
// from the thread that runs the backward node that needs it. The RNG states
// are swapped on the process-wide default generators, as torch's fork_rng
// does: two recomputations that draw random numbers must not run at once
// (on two devices' workers) if their draws are to be replayed exactly.
#ifndef EMBER_AUTOGRAD_CHECKPOINT_H_
#define EMBER_AUTOGRAD_CHECKPOINT_H_

#include <functional>

#include "autograd/node.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace ember::autograd {

// torch.utils.checkpoint's determinism_check: "default" or "none".
enum class DeterminismCheck {
  kDefault,  // recomputed tensors must match the forward's shapes, dtypes, devices
  kNone,     // only their number is checked
};

struct CheckpointOptions {
  // Record the RNG states before the forward and replay them for the
  // recomputation (torch's preserve_rng_state).
  bool preserve_rng_state = true;
  DeterminismCheck determinism_check = DeterminismCheck::kDefault;
  // Stop recomputing once every tensor the backward needs is back.
  bool early_stop = true;
};

// torch.utils.checkpoint.CheckpointError.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// Runs `function(inputs)` and returns its outputs, keeping for backward only
// `inputs` (Note [Activation checkpointing]). `function` is kept and called
// again during backward: what it refers to must outlive the backward pass,
// and it must do the same computation again (same ops, shapes and random
// draws). Inputs may be undefined or not require grad. With grad mode off,
// just calls `function`.
variable_list checkpoint(const std::function<variable_list(const variable_list&)>& function,
                         const variable_list& inputs, const CheckpointOptions& options = {});
// The same for a function of one tensor.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& function, const Tensor& input,
                  const CheckpointOptions& options = {});

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_CHECKPOINT_H_
