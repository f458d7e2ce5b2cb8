// SavedVariable: a tensor a node keeps for its backward, with the version it
// had when saved. The one seam through which every saved tensor passes, so
// saved-tensor hooks apply to all of them (Note [Saved-tensor hooks] in
// saved_tensors_hooks.h).
//
// Note [Saved tensors]
// Unpacking checks that the tensor was not modified in place since it was
// saved (its version counter, shared with its views, has not moved) and
// raises PyTorch's message otherwise:
//   one of the variables needed for gradient computation has been modified by
//   an inplace operation: [float [3, 4]], which is output 0 of MulBackward, is
//   at version 2; expected version 1 instead. Hint: ...
// A node that saves one of its own outputs must not own that output's meta
// (the output owns the node: a cycle), so outputs are stored as plain data
// plus a weak reference to the node, and rebuilt on unpack when a graph of
// the backward is being recorded (create_graph). After release (backward
// without retain_graph) unpacking raises "Trying to backward through the graph
// a second time ...".
// Under saved-tensor hooks (Note [Saved-tensor hooks]) the constructor hands
// the tensor to the pack hook and keeps only what it returns, with the
// version counter, shape, dtype and gradient edge; Unpack checks the version
// as above, calls the unpack hook, and gives the result its history back when
// a backward is being recorded.
//
//   SavedVariable saved(x, /*is_output=*/false);
//   Tensor x_again = saved.Unpack();
//
// Thread-safety: as the node that holds it.
#ifndef EMBER_AUTOGRAD_SAVED_VARIABLE_H_
#define EMBER_AUTOGRAD_SAVED_VARIABLE_H_

#include <any>
#include <memory>

#include "autograd/node.h"
#include "autograd/saved_tensors_hooks.h"
#include "tensor/tensor.h"

namespace ember::autograd {

class SavedVariable {
 public:
  SavedVariable() = default;
  // Saves `t` (may be undefined). `is_output`: `t` is an output of the node
  // that saves it. Calls the pack hook of the saved-tensor hooks active on
  // this thread, if any (and whatever it throws).
  SavedVariable(const Tensor& t, bool is_output);
  SavedVariable(SavedVariable&&) = default;
  SavedVariable& operator=(SavedVariable&&) = default;

  // The saved tensor; throws ember::Error if it was modified in place or
  // released. An undefined tensor when an undefined one was saved. Under
  // hooks, calls the unpack hook (each call).
  Tensor Unpack() const;
  // Drops the data, or the packed value (retain_graph false).
  void Release();
  bool was_defined() const { return was_defined_; }

 private:
  // What is kept in place of data_ for a tensor saved under hooks.
  struct Packed {
    std::shared_ptr<const internal::SavedTensorHooks> hooks;
    std::any value;  // what the pack hook returned
    std::shared_ptr<VersionCounter> version_counter;
    SizeVector shape;
    Dtype dtype = kFloat32;
  };
  void Pack(std::shared_ptr<const internal::SavedTensorHooks> hooks, const Tensor& t);
  Tensor UnpackHooked() const;

  Tensor data_;
  std::unique_ptr<Packed> packed_;  // Under hooks only (data_ is then empty).
  // The input's grad_fn (inputs only); under hooks, a leaf's gradient
  // accumulator.
  std::shared_ptr<Node> grad_fn_;
  std::weak_ptr<Node> weak_grad_fn_;  // The saving node (outputs only).
  uint32_t saved_version_ = 0;
  uint32_t output_nr_ = 0;
  bool was_defined_ = false;
  bool is_output_ = false;
  bool requires_grad_ = false;
  bool released_ = false;
};

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_SAVED_VARIABLE_H_
