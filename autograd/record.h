// How an op records itself in the graph: the generic node that runs a
// backward formula, and the rules for in-place ops (Note [In-place rules]).
// Used by the op derivatives (derivatives.cc) and custom Functions.
//
//   auto node = MakeNode<FormulaNode>("ExpBackward", [](const variable_list& saved,
//                                                       const variable_list& grads) {
//     return variable_list{grads[0] * saved[0]};
//   });
//   node->add_next_edge(GradientEdge(x));
//   node->Save(y, /*is_output=*/true);
//   FinishHistory(node, y, "exp");
//
// Thread-safety: as the tensors involved (recording writes their meta).
#ifndef EMBER_AUTOGRAD_RECORD_H_
#define EMBER_AUTOGRAD_RECORD_H_

#include <functional>
#include <string_view>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/saved_variable.h"
#include "autograd/variable.h"

namespace ember::autograd {

// A node whose backward is a function of its saved tensors and incoming
// gradients. All-undefined gradients give all-undefined results without
// calling the formula.
class FormulaNode final : public Node {
 public:
  // (saved tensors, unpacked in Save order; gradients) -> one gradient per
  // next edge (undefined: zero).
  using Formula =
      std::function<variable_list(const variable_list& saved, const variable_list& grads)>;

  FormulaNode(const char* name, Formula formula) : name_(name), formula_(std::move(formula)) {}
  std::string name() const override { return name_; }
  void release_variables() override;
  // Saves `t` (may be undefined) for the formula.
  void Save(const Tensor& t, bool is_output = false) { saved_.emplace_back(t, is_output); }

 protected:
  variable_list apply(variable_list&& grads) override;

 private:
  const char* name_;
  Formula formula_;
  std::vector<SavedVariable> saved_;
};

// Whether `t` is defined and requires grad (its own flag or history, or its
// base's for a view: Note [View tracking] in tensor/tensor.h).
inline bool RequiresGrad(const Tensor& t) { return t.defined() && t.impl()->requires_grad(); }

// Sets `out` as the next output of `node`; in anomaly mode records `op` as
// the node's forward op. Outputs of non-floating dtypes are left out of the
// graph (they cannot require grad).
void FinishHistory(const std::shared_ptr<Node>& node, const Tensor& out, std::string_view op);

// Note [In-place rules]
// With grad mode on, an in-place op that records (its destination or another
// input requires grad) on
//   - a leaf that requires grad, or a view of one, is refused before anything
//     is modified (CheckInPlace), as PyTorch refuses; so is one on a view
//     taken with grad mode off (torch's "A view was created in no_grad mode"
//     error);
//   - any other tensor rewrites its history (RebaseHistory): the tensor now
//     comes from the in-place op's node; for a view, of a non-leaf or of a
//     tensor that does not require grad, the base's history is rewritten by
//     a CopySlices node, which sends the gradient of the written region
//     through the op's node and the rest to the base's old history, if any
//     (and the views are regenerated, Note [Views and in-place]). Views know
//     their base whatever the grad mode (Note [View tracking] in
//     tensor/tensor.h), so writing a tensor that requires grad into a slice
//     of a plain tensor makes the whole tensor depend on it, as in torch.
// The version counter (bumped by the op itself) makes saved copies of the old
// value fail loudly on unpack (Note [Saved tensors]).
void CheckInPlace(const Tensor& self);
// `self` (already modified) now comes from `edge`, whose node already has
// input metadata for `edge.input_nr`.
void RebaseHistory(const Tensor& self, const Edge& edge);

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_RECORD_H_
