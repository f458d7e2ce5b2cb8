// Saved-tensor hooks: scopes that decide how the tensors autograd keeps for
// backward are stored (torch.autograd.graph.saved_tensors_hooks, save_on_cpu
// and disable_saved_tensors_hooks).
//
//   ```cpp
//   #include <any>
//   #include "autograd/saved_tensors_hooks.h"
//   #include "tensor/factories.h"
//   ember::Tensor x = ember::ones({3}).requires_grad_();
//   int packed = 0, unpacked = 0;
//   ember::Tensor y;
//   {
//     ember::autograd::saved_tensors_hooks hooks(
//         [&](const ember::Tensor& t) -> std::any { ++packed; return t.clone(); },
//         [&](const std::any& p) { ++unpacked; return std::any_cast<ember::Tensor>(p); });
//     y = (x * x).sum();  // mul saves both operands: packed == 2
//   }
//   y.backward();         // MulBackward reads both copies: unpacked == 2, x.grad() == 2 * x
//   {
//     ember::autograd::save_on_cpu offload(/*pin_memory=*/true);
//     // ... a forward pass here keeps its saved CUDA tensors in (pinned) host memory
//   }
//   if (packed != 2 || unpacked != 2) return absl::InternalError("hooks not called as documented");
//   ```
//
// Note [Saved-tensor hooks]
// Every tensor a node keeps for its backward is a SavedVariable
// (saved_variable.h): those of the op derivatives, of custom Functions'
// save_for_backward, of nn's layers (custom Functions) and of checkpoint()'s
// inputs. When a saved_tensors_hooks scope is active on the thread that
// records the node, SavedVariable calls the innermost scope's pack hook once,
// when the tensor is saved (with grad mode off), and keeps what it returns in
// place of the tensor, together with the tensor's metadata: its version
// counter (not its data), shape and dtype, and where its gradient goes. Each
// access in backward (each SavedVariable::Unpack, i.e. every run of a node's
// backward that reads it) calls the unpack hook on the packed value; the
// result must hold the content of the tensor that was packed. The pair that
// applies is the one active when the tensor is saved, and it travels with the
// saved tensor: unpacking runs on whatever thread runs the node (the thread
// that called backward, or a device's worker), whatever hooks are active
// there. Freeing the graph (backward without retain_graph) drops the packed
// value.
//   - Scopes nest (a thread-local stack, as torch's): only the innermost pair
//     applies; leaving a scope restores the one around it. Scopes are RAII
//     guards and must end in reverse order of creation, on their thread.
//   - In-place checks still apply: unpacking a tensor whose version counter
//     moved since it was saved raises PyTorch's "modified by an inplace
//     operation" error, as without hooks (PyTorch skips this check when
//     hooks are set; Ember keeps it because the counter costs no memory). A
//     pack hook that modifies its argument in place is an error.
//   - The argument of the pack hook: an input of the saving op as it is; an
//     output of the saving op detached (same data and version counter, no
//     history), so that a hook that keeps its argument does not make the node
//     own itself (a reference cycle).
//   - The unpacked tensor gets its place in the graph back (the node that
//     made it, or the leaf's gradient accumulator) when a backward is being
//     recorded (create_graph), so higher-order gradients work under hooks.
//   - A backward pass runs each node with the hooks state of the thread that
//     called it (the engine carries it onto the device workers, as torch
//     carries its thread-local state), so tensors a recorded backward saves
//     go through the same hooks wherever their node runs.
//   - disable_saved_tensors_hooks(message): while it is active on a thread,
//     entering a saved_tensors_hooks scope there throws `message`; entering
//     it inside an active scope throws `message` too. Tensors saved meanwhile
//     are kept as they are.
//
// Errors: ember::Error (the disabled message; a pack hook that modified its
// input; an unpack hook that returned an undefined tensor). An exception a
// hook throws reaches the op that saved the tensor or the backward call.
//
// Thread-safety: the stack of scopes is per thread. Hooks may be called on
// any thread (unpack on the thread of the node that reads the tensor), and
// must be safe to call from there.
#ifndef EMBER_AUTOGRAD_SAVED_TENSORS_HOOKS_H_
#define EMBER_AUTOGRAD_SAVED_TENSORS_HOOKS_H_

#include <any>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tensor/tensor.h"

namespace ember::autograd {

// Called once when a tensor is saved for backward; returns what autograd
// keeps in its place (any copyable value: a Tensor, a file name, a handle).
using PackHook = std::function<std::any(const Tensor& tensor)>;
// Called on each access to the saved tensor in backward with what the pack
// hook returned; returns a tensor with the content of the one packed.
using UnpackHook = std::function<Tensor(const std::any& packed)>;

namespace internal {

// One pair of hooks, shared by every tensor saved under it.
struct SavedTensorHooks {
  PackHook pack_hook;
  UnpackHook unpack_hook;
};

// A thread's saved-tensor hooks state: the innermost pair (null: none) and
// the message of an active disable_saved_tensors_hooks. Immutable; the
// thread holds the current one, each scope the one it replaced.
struct SavedTensorHooksState {
  std::shared_ptr<const SavedTensorHooks> hooks;
  std::optional<std::string> disabled_message;
};

// This thread's state; null when no scope is active (the common case).
const std::shared_ptr<const SavedTensorHooksState>& CurrentSavedTensorHooksState();
// The pair a tensor saved now on this thread goes through, or null.
const SavedTensorHooks* CurrentSavedTensorHooks();

// Makes `state` this thread's state for its lifetime (the engine runs each
// node under the state of the thread that called backward). Does nothing
// when it is the current state already.
class ScopedSavedTensorHooksState {
 public:
  explicit ScopedSavedTensorHooksState(std::shared_ptr<const SavedTensorHooksState> state);
  ~ScopedSavedTensorHooksState();
  ScopedSavedTensorHooksState(const ScopedSavedTensorHooksState&) = delete;
  ScopedSavedTensorHooksState& operator=(const ScopedSavedTensorHooksState&) = delete;

 private:
  bool swapped_ = false;
  std::shared_ptr<const SavedTensorHooksState> previous_;
};

}  // namespace internal

// torch.autograd.graph.saved_tensors_hooks: while alive, every tensor saved
// for backward on this thread goes through `pack_hook` when saved and
// `unpack_hook` on each access in backward (Note [Saved-tensor hooks]).
// Throws ember::Error with the message of an active
// disable_saved_tensors_hooks, and when a hook is empty.
class saved_tensors_hooks {
 public:
  saved_tensors_hooks(PackHook pack_hook, UnpackHook unpack_hook);
  ~saved_tensors_hooks();
  saved_tensors_hooks(const saved_tensors_hooks&) = delete;
  saved_tensors_hooks& operator=(const saved_tensors_hooks&) = delete;

 private:
  std::shared_ptr<const internal::SavedTensorHooksState> previous_;
};

// torch.autograd.graph.save_on_cpu: saved tensors are copied to the CPU when
// saved and back to their device on each access. With `pin_memory`, the
// host copy is in pinned memory and the copy back does not make the host wait
// (non_blocking), when `device_type`'s backend is linked and has a device;
// otherwise plain host memory, as torch does without CUDA. A CPU tensor is
// kept as it is (no copy), unless pinned memory was asked for and is
// available.
class save_on_cpu : public saved_tensors_hooks {
 public:
  explicit save_on_cpu(bool pin_memory = false, DeviceType device_type = DeviceType::kCUDA);
};

// torch.autograd.graph.disable_saved_tensors_hooks: while alive, entering a
// saved_tensors_hooks scope on this thread throws ember::Error with
// `error_message` (for code that cannot honour hooks). Throws that message
// at once when a saved_tensors_hooks scope is active on this thread.
class disable_saved_tensors_hooks {
 public:
  explicit disable_saved_tensors_hooks(std::string error_message);
  ~disable_saved_tensors_hooks();
  disable_saved_tensors_hooks(const disable_saved_tensors_hooks&) = delete;
  disable_saved_tensors_hooks& operator=(const disable_saved_tensors_hooks&) = delete;

 private:
  std::shared_ptr<const internal::SavedTensorHooksState> previous_;
};

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_SAVED_TENSORS_HOOKS_H_
