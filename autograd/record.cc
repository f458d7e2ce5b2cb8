#include "autograd/record.h"

#include "autograd/anomaly_mode.h"

namespace ember::autograd {
namespace {

// Backward of an in-place op on a view of a non-leaf (Note [In-place rules]).
// Next edges: 0 = the base's history before the op, 1 = the op's node. The
// base's gradient is split: the written region goes through the op's node
// (which routes it back through the view's old history to the base), the
// rest goes to the base's old history directly.
class CopySlices final : public Node {
 public:
  CopySlices(SizeVector sizes, SizeVector strides, int64_t offset)
      : sizes_(std::move(sizes)), strides_(std::move(strides)), offset_(offset) {}
  std::string name() const override { return "CopySlices"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    Tensor base_grad = grads[0].clone();
    Tensor region = base_grad.as_strided(sizes_, strides_, offset_);
    Tensor view_grad = region.clone();
    region.zero_();
    return {base_grad, view_grad};
  }

 private:
  SizeVector sizes_;
  SizeVector strides_;
  int64_t offset_;
};

}  // namespace

void FormulaNode::release_variables() {
  for (SavedVariable& s : saved_) s.Release();
}

variable_list FormulaNode::apply(variable_list&& grads) {
  bool any = false;
  for (const Tensor& g : grads) any = any || g.defined();
  if (!any) return variable_list(num_outputs());
  variable_list saved;
  saved.reserve(saved_.size());
  for (const SavedVariable& s : saved_) saved.push_back(s.Unpack());
  return formula_(saved, grads);
}

void FinishHistory(const std::shared_ptr<Node>& node, const Tensor& out, std::string_view op) {
  if (!out.is_floating_point()) {
    node->add_input_metadata(out);  // Keeps output numbers aligned.
    return;
  }
  SetHistory(out, node);
  if (AnomalyMode::is_enabled()) node->set_forward_op(std::string(op));
}

void CheckInPlace(const Tensor& self) {
  const TensorImpl* impl = self.impl();
  if (impl->is_view()) {
    EMBER_CHECK(!impl->is_view_made_without_grad_mode(),
                "A view was created in no_grad mode and is being modified inplace with grad "
                "mode enabled. Given that this use case is ambiguous and error-prone, it is "
                "forbidden. You can clarify your code by moving both the view and the inplace "
                "either both inside the no_grad block (if you don't want the inplace to be "
                "tracked) or both outside (if you want the inplace to be tracked). (The view "
                "has shape ",
                ShapeToString(self.sizes()), ".)");
    const AutogradMeta* base = static_cast<const AutogradMeta*>(impl->view_base()->autograd_meta());
    EMBER_CHECK(!(base != nullptr && base->grad_fn_ == nullptr && base->requires_grad_),
                "a view of a leaf Variable that requires grad is being used in an in-place "
                "operation.");
    return;
  }
  const AutogradMeta* meta = GetMeta(self);
  if (meta == nullptr) return;
  EMBER_CHECK(!(meta->grad_fn_ == nullptr && meta->requires_grad_),
              "a leaf Variable that requires grad is being used in an in-place operation.");
}

void RebaseHistory(const Tensor& self, const Edge& edge) {
  AutogradMeta* meta = MaterializeMeta(self);
  if (!self.is_view()) {
    meta->grad_fn_ = edge.function;
    meta->output_nr_ = edge.input_nr;
    meta->attr_version_ = self.version();
    return;
  }
  Tensor base = self._base();
  EMBER_CHECK(base.is_contiguous(),
              "in-place operation on a view of a non-contiguous tensor of shape ",
              ShapeToString(base.sizes()),
              " is not supported; call contiguous() on the base "
              "before taking the view");
  auto node = MakeNode<CopySlices>(SizeVector(self.sizes().begin(), self.sizes().end()),
                                   SizeVector(self.strides().begin(), self.strides().end()),
                                   self.storage_offset() - base.storage_offset());
  node->add_next_edge(GradientEdge(base));
  node->add_next_edge(edge);
  AutogradMeta* base_meta = MaterializeMeta(base);
  base_meta->grad_fn_ = node;
  base_meta->output_nr_ = node->add_input_metadata(base);
  // Forces the view's grad_fn to be regenerated from the base's new history
  // on next use (Note [Views and in-place]).
  meta->attr_version_ = self.version() - 1;
}

}  // namespace ember::autograd
