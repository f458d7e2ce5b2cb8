// Module: the base class of every layer and model, as torch.nn.Module.
//
//   ```cpp
//   #include <iostream>
//   #include "nn/linear.h"
//   #include "nn/module.h"
//   #include "tensor/factories.h"
//   class Net : public ember::nn::Cloneable<Net> {
//    public:
//     Net() { reset(); }
//     void reset() override {
//       fc1 = register_module("fc1", std::make_shared<ember::nn::Linear>(784, 128));
//       fc2 = register_module("fc2", std::make_shared<ember::nn::Linear>(128, 10));
//     }
//     ember::Tensor forward(const ember::Tensor& x) override {
//       return (*fc2)((*fc1)(x).relu());
//     }
//     std::shared_ptr<ember::nn::Linear> fc1, fc2;
//   };
//
//   auto net = std::make_shared<Net>();
//   ember::Tensor y = (*net)(ember::randn({32, 784}));  // runs hooks around forward()
//   for (auto& [name, p] : net->named_parameters()) std::cout << name << "\n";  // fc1.weight ...
//   ember::StateDict sd = net->state_dict();
//   auto other = std::make_shared<Net>();
//   EMBER_RETURN_IF_ERROR(other->load_state_dict(sd));          // strict by default
//   std::shared_ptr<ember::nn::Module> replica = net->clone();  // deep copy
//   ```
//
// Fine-tuning, torch's `model.fc = nn.Linear(512, 2)`, works on a model that
// allows it (Note [Replacing a child]; nn/models/resnet.h shows it on ResNet18).
//
// A module owns, in registration order, named parameters (leaf tensors that
// require grad), named buffers (state such as running means) and named child
// modules. Every traversal (parameters(), named_buffers(), state_dict(),
// apply(), ...) visits a module's own entries first, then its children
// depth-first in registration order, as PyTorch does; DataParallel and DDP
// rely on that order being the same in every replica.
//
// Note [Module state lives in the registry]
// Parameters and buffers are stored only in the module's registry; layers
// read them through accessors (Linear::weight()) that index it. So to(dtype),
// to(device) and load_state_dict can replace or refill a tensor in one place
// and nothing else holds a stale handle. Children are shared_ptrs registered
// with register_module; a module may also keep typed pointers to them, which is
// why deep copy follows LibTorch's Cloneable: clone() copy-constructs the
// module (a copy starts with an empty registry), calls the copy's reset() (which
// registers fresh parameters and children, without random initialisation) and
// then copies every parameter and buffer value, requires_grad flag, gradient
// and train/eval flag from the original. Containers whose children come from
// outside (Sequential) override clone() to clone each child instead.
//
// Note [Sharing in clones]
// A clone keeps the original's sharing, as copy.deepcopy does with its memo:
// the outermost clone() on a thread keeps a table from each original tensor
// and module to its copy, and every nested clone() and CopyStateFrom consults
// it. So tied weights (one tensor in two slots) stay one tensor, and a module
// that Sequential holds twice is cloned once and held twice. A Cloneable
// module's reset() builds its own children, and the typed pointers it keeps
// to them are what its forward() calls, so a child such a module registers in
// two slots keeps two copies (their tensors are still shared).
//
// Note [Replacing a child]
// replace_module(name, m) puts `m` in the registry slot of the child `name`,
// keeping its position, so traversals, state_dict() keys and parameters()
// order read as if `m` had been registered there in the first place. The
// hazard is a typed member pointer (`std::shared_ptr<Linear> fc2`) that the
// parent keeps to the old child: forward() would silently go on calling the
// old layer. So a module must opt in by overriding children_replaceable() to
// return true, which states that its forward() reaches its children only
// through the registry (child("fc")), never through a pointer of its own; a
// module that does not opt in (the default, and Sequential) refuses with an
// ember::Error saying so. The caller gets the new child back with its own
// type, the one typed handle that is certainly current. clone() of a module
// with a replaced child runs reset() as usual (which registers the original
// child) and then puts a clone of the replacement in its slot.
//
// Errors: a module's forward and its constructor's argument checks are tensor
// math: a user's mistake throws ember::Error naming the values involved.
// load_state_dict reads data from outside the program and returns
// absl::Status.
//
// Thread-safety: a Module is thread-compatible. Concurrent forward() calls on
// one module are safe when nothing registers, removes hooks or trains at the
// same time (forward in training mode may update buffers, e.g. BatchNorm's
// running statistics); replicate with clone() to train on several threads.
#ifndef EMBER_NN_MODULE_H_
#define EMBER_NN_MODULE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "serialization/state_dict.h"
#include "tensor/tensor.h"

namespace ember::nn {

class Module;

// Removes the hook it was returned for. Safe to call after the module is gone
// and more than once; destroying the handle does not remove the hook.
class HookHandle {
 public:
  HookHandle() = default;
  void remove();

 private:
  friend class Module;
  struct Table;
  HookHandle(std::weak_ptr<Table> table, int64_t id) : table_(std::move(table)), id_(id) {}
  std::weak_ptr<Table> table_;
  int64_t id_ = -1;
};

// Runs before forward(); a returned tensor replaces the input.
using ForwardPreHook = std::function<std::optional<Tensor>(Module& module, const Tensor& input)>;
// Runs after forward(); a returned tensor replaces the output.
using ForwardHook =
    std::function<std::optional<Tensor>(Module& module, const Tensor& input, const Tensor& output)>;
// Runs during backward once the gradient with respect to the module's input
// has been computed (torch.nn.Module.register_full_backward_hook).
// `grad_input` is undefined when the input does not require grad (the hook
// then runs as soon as `grad_output` is known); a returned tensor of the
// input's shape replaces grad_input. The hook must not modify its arguments.
using FullBackwardHook = std::function<std::optional<Tensor>(
    Module& module, const Tensor& grad_input, const Tensor& grad_output)>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module();
  virtual ~Module() = default;

  // The computation; subclasses override it. Call the module through
  // operator() so that hooks run.
  virtual Tensor forward(const Tensor& input) = 0;
  // Runs forward pre-hooks, forward() and forward hooks, in registration order.
  Tensor operator()(const Tensor& input);

  // The type's name ("Linear"), used in messages and printing.
  virtual std::string name() const;

  // --- Registration ---------------------------------------------------------
  // Registers `tensor` as a parameter: it becomes a leaf (detached) that
  // requires grad unless `requires_grad` is false. A tensor that is such a
  // leaf already (another module's parameter) is registered as itself, as
  // torch registers the same Parameter: tied weights are one tensor with one
  // gradient, listed once by parameters(). An undefined tensor
  // registers an absent parameter (Linear without bias), skipped by every
  // traversal. Throws when `name` is empty, contains '.', or is taken.
  const Tensor& register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  // Registers a buffer; non-persistent buffers are left out of state_dict().
  const Tensor& register_buffer(std::string name, Tensor tensor, bool persistent = true);
  // Registers a child module and returns it.
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    RegisterChild(std::move(name), module);
    return module;
  }
  // Replaces the registered child `name` with `module` in place (same
  // position) and returns `module` (Note [Replacing a child]). The new child
  // keeps its own train/eval flag and hooks, as an attribute assignment does
  // in PyTorch. Throws ember::Error when `module` is null, when there is no
  // child `name` (the message lists the existing children), or when this
  // module does not allow replacement (children_replaceable()).
  template <typename M>
  std::shared_ptr<M> replace_module(std::string_view name, std::shared_ptr<M> module) {
    ReplaceChild(name, module);
    return module;
  }

  // --- Traversal (registration order; recurse = include descendants) --------
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module first, then every descendant, depth-first.
  std::vector<std::shared_ptr<Module>> modules();
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();

  // This module's own parameter, buffer or child by name; throws when absent.
  const Tensor& parameter(std::string_view name) const;
  const Tensor& buffer(std::string_view name) const;
  std::shared_ptr<Module> child(std::string_view name) const;

  // --- Modes and gradients --------------------------------------------------
  // Sets training mode on this module and every descendant.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Clears every parameter's gradient: set to none (undefined) by default,
  // as torch >= 2.0, or zeroed in place.
  void zero_grad(bool set_to_none = true);
  // Calls fn on every descendant (depth-first, children before parents) and
  // then on this module, as nn.Module.apply.
  void apply(const std::function<void(Module&)>& fn);

  // Moves or converts every parameter and buffer (and gradient). to(dtype)
  // converts floating-point tensors only, as torch does. Parameters stay
  // leaves with their requires_grad flags; a tensor registered in several
  // modules stays shared. Throws ember::Error (from the tensor layer, e.g. an
  // unavailable device) without changing anything.
  void to(Device device);
  void to(Dtype dtype);

  // Moves every parameter and buffer's storage (and those of descendants)
  // into shared memory in place, as nn.Module.share_memory: the same tensors,
  // now visible to processes this one forks or sends them to
  // (multiprocessing/), so that workers train one model (Hogwild). Gradients
  // stay per process and are not moved. Errors come from
  // multiprocessing::share_memory_ (ResourceExhausted naming the descriptor
  // limit or the /dev/shm size, Unavailable for the shm manager); storages
  // moved before a failure stay shared.
  absl::Status share_memory();

  // --- Serialisation --------------------------------------------------------
  // Parameters and persistent buffers, detached, sharing storage with the
  // module, under dotted names.
  StateDict state_dict() const;
  // Copies values from `state` into this module's parameters and buffers.
  // Returns InvalidArgument naming every missing and unexpected key (when
  // `strict`) and every shape mismatch (always), as PyTorch's "Error(s) in
  // loading state_dict for Linear: ..."; nothing is modified then. Dtypes are
  // converted.
  absl::Status load_state_dict(const StateDict& state, bool strict = true);

  // --- Hooks ---------------------------------------------------------------
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  // Backward hooks fire for calls made while they are registered and grad
  // mode is on (the hooks in place at forward time run, as in PyTorch), once
  // per call: a DataParallel replica fires them once per replica. The module
  // is kept alive until that call's graph is freed when it is owned by a
  // shared_ptr; otherwise it must outlive the backward pass.
  HookHandle register_full_backward_hook(FullBackwardHook hook);
  // Whether any hook of the three kinds is registered (a Sequential fuses
  // only modules without hooks: Note [Sequential fuses a Linear and its
  // activation] in container.h).
  bool has_hooks() const;

  // --- Deep copy -------------------------------------------------------------
  // A module with the same structure and its own copies of every parameter,
  // buffer and gradient (on `device` when given), the same train/eval flags
  // and the same hooks. What the original shares stays shared in the copy,
  // as with copy.deepcopy: a tensor registered in several slots (tied
  // weights) is copied once, and a module that a container (Sequential)
  // holds in several places is cloned once (Note [Sharing in clones]).
  // Cloneable<T> implements it; a module that is not Cloneable throws.
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const;

  // --- Replicas (parallel/replicate.h) -----------------------------------------
  // A module of this structure (made by clone(): the same types, options,
  // train/eval flags and hooks) whose parameter and buffer slots hold
  // `parameters[i]` where this module holds parameters()[i], and `buffers[i]`
  // where it holds buffers()[i] (a tensor registered in several slots fills
  // all of them), stored as given, as torch's _replicate_for_data_parallel:
  // unlike register_parameter, a slot may hold a non-leaf tensor (the output
  // of an autograd op such as parallel's Broadcast), so that gradients flow
  // through the replica back to where its tensors came from. No parameter or
  // buffer value is copied. Throws ember::Error when the counts differ from
  // parameters().size() and buffers().size(), or when the module can't be
  // cloned.
  std::shared_ptr<Module> replicate_for_data_parallel(absl::Span<const Tensor> parameters,
                                                      absl::Span<const Tensor> buffers) const;

  // Printable tree of the module, as print(module) in PyTorch.
  std::string str() const;

 protected:
  Module(const Module& other);
  Module& operator=(const Module&) = delete;

  // The one-line summary inside the printed tree ("in_features=4, ...").
  virtual std::string extra_repr() const { return ""; }

  // True when forward() reaches every child through the registry (child()),
  // so replace_module may swap them (Note [Replacing a child]). A module that
  // keeps its own typed pointers to its children must leave it false.
  virtual bool children_replaceable() const { return false; }

  // Replaces a registered parameter's or buffer's tensor (kept a leaf with
  // the old requires_grad for parameters).
  void set_parameter(std::string_view name, Tensor tensor);
  void set_buffer(std::string_view name, Tensor tensor);

  // The copy clone() returns, without the sharing bookkeeping: Cloneable<T>
  // and containers whose children come from outside (Sequential) implement it.
  virtual std::shared_ptr<Module> CloneImpl(std::optional<Device> device) const;

  // True while Cloneable::clone() runs reset() on a copy: layers skip their
  // random initialisation then, as every value is copied over afterwards.
  static bool InClone();

  // Used by clone() on a copy made with the copy constructor (which copies
  // the train/eval flag and hooks but no registry entries) after its reset():
  // copies every value, requires_grad flag, gradient and train/eval flag
  // from `source`, which must have the same structure.
  void CopyStateFrom(const Module& source, std::optional<Device> device);

 private:
  struct Entry {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };

  void RegisterChild(std::string name, std::shared_ptr<Module> module);
  void ReplaceChild(std::string_view name, std::shared_ptr<Module> module);
  void CheckNewName(const std::string& key, const char* what) const;
  template <typename Fn>
  void ForEachModule(const std::string& prefix, const Fn& fn) const;
  // The defined tensors of `list` (parameters_ or buffers_) of this module
  // (and its descendants when `recurse`), each listed once, with dotted names.
  std::vector<std::pair<std::string, Tensor>> NamedEntries(std::vector<Entry> Module::*list,
                                                           bool recurse) const;
  void ConvertTensors(const std::function<Tensor(const Tensor&)>& convert);
  // replicate_for_data_parallel's second half: puts replacement[t] wherever
  // `source` (of the same structure) holds t.
  void FillReplica(const Module& source,
                   const std::unordered_map<const TensorImpl*, Tensor>& replacement);
  void PrintTo(std::string& out, int indent) const;

  bool training_ = true;
  std::vector<Entry> parameters_;
  std::vector<Entry> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // Names of children put in place by replace_module; clone() clones these
  // rather than keeping what reset() registered.
  std::set<std::string, std::less<>> replaced_children_;
  std::shared_ptr<HookHandle::Table> hooks_;
};

// Scoped: marks the current thread as running Cloneable::clone().
class CloneScope {
 public:
  CloneScope();
  ~CloneScope();
  CloneScope(const CloneScope&) = delete;
  CloneScope& operator=(const CloneScope&) = delete;

 private:
  bool previous_;
};

// The base of modules that can be deep-copied (Note [Module state lives in
// the registry]). Derived must be copy-constructible and implement reset(),
// which registers every parameter, buffer and child; its constructor calls
// reset(). `Base` is Module or an intermediate base derived from it.
template <typename Derived, typename Base = Module>
class Cloneable : public Base {
 public:
  // (Re)creates and registers every parameter, buffer and child.
  virtual void reset() = 0;

  std::shared_ptr<Module> CloneImpl(std::optional<Device> device) const override {
    auto copy = std::make_shared<Derived>(static_cast<const Derived&>(*this));
    {
      CloneScope scope;
      copy->reset();
    }
    copy->CopyStateFrom(*this, device);
    return copy;
  }

 protected:
  using Base::Base;
  Cloneable() = default;
  Cloneable(const Cloneable&) = default;
};

std::ostream& operator<<(std::ostream& os, const Module& module);

}  // namespace ember::nn

#endif  // EMBER_NN_MODULE_H_
