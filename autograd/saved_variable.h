// SavedVariable: a tensor a node keeps for its backward, with the version it
// had when saved.
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
//
//   SavedVariable saved(x, /*is_output=*/false);
//   Tensor x_again = saved.Unpack();
//
// Thread-safety: as the node that holds it.
#ifndef EMBER_AUTOGRAD_SAVED_VARIABLE_H_
#define EMBER_AUTOGRAD_SAVED_VARIABLE_H_

#include <memory>

#include "autograd/node.h"
#include "tensor/tensor.h"

namespace ember::autograd {

class SavedVariable {
 public:
  SavedVariable() = default;
  // Saves `t` (may be undefined). `is_output`: `t` is an output of the node
  // that saves it.
  SavedVariable(const Tensor& t, bool is_output);

  // The saved tensor; throws ember::Error if it was modified in place or
  // released. An undefined tensor when an undefined one was saved.
  Tensor Unpack() const;
  // Drops the data (retain_graph false).
  void Release();
  bool was_defined() const { return was_defined_; }

 private:
  Tensor data_;
  std::shared_ptr<Node> grad_fn_;     // The input's grad_fn (inputs only).
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
