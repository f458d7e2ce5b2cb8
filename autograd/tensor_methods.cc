// The Tensor methods that need autograd (Note [Autograd hooks] in
// tensor/tensor.h), registered when //autograd is linked.
#include <memory>

#include "autograd/engine.h"
#include "autograd/variable.h"

namespace ember::autograd {
namespace {

class TensorMethods final : public AutogradHooksInterface {
 public:
  void SetRequiresGrad(const Tensor& self, bool requires_grad) const override {
    EMBER_CHECK(self.defined(), "requires_grad_: the tensor is undefined");
    AutogradMeta* meta = GetMeta(self);
    if (meta != nullptr && !meta->is_leaf()) {
      EMBER_CHECK(requires_grad,
                  "you can only change requires_grad flags of leaf variables. If you want to use "
                  "a computed variable in a subgraph that doesn't require differentiation use "
                  "var_no_grad = var.detach().");
      return;
    }
    EMBER_CHECK(!requires_grad || self.is_floating_point(),
                "only Tensors of floating point and complex dtype can require gradients (got ",
                dtype_name(self.dtype()), ")");
    if (meta == nullptr && !requires_grad) return;
    MaterializeMeta(self)->requires_grad_ = requires_grad;
  }

  Tensor Grad(const Tensor& self) const override {
    AutogradMeta* meta = GetMeta(self);
    return meta == nullptr ? Tensor() : meta->grad_;
  }

  void SetGrad(const Tensor& self, const Tensor& grad) const override {
    if (grad.defined()) {
      EMBER_CHECK(grad.sizes() == self.sizes(),
                  "assigned grad has data of a different size: ", ShapeToString(grad.sizes()),
                  " for a tensor of shape ", ShapeToString(self.sizes()));
      EMBER_CHECK(grad.dtype() == self.dtype(),
                  "assigned grad has data of a different type: ", dtype_name(grad.dtype()),
                  " for a ", dtype_name(self.dtype()), " tensor");
      EMBER_CHECK(grad.device() == self.device(),
                  "assigned grad has data located on a different "
                  "device: ",
                  grad.device().str(), " for a tensor on ", self.device().str());
    }
    AutogradMeta* meta = grad.defined() ? MaterializeMeta(self) : GetMeta(self);
    if (meta != nullptr) meta->grad_ = grad;
  }

  void DetachInPlace(const Tensor& self) const override {
    AutogradMeta* meta = GetMeta(self);
    if (meta == nullptr) return;
    meta->grad_fn_.reset();
    meta->output_nr_ = 0;
    meta->requires_grad_ = false;
  }

  void RetainGrad(const Tensor& self) const override {
    EMBER_CHECK(self.requires_grad(), "can't retain_grad on Tensor that has requires_grad=False");
    AutogradMeta* meta = MaterializeMeta(self);
    if (meta->is_leaf() || meta->retains_grad_) return;
    meta->retains_grad_ = true;
    std::weak_ptr<TensorImpl> weak = self.impl_ptr();
    RegisterHook(self, [weak](const Tensor& grad) {
      std::shared_ptr<TensorImpl> impl = weak.lock();
      if (impl == nullptr) return Tensor();
      auto* m = static_cast<AutogradMeta*>(impl->autograd_meta());
      if (!m->grad_.defined()) {
        m->grad_ = grad.clone();
      } else {
        m->grad_ = m->grad_.add(grad);
      }
      return Tensor();
    });
  }

  std::shared_ptr<AutogradNodeInterface> GradFn(const Tensor& self) const override {
    return internal::GradFnOf(self);
  }

  void Backward(const Tensor& self, const Tensor& gradient, bool retain_graph,
                bool create_graph) const override {
    autograd::backward({self}, {gradient}, retain_graph || create_graph, create_graph);
  }
};

const TensorMethods kTensorMethods;

[[maybe_unused]] const bool kRegistered = [] {
  SetAutogradHooks(&kTensorMethods);
  return true;
}();

}  // namespace
}  // namespace ember::autograd
