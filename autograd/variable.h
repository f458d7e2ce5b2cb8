// The autograd data of a tensor (AutogradMeta) and the functions that read
// and write it: gradient edges, history, leaf accumulators, tensor hooks.
//
// Note [Autograd meta]
// A tensor that never met autograd has no meta (the common, fast case). One
// gets meta when it is made to require grad, when a recorded op produces it,
// or when a hook or retain_grad is attached. The meta holds:
//   requires_grad  - the leaf flag set by requires_grad_();
//   grad_fn        - the node that produced it (null for leaves) and the
//                    output number within that node;
//   grad           - the accumulated gradient (leaves; retain_grad non-leaves);
//   grad_accumulator - the AccumulateGrad node of a leaf, held weakly: the
//                    graph owns it, and a new one is made when none is alive;
//   attr_version   - for views: the version at which grad_fn was last set
//                    (Note [Views and in-place]); which tensor a view looks
//                    at is kept by the tensor layer, for every view (Note
//                    [View tracking] in tensor/tensor.h).
//
//   ```cpp
//   #include "autograd/variable.h"
//   #include "tensor/factories.h"
//   ember::Tensor x = ember::ones({3}).requires_grad_();
//   ember::autograd::Edge e = ember::autograd::GradientEdge(x);  // x's AccumulateGrad
//   ```
//
// Thread-safety: reading meta is safe from any thread; changing it (history,
// hooks) needs the same external synchronisation as writing the tensor.
#ifndef EMBER_AUTOGRAD_VARIABLE_H_
#define EMBER_AUTOGRAD_VARIABLE_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "autograd/scatter.h"
#include "tensor/allocator.h"
#include "tensor/tensor.h"

namespace ember::autograd {

using TensorHook = std::function<Tensor(const Tensor& grad)>;

class AutogradMeta final : public AutogradMetaInterface {
 public:
  static void* operator new(size_t n) { return ::ember::internal::PoolAllocate(n); }
  static void operator delete(void* p, size_t n) { ::ember::internal::PoolFree(p, n); }

  bool requires_grad() const override { return requires_grad_ || grad_fn_ != nullptr; }
  bool is_leaf() const override { return grad_fn_ == nullptr; }

  bool requires_grad_ = false;
  Tensor grad_;
  std::shared_ptr<Node> grad_fn_;
  uint32_t output_nr_ = 0;
  std::weak_ptr<Node> grad_accumulator_;
  bool retains_grad_ = false;
  // Hooks of a leaf, run by its AccumulateGrad before accumulating.
  std::vector<TensorHook> leaf_hooks_;
  // Note [Views and in-place].
  uint32_t attr_version_ = 0;
};

// The tensor's meta, or nullptr when it has none.
inline AutogradMeta* GetMeta(const Tensor& t) {
  return static_cast<AutogradMeta*>(t.impl()->autograd_meta());
}
// The tensor's meta, created when missing.
AutogradMeta* MaterializeMeta(const Tensor& t);

namespace internal {
// What Tensor::grad_fn() returns (use that): the node that produced `t`, null
// for leaves and tensors outside the graph. For a view whose base was given a
// new history since (an in-place write through it or another view), this is
// regenerated from the base's current history (Note [Views and in-place]).
std::shared_ptr<Node> GradFnOf(const Tensor& t);
}  // namespace internal

// Where the gradient of `t` goes: (grad_fn, output_nr), the leaf's
// AccumulateGrad, or an invalid edge when `t` does not require grad.
Edge GradientEdge(const Tensor& t);

// The AccumulateGrad node of a leaf that requires grad (created if needed).
std::shared_ptr<Node> GradAccumulator(const Tensor& leaf);

// Makes `t` output `node->num_inputs()` of `node`: sets grad_fn and records
// the input metadata.
void SetHistory(const Tensor& t, const std::shared_ptr<Node>& node);

// AsStridedBackward(grad, to, from) (scatter.h), recorded when grad mode is
// on and `grad` requires grad (Note [Double backward of strided scatters]).
Tensor StridedScatter(const Tensor& grad, const StridedGeometry& to, const StridedGeometry& from);

// Registers a hook on the gradient of `t` (torch.Tensor.register_hook): it
// runs on every gradient computed for `t` and may return a replacement, or an
// undefined tensor to keep the gradient. Throws if `t` does not require grad.
void RegisterHook(const Tensor& t, TensorHook hook);

// Accumulates gradients into a leaf's grad (Note [Gradient accumulation]).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);
  std::string name() const override { return "AccumulateGrad"; }
  const Tensor& variable() const { return variable_; }

 protected:
  variable_list apply(variable_list&& grads) override;

 private:
  Tensor variable_;
  std::mutex mutex_;  // Concurrent backward calls may reach one leaf.
};

// "[float [3, 4]]": how autograd's messages name a tensor.
std::string DescribeTensor(const Tensor& t);
std::string DescribeTensor(Dtype dtype, IntArrayRef shape);

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_VARIABLE_H_
