#include "autograd/variable.h"

#include "autograd/grad_mode.h"
#include "autograd/scatter.h"
#include "tensor/ops.h"

namespace ember::autograd {
namespace {

// Note [Views and in-place]
// Every view knows its base, the tensor that owns the memory (Note [View
// tracking] in tensor/tensor.h), whether or not it was recorded. A recorded
// in-place op on a view rewrites the base's history (CopySlices, record.cc)
// and bumps the version counter shared by base and views; the base then
// requires grad even if it did not before (base = zeros(3);
// base.slice(0, 0, 2).copy_(x) makes base depend on x). Each view remembers
// the version at which its grad_fn was set; when the version has moved on, or
// the view has no history while its base now has one, its grad_fn is
// regenerated as an as_strided view of the base's current history. So every
// view, not only the one written through, sees the write, as in PyTorch.
// Views taken with grad mode off keep the history they have: torch refuses
// to record an in-place write through them (CheckInPlace, record.cc).
class ViewOfBaseBackward final : public Node {
 public:
  ViewOfBaseBackward(StridedGeometry base, StridedGeometry view)
      : base_(std::move(base)), view_(std::move(view)) {}
  std::string name() const override { return "AsStridedBackward"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {StridedScatter(grads[0], base_, view_)};
  }

 private:
  StridedGeometry base_;
  StridedGeometry view_;
};

// Note [Double backward of strided scatters]
// StridedScatter(g, to, from) is linear in g: it gathers g's elements at
// `to`'s positions after adding them at `from`'s. Its adjoint swaps the two
// geometries, so its backward is the same function with them swapped, and
// the double backward of as_strided, stepped slices and writes through views
// is recorded like any other op.
class StridedScatterBackward final : public Node {
 public:
  StridedScatterBackward(StridedGeometry to, StridedGeometry from)
      : to_(std::move(to)), from_(std::move(from)) {}
  std::string name() const override { return "AsStridedBackwardBackward"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {StridedScatter(grads[0], from_, to_)};
  }

 private:
  StridedGeometry to_;
  StridedGeometry from_;
};

}  // namespace

Tensor StridedScatter(const Tensor& grad, const StridedGeometry& to, const StridedGeometry& from) {
  Tensor result = AsStridedBackward(grad, to, from);
  if (!GradMode::is_enabled() || !grad.requires_grad()) return result;
  auto node = MakeNode<StridedScatterBackward>(to, from);
  node->add_next_edge(GradientEdge(grad));
  SetHistory(result, node);
  return result;
}

AutogradMeta* MaterializeMeta(const Tensor& t) {
  EMBER_CHECK(t.defined(), "autograd: the tensor is undefined");
  AutogradMeta* meta = GetMeta(t);
  if (meta == nullptr) {
    auto owned = std::make_unique<AutogradMeta>();
    meta = owned.get();
    t.impl()->set_autograd_meta(std::move(owned));
  }
  return meta;
}

namespace internal {
std::shared_ptr<Node> GradFnOf(const Tensor& t) {
  AutogradMeta* meta = GetMeta(t);
  std::shared_ptr<Node> own = meta != nullptr ? meta->grad_fn_ : nullptr;
  const TensorImpl* impl = t.impl();
  if (!impl->is_view() || impl->is_view_made_without_grad_mode()) return own;
  if (own != nullptr && meta->attr_version_ == t.version()) return own;
  Tensor base(impl->view_base());
  Edge base_edge = GradientEdge(base);  // A base is never a view: no recursion.
  if (!base_edge.is_valid()) return own;
  auto node = MakeNode<ViewOfBaseBackward>(StridedGeometry::Of(base), StridedGeometry::Of(t));
  node->add_next_edge(std::move(base_edge));
  SetHistory(t, node);
  return node;
}
}  // namespace internal

std::shared_ptr<Node> GradAccumulator(const Tensor& leaf) {
  AutogradMeta* meta = MaterializeMeta(leaf);
  std::shared_ptr<Node> acc = meta->grad_accumulator_.lock();
  if (acc != nullptr) return acc;
  auto node = MakeNode<AccumulateGrad>(leaf);
  node->add_input_metadata(leaf);
  meta->grad_accumulator_ = node;
  return node;
}

Edge GradientEdge(const Tensor& t) {
  if (!t.defined()) return Edge();
  if (t.impl()->is_view()) {
    std::shared_ptr<Node> fn = internal::GradFnOf(t);
    if (fn != nullptr) return Edge(std::move(fn), GetMeta(t)->output_nr_);
  } else if (const AutogradMeta* meta = GetMeta(t); meta != nullptr && meta->grad_fn_ != nullptr) {
    return Edge(meta->grad_fn_, meta->output_nr_);
  }
  const AutogradMeta* meta = GetMeta(t);
  if (meta != nullptr && meta->requires_grad_) return Edge(GradAccumulator(t), 0);
  return Edge();
}

void SetHistory(const Tensor& t, const std::shared_ptr<Node>& node) {
  AutogradMeta* meta = MaterializeMeta(t);
  meta->grad_fn_ = node;
  meta->output_nr_ = node->add_input_metadata(t);
  meta->attr_version_ = t.version();
}

void RegisterHook(const Tensor& t, TensorHook hook) {
  EMBER_CHECK(t.requires_grad(),
              "cannot register a hook on a tensor that doesn't require gradient");
  std::shared_ptr<Node> fn = internal::GradFnOf(t);
  AutogradMeta* meta = MaterializeMeta(t);
  if (fn == nullptr) {
    meta->leaf_hooks_.push_back(std::move(hook));
  } else {
    fn->register_tensor_pre_hook(meta->output_nr_, std::move(hook));
  }
}

// Note [Gradient accumulation]
// As PyTorch's AccumulateGrad: the first gradient is stored as it is when
// nothing else can see it (a fresh, contiguous tensor no one else holds) and
// cloned otherwise; later ones are added in place, or out of place when the
// graph of the gradient itself is being recorded (create_graph), so that
// higher-order gradients see the sum.
AccumulateGrad::AccumulateGrad(Tensor variable) : variable_(std::move(variable)) {}

variable_list AccumulateGrad::apply(variable_list&& grads) {
  Tensor grad = std::move(grads[0]);
  if (!grad.defined()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  AutogradMeta* meta = MaterializeMeta(variable_);
  for (const TensorHook& hook : meta->leaf_hooks_) {
    Tensor replaced = hook(grad);
    if (replaced.defined()) grad = std::move(replaced);
  }
  Tensor& stored = meta->grad_;
  if (!stored.defined()) {
    const bool unshared = grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1 &&
                          grad.is_contiguous() && !grad.requires_grad();
    if (!GradMode::is_enabled() && unshared) {
      stored = std::move(grad);
    } else {
      stored = grad.clone();
    }
  } else if (!GradMode::is_enabled()) {
    stored.add_(grad);
  } else {
    stored = stored.add(grad);
  }
  return {};
}

std::string DescribeTensor(const Tensor& t) { return DescribeTensor(t.dtype(), t.sizes()); }

std::string DescribeTensor(Dtype dtype, IntArrayRef shape) {
  std::string_view type;
  switch (dtype) {
    case kFloat32:
      type = "float";
      break;
    case kFloat64:
      type = "double";
      break;
    case kFloat16:
      type = "half";
      break;
    case kBFloat16:
      type = "bfloat16";
      break;
    case kInt64:
      type = "long";
      break;
    case kInt32:
      type = "int";
      break;
    case kBool:
      type = "bool";
      break;
    default:
      type = dtype_name(dtype);
      break;
  }
  return ::ember::internal::Concat("[", type, " ", ShapeToString(shape), "]");
}

}  // namespace ember::autograd
