// Custom autograd functions, shaped like LibTorch's torch::autograd::Function.
//
//   ```cpp
//   #include "autograd/function.h"
//   #include "tensor/factories.h"
//   using ember::Tensor;
//   struct ScaleBy : ember::autograd::Function<ScaleBy> {
//     static Tensor forward(ember::autograd::AutogradContext* ctx, const Tensor& x, double k) {
//       ctx->saved_data["k"] = k;
//       return x * k;
//     }
//     static std::vector<Tensor> backward(ember::autograd::AutogradContext* ctx,
//                                         std::vector<Tensor> grad_outputs) {
//       double k = std::get<double>(ctx->saved_data["k"]);
//       return {grad_outputs[0] * k, Tensor()};  // One entry per forward argument.
//     }
//   };
//   Tensor x = ember::ones({3}).requires_grad_();
//   Tensor y = ScaleBy::apply(x, 2.0);
//   y.sum().backward();  // x.grad() == {2, 2, 2}
//   ```
//
// forward runs with grad mode off and may return a Tensor or a
// std::vector<Tensor>. When grad mode is on and a Tensor argument requires
// grad, the outputs get a node ("ScaleByBackward") whose backward calls
// T::backward with one gradient per output (undefined ones are materialised
// as zeros unless set_materialize_grads(false)); it must return one gradient
// per forward argument (undefined for non-tensors and for inputs that need
// none); extra trailing undefined entries are allowed. A std::vector<Tensor>
// argument counts as one argument per element, in order (LibTorch's
// TensorList), for the gradients and for needs_input_grad alike.
//
// Context:
//   save_for_backward(tensors) / get_saved_variables(): version-checked
//     (Note [Saved tensors]);
//   saved_data: plain values by name;
//   mark_dirty(inputs): the inputs forward modified in place (and returns);
//     their history is rebased onto this node (Note [In-place rules]);
//   mark_non_differentiable(outputs): outputs that never require grad;
//   needs_input_grad(i): whether forward argument i needs a gradient.
//
// Thread-safety: apply may run on any thread; one context belongs to one
// call. Errors throw ember::Error.
#ifndef EMBER_AUTOGRAD_FUNCTION_H_
#define EMBER_AUTOGRAD_FUNCTION_H_

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/record.h"
#include "autograd/saved_variable.h"
#include "autograd/variable.h"
#include "tensor/factories.h"

namespace ember::autograd {

// A plain value kept in AutogradContext::saved_data.
// std::shared_ptr<void> keeps an object of the caller's alive with the node
// (std::static_pointer_cast it back), as LibTorch's saved_data holds custom
// class objects.
using SavedValue = std::variant<std::monostate, bool, int64_t, double, std::string,
                                std::vector<int64_t>, Tensor, std::shared_ptr<void>>;

class AutogradContext {
 public:
  AutogradContext() = default;
  AutogradContext(const AutogradContext&) = delete;
  AutogradContext& operator=(const AutogradContext&) = delete;

  // Saves tensors for backward; call at most once, from forward.
  void save_for_backward(variable_list to_save) { to_save_ = std::move(to_save); }
  // The saved tensors; throws if one was modified in place since forward
  // or the graph was freed.
  variable_list get_saved_variables() const {
    variable_list out;
    if (!saved_.empty() || to_save_.empty()) {
      for (const SavedVariable& s : saved_) out.push_back(s.Unpack());
      return out;
    }
    return to_save_;  // Not recorded: the tensors as given.
  }
  void mark_dirty(const variable_list& inputs) {
    for (const Tensor& t : inputs) dirty_.push_back(t.impl());
  }
  void mark_non_differentiable(const variable_list& outputs) {
    for (const Tensor& t : outputs) non_differentiable_.push_back(t.impl());
  }
  void set_materialize_grads(bool value) { materialize_grads_ = value; }
  // Whether forward argument `index` needs a gradient.
  bool needs_input_grad(size_t index) const {
    return index < needs_input_grad_.size() && needs_input_grad_[index];
  }

  std::unordered_map<std::string, SavedValue> saved_data;

 private:
  template <class T>
  friend struct Function;
  template <class T>
  friend class CppNode;

  static bool Contains(const std::vector<const TensorImpl*>& set, const Tensor& t) {
    for (const TensorImpl* p : set) {
      if (p == t.impl()) return true;
    }
    return false;
  }

  variable_list to_save_;
  std::vector<SavedVariable> saved_;
  std::vector<const TensorImpl*> dirty_;
  std::vector<const TensorImpl*> non_differentiable_;
  std::vector<bool> needs_input_grad_;
  bool materialize_grads_ = true;
};

namespace internal {
inline std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  return out;
}
}  // namespace internal

// The node of a custom function T.
template <class T>
class CppNode final : public Node {
 public:
  std::string name() const override { return internal::Demangle(typeid(T).name()) + "Backward"; }
  void release_variables() override {
    for (SavedVariable& s : ctx_.saved_) s.Release();
  }

  AutogradContext ctx_;
  // For each forward argument: its edge index, or -1 for non-tensors.
  std::vector<int> arg_edges_;

 protected:
  variable_list apply(variable_list&& grads) override {
    if (ctx_.materialize_grads_) {
      for (size_t i = 0; i < grads.size(); ++i) {
        if (grads[i].defined()) continue;
        const InputMetadata& m = input_metadata(i);
        grads[i] = zeros(m.shape, TensorOptions(m.dtype).device(m.device));
      }
    }
    variable_list result = T::backward(&ctx_, std::move(grads));
    const size_t n = arg_edges_.size();
    EMBER_CHECK(result.size() >= n, "function ", name(),
                " returned an incorrect number of gradients (expected ", n, ", got ", result.size(),
                ")");
    for (size_t i = n; i < result.size(); ++i) {
      EMBER_CHECK(!result[i].defined(), "function ", name(),
                  " returned an incorrect number of gradients (expected ", n, ", got ",
                  result.size(), "; extra entries must be undefined)");
    }
    variable_list out(num_outputs());
    for (size_t i = 0; i < n; ++i) {
      if (arg_edges_[i] >= 0) out[arg_edges_[i]] = std::move(result[i]);
    }
    return out;
  }
};

template <class T>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    auto node = MakeNode<CppNode<T>>();
    AutogradContext* ctx = &node->ctx_;
    variable_list inputs;
    bool any_requires_grad = false;
    auto add_tensor = [&](const Tensor& t) {
      node->arg_edges_.push_back(static_cast<int>(inputs.size()));
      inputs.push_back(t);
      const bool r = RequiresGrad(t);
      ctx->needs_input_grad_.push_back(r);
      any_requires_grad = any_requires_grad || r;
    };
    auto collect = [&](const auto& arg) {
      using A = std::decay_t<decltype(arg)>;
      if constexpr (std::is_same_v<A, Tensor>) {
        add_tensor(arg);
      } else if constexpr (std::is_same_v<A, variable_list>) {
        for (const Tensor& t : arg) add_tensor(t);  // LibTorch's TensorList arguments
      } else {
        node->arg_edges_.push_back(-1);
        ctx->needs_input_grad_.push_back(false);
      }
    };
    (collect(args), ...);
    const bool record = GradMode::is_enabled() && any_requires_grad;

    using Result = decltype(T::forward(ctx, std::forward<Args>(args)...));
    static_assert(std::is_same_v<Result, Tensor> || std::is_same_v<Result, variable_list>,
                  "forward must return a Tensor or a std::vector<Tensor>");
    variable_list outputs;
    {
      AutoGradMode no_grad(false);
      if constexpr (std::is_same_v<Result, Tensor>) {
        outputs.push_back(T::forward(ctx, std::forward<Args>(args)...));
      } else {
        outputs = T::forward(ctx, std::forward<Args>(args)...);
      }
    }
    if (record) Record(node, inputs, outputs);
    if constexpr (std::is_same_v<Result, Tensor>) {
      return outputs[0];
    } else {
      return outputs;
    }
  }

 private:
  static void Record(const std::shared_ptr<CppNode<T>>& node, const variable_list& inputs,
                     variable_list& outputs) {
    AutogradContext& ctx = node->ctx_;
    for (const Tensor& in : inputs) node->add_next_edge(GradientEdge(in));
    for (Tensor& out : outputs) {
      if (!out.defined()) {
        node->add_input_metadata(zeros({0}));
        continue;
      }
      const bool is_input = [&] {
        for (const Tensor& in : inputs) {
          if (in.is_same(out)) return true;
        }
        return false;
      }();
      if (AutogradContext::Contains(ctx.dirty_, out)) {
        CheckInPlace(out);
        uint32_t nr = node->add_input_metadata(out);
        RebaseHistory(out, Edge(node, nr));
      } else if (AutogradContext::Contains(ctx.non_differentiable_, out) ||
                 !out.is_floating_point()) {
        node->add_input_metadata(out);
      } else {
        if (is_input) out = out.detach();
        SetHistory(out, node);
      }
    }
    // Out of the context first: saving may throw (a pack hook, Note
    // [Saved-tensor hooks]), and the node must not be left holding its own
    // outputs (they hold the node: a cycle that would never be freed).
    const variable_list to_save = std::move(ctx.to_save_);
    ctx.to_save_.clear();
    for (const Tensor& t : to_save) {
      bool is_output = false;
      for (const Tensor& out : outputs) is_output = is_output || (t.defined() && out.is_same(t));
      ctx.saved_.emplace_back(t, is_output);
    }
  }
};

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_FUNCTION_H_
