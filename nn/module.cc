#include "nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>
#include <typeinfo>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "multiprocessing/sharing.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::nn {

struct HookHandle::Table {
  int64_t next_id = 0;
  std::vector<std::pair<int64_t, ForwardPreHook>> pre;
  std::vector<std::pair<int64_t, ForwardHook>> post;
  std::vector<std::pair<int64_t, FullBackwardHook>> backward;
};

void HookHandle::remove() {
  std::shared_ptr<Table> table = table_.lock();
  if (table == nullptr) return;
  std::erase_if(table->pre, [&](const auto& e) { return e.first == id_; });
  std::erase_if(table->post, [&](const auto& e) { return e.first == id_; });
  std::erase_if(table->backward, [&](const auto& e) { return e.first == id_; });
}

namespace {

thread_local bool in_clone = false;
// True while replicate_for_data_parallel runs clone(): CopyStateFrom then
// keeps the original's tensors, which FillReplica replaces right after.
thread_local bool in_replicate = false;

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

// A leaf copy of `t` with `requires_grad`, sharing nothing with the graph.
Tensor AsLeaf(const Tensor& t, bool requires_grad) {
  Tensor leaf = t.detach();
  if (requires_grad) leaf.requires_grad_(true);
  return leaf;
}

}  // namespace

CloneScope::CloneScope() : previous_(in_clone) { in_clone = true; }
CloneScope::~CloneScope() { in_clone = previous_; }

bool Module::InClone() { return in_clone; }

Module::Module() : hooks_(std::make_shared<HookHandle::Table>()) {}

Module::Module(const Module& other)
    : enable_shared_from_this(),
      training_(other.training_),
      hooks_(std::make_shared<HookHandle::Table>(*other.hooks_)) {}

std::string Module::name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string full = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  // Drop namespaces and template arguments: "ember::nn::Linear" -> "Linear".
  const size_t angle = full.find('<');
  if (angle != std::string::npos) full.resize(angle);
  const size_t colon = full.rfind("::");
  return colon == std::string::npos ? full : full.substr(colon + 2);
}

namespace {

// Note [Full backward hooks]
// A call with backward hooks passes its input and its output through an
// identity autograd function, so that each gets a node of its own, and hooks
// the gradients of those two aliases: the output's gradient is grad_output,
// the input's is grad_input (the sum over every use of the input inside
// forward). The output's node runs first in backward, so by the time the
// input's hook fires grad_output is known. When the input needs no gradient
// there is no input node, and the hooks run from the output's hook with an
// undefined grad_input, as PyTorch's BackwardHook does.
struct BackwardHookIdentity : autograd::Function<BackwardHookIdentity> {
  static Tensor forward(autograd::AutogradContext*, const Tensor& x) { return x; }
  static autograd::variable_list backward(autograd::AutogradContext*,
                                          autograd::variable_list grads) {
    return grads;
  }
};

// What one call's hooks share between its two gradient hooks.
struct BackwardHookCall {
  Module* module = nullptr;
  std::shared_ptr<Module> keep_alive;  // when the module is shared-owned
  std::vector<std::pair<int64_t, FullBackwardHook>> hooks;
  SizeVector input_shape;
  Tensor grad_output;

  Tensor Run(Tensor grad_input) {
    for (auto& [id, hook] : hooks) {
      std::optional<Tensor> replaced = hook(*module, grad_input, grad_output);
      if (!replaced) continue;
      EMBER_CHECK(grad_input.defined(), module->name(),
                  ": a full backward hook returned a grad_input, but the input does not require "
                  "grad; return std::nullopt");
      EMBER_CHECK(replaced->sizes() == IntArrayRef(input_shape), module->name(),
                  ": a full backward hook returned a grad_input of shape ",
                  ShapeToString(replaced->sizes()), ", expected the input's shape ",
                  ShapeToString(input_shape));
      grad_input = *replaced;
    }
    return grad_input;
  }
};

}  // namespace

bool Module::has_hooks() const {
  return !hooks_->pre.empty() || !hooks_->post.empty() || !hooks_->backward.empty();
}

Tensor Module::operator()(const Tensor& input) {
  const bool backward_hooks = !hooks_->backward.empty() && autograd::GradMode::is_enabled();
  if (hooks_->pre.empty() && hooks_->post.empty() && !backward_hooks) return forward(input);
  Tensor x = input;
  // Copies, so that a hook removing itself does not disturb the iteration.
  auto pre = hooks_->pre;
  for (auto& [id, hook] : pre) {
    if (std::optional<Tensor> replaced = hook(*this, x)) x = *replaced;
  }
  std::shared_ptr<BackwardHookCall> call;
  bool input_hooked = false;
  if (backward_hooks) {
    call = std::make_shared<BackwardHookCall>();
    call->module = this;
    call->keep_alive = weak_from_this().lock();
    call->hooks = hooks_->backward;
    if (x.defined() && x.requires_grad()) {
      call->input_shape = SizeVector(x.sizes().begin(), x.sizes().end());
      x = BackwardHookIdentity::apply(x);
      autograd::RegisterHook(x, [call](const Tensor& grad) { return call->Run(grad); });
      input_hooked = true;
    }
  }
  Tensor y = forward(x);
  auto post = hooks_->post;
  for (auto& [id, hook] : post) {
    if (std::optional<Tensor> replaced = hook(*this, x, y)) y = *replaced;
  }
  if (call != nullptr && y.defined() && y.requires_grad()) {
    y = BackwardHookIdentity::apply(y);
    autograd::RegisterHook(y, [call, input_hooked](const Tensor& grad) {
      call->grad_output = grad;
      if (!input_hooked) call->Run(Tensor());
      return Tensor();
    });
  }
  return y;
}

// --- Registration -------------------------------------------------------------

void Module::CheckNewName(const std::string& key, const char* what) const {
  EMBER_CHECK(!key.empty(), name(), ": ", what, " name can't be empty");
  EMBER_CHECK(key.find('.') == std::string::npos, name(), ": ", what, " name \"", key,
              "\" can't contain \".\"");
  for (const Entry& e : parameters_) {
    EMBER_CHECK(e.name != key, name(), ": attribute \"", key, "\" already exists as a parameter");
  }
  for (const Entry& e : buffers_) {
    EMBER_CHECK(e.name != key, name(), ": attribute \"", key, "\" already exists as a buffer");
  }
  for (const auto& [n, m] : children_) {
    EMBER_CHECK(n != key, name(), ": attribute \"", key, "\" already exists as a child module");
  }
}

const Tensor& Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  CheckNewName(name, "parameter");
  if (tensor.defined()) {
    EMBER_CHECK(!requires_grad || tensor.is_floating_point(), this->name(), ": parameter \"", name,
                "\" of dtype ", dtype_name(tensor.dtype()),
                " can't require gradients; only floating point tensors can");
    // A tensor that is already a parameter (a leaf with the same
    // requires_grad) is registered as itself, as torch registers the same
    // Parameter object: tied weights are one tensor with one gradient.
    if (!(tensor.is_leaf() && tensor.requires_grad() == requires_grad)) {
      autograd::NoGradGuard no_grad;
      tensor = AsLeaf(tensor, requires_grad);
    }
  }
  parameters_.push_back({std::move(name), std::move(tensor), true});
  return parameters_.back().tensor;
}

const Tensor& Module::register_buffer(std::string name, Tensor tensor, bool persistent) {
  CheckNewName(name, "buffer");
  buffers_.push_back({std::move(name), std::move(tensor), persistent});
  return buffers_.back().tensor;
}

void Module::RegisterChild(std::string name, std::shared_ptr<Module> module) {
  CheckNewName(name, "module");
  EMBER_CHECK(module != nullptr, this->name(), ": child module \"", name, "\" is null");
  children_.emplace_back(std::move(name), std::move(module));
}

void Module::ReplaceChild(std::string_view name, std::shared_ptr<Module> module) {
  EMBER_CHECK(module != nullptr, this->name(), ".replace_module: the new child \"", name,
              "\" is null");
  auto it = std::find_if(children_.begin(), children_.end(),
                         [&](const auto& entry) { return entry.first == name; });
  if (it == children_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, m] : children_) names.push_back(absl::StrCat("\"", n, "\""));
    EMBER_FAIL(this->name(), ".replace_module: there is no child module \"", name,
               "\" to replace; ",
               names.empty() ? std::string("it has no child modules")
                             : absl::StrCat("its children are ", absl::StrJoin(names, ", ")));
  }
  EMBER_CHECK(children_replaceable(), this->name(), ".replace_module(\"", name,
              "\"): ", this->name(),
              " does not allow replacing its children, as it may keep its own pointers to them "
              "and go on calling the old one; a module whose forward() reads its children "
              "through child() allows it by overriding children_replaceable()");
  it->second = std::move(module);
  replaced_children_.emplace(name);
}

const Tensor& Module::parameter(std::string_view name) const {
  for (const Entry& e : parameters_) {
    if (e.name == name) return e.tensor;
  }
  EMBER_FAIL(this->name(), " has no parameter \"", name, "\"");
}

const Tensor& Module::buffer(std::string_view name) const {
  for (const Entry& e : buffers_) {
    if (e.name == name) return e.tensor;
  }
  EMBER_FAIL(this->name(), " has no buffer \"", name, "\"");
}

std::shared_ptr<Module> Module::child(std::string_view name) const {
  for (const auto& [n, m] : children_) {
    if (n == name) return m;
  }
  EMBER_FAIL(this->name(), " has no child module \"", name, "\"");
}

void Module::set_parameter(std::string_view name, Tensor tensor) {
  for (Entry& e : parameters_) {
    if (e.name != name) continue;
    const bool requires_grad = e.tensor.defined() ? e.tensor.requires_grad() : true;
    autograd::NoGradGuard no_grad;
    e.tensor = tensor.defined() ? AsLeaf(tensor, requires_grad) : tensor;
    return;
  }
  EMBER_FAIL(this->name(), " has no parameter \"", name, "\"");
}

void Module::set_buffer(std::string_view name, Tensor tensor) {
  for (Entry& e : buffers_) {
    if (e.name != name) continue;
    e.tensor = std::move(tensor);
    return;
  }
  EMBER_FAIL(this->name(), " has no buffer \"", name, "\"");
}

// --- Traversal ----------------------------------------------------------------

template <typename Fn>
void Module::ForEachModule(const std::string& prefix, const Fn& fn) const {
  fn(prefix, *this);
  for (const auto& [name, child] : children_) child->ForEachModule(Join(prefix, name), fn);
}

std::vector<std::pair<std::string, Tensor>> Module::NamedEntries(std::vector<Entry> Module::*list,
                                                                 bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;  // a tensor registered twice is listed once
  auto visit = [&](const std::string& prefix, const Module& m) {
    for (const Entry& e : m.*list) {
      if (e.tensor.defined() && seen.insert(e.tensor.impl()).second) {
        out.emplace_back(Join(prefix, e.name), e.tensor);
      }
    }
  };
  if (recurse) {
    ForEachModule("", visit);
  } else {
    visit("", *this);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  return NamedEntries(&Module::parameters_, recurse);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(std::move(t));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  return NamedEntries(&Module::buffers_, recurse);
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(std::move(t));
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, m] : children_) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  std::unordered_set<const Module*> seen;
  std::function<void(const std::string&, const std::shared_ptr<Module>&)> visit =
      [&](const std::string& prefix, const std::shared_ptr<Module>& m) {
        if (!seen.insert(m.get()).second) return;
        out.emplace_back(prefix, m);
        for (const auto& [name, child] : m->children_) visit(Join(prefix, name), child);
      };
  // A module not owned by a shared_ptr (on the stack) is listed through a
  // non-owning pointer.
  std::shared_ptr<Module> self = weak_from_this().lock();
  if (self == nullptr) self = std::shared_ptr<Module>(this, [](Module*) {});
  visit("", self);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::modules() {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& [name, m] : named_modules()) out.push_back(std::move(m));
  return out;
}

// --- Modes and gradients --------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      autograd::NoGradGuard no_grad;
      g.zero_();
    }
  }
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

void Module::ConvertTensors(const std::function<Tensor(const Tensor&)>& convert) {
  // Converts everything first and assigns only when every conversion
  // succeeded, so a failure (say, an unavailable device) changes nothing. A
  // tensor registered in several places is converted once and stays shared.
  std::map<const TensorImpl*, Tensor> converted;
  std::vector<std::pair<Entry*, Tensor>> pending;
  autograd::NoGradGuard no_grad;
  auto convert_once = [&](const Tensor& t, bool parameter) {
    auto [it, inserted] = converted.try_emplace(t.impl());
    if (inserted) {
      Tensor c = convert(t);
      if (parameter && !c.is_same(t)) {
        c = AsLeaf(c, t.requires_grad());
        if (Tensor g = t.grad(); g.defined()) c.set_grad(convert(g));
      }
      it->second = c;
    }
    return it->second;
  };
  std::function<void(Module&)> visit = [&](Module& m) {
    for (Entry& e : m.parameters_) {
      if (e.tensor.defined()) pending.emplace_back(&e, convert_once(e.tensor, true));
    }
    for (Entry& e : m.buffers_) {
      if (e.tensor.defined()) pending.emplace_back(&e, convert_once(e.tensor, false));
    }
    for (auto& [name, child] : m.children_) visit(*child);
  };
  visit(*this);
  for (auto& [entry, value] : pending) entry->tensor = std::move(value);
}

void Module::to(Device device) {
  ConvertTensors([&](const Tensor& t) { return t.to(device); });
}

void Module::to(Dtype dtype) {
  EMBER_CHECK(is_floating_point(dtype), name(),
              ".to: only floating point dtypes are accepted, but got ", dtype_name(dtype));
  ConvertTensors([&](const Tensor& t) { return t.is_floating_point() ? t.to(dtype) : t; });
}

// --- Serialisation --------------------------------------------------------------

absl::Status Module::share_memory() {
  for (const Tensor& t : parameters()) EMBER_RETURN_IF_ERROR(multiprocessing::share_memory_(t));
  for (const Tensor& t : buffers()) EMBER_RETURN_IF_ERROR(multiprocessing::share_memory_(t));
  return absl::OkStatus();
}

StateDict Module::state_dict() const {
  StateDict out;
  ForEachModule("", [&](const std::string& prefix, const Module& m) {
    for (const Entry& e : m.parameters_) {
      if (e.tensor.defined()) out.emplace_back(Join(prefix, e.name), e.tensor.detach());
    }
    for (const Entry& e : m.buffers_) {
      if (e.tensor.defined() && e.persistent) {
        out.emplace_back(Join(prefix, e.name), e.tensor.detach());
      }
    }
  });
  return out;
}

absl::Status Module::load_state_dict(const StateDict& state, bool strict) {
  // What this module expects, in state_dict() order.
  std::vector<std::pair<std::string, Tensor>> expected = state_dict();
  std::map<std::string, const Tensor*> given;
  for (const auto& [key, t] : state) given.emplace(key, &t);
  std::set<std::string> expected_keys;
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [key, target] : expected) {
    expected_keys.insert(key);
    auto it = given.find(key);
    if (it == given.end()) {
      missing.push_back(absl::StrCat("\"", key, "\""));
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined()) {
      mismatched.push_back(absl::StrCat("value for ", key,
                                        " is an undefined tensor; expected shape ",
                                        ShapeToString(target.sizes())));
    } else if (src.sizes() != target.sizes()) {
      mismatched.push_back(absl::StrCat(
          "size mismatch for ", key, ": copying a param with shape ", ShapeToString(src.sizes()),
          " from checkpoint, the shape in current model is ", ShapeToString(target.sizes()), "."));
    }
  }
  for (const auto& [key, t] : state) {
    if (!expected_keys.contains(key)) unexpected.push_back(absl::StrCat("\"", key, "\""));
  }
  std::vector<std::string> errors;
  if (strict && !missing.empty()) {
    errors.push_back(
        absl::StrCat("Missing key(s) in state_dict: ", absl::StrJoin(missing, ", "), ". "));
  }
  if (strict && !unexpected.empty()) {
    errors.push_back(
        absl::StrCat("Unexpected key(s) in state_dict: ", absl::StrJoin(unexpected, ", "), ". "));
  }
  for (std::string& m : mismatched) errors.push_back(std::move(m));
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Error(s) in loading state_dict for ", name(),
                                                   ":\n\t", absl::StrJoin(errors, "\n\t")));
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [key, target] : expected) {
    auto it = given.find(key);
    if (it != given.end()) target.copy_(*it->second);
  }
  return absl::OkStatus();
}

// --- Hooks ---------------------------------------------------------------------

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  const int64_t id = hooks_->next_id++;
  hooks_->pre.emplace_back(id, std::move(hook));
  return HookHandle(hooks_, id);
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  const int64_t id = hooks_->next_id++;
  hooks_->post.emplace_back(id, std::move(hook));
  return HookHandle(hooks_, id);
}

HookHandle Module::register_full_backward_hook(FullBackwardHook hook) {
  const int64_t id = hooks_->next_id++;
  hooks_->backward.emplace_back(id, std::move(hook));
  return HookHandle(hooks_, id);
}

// --- Deep copy -----------------------------------------------------------------

namespace {

// The originals' copies during the outermost clone() on this thread (Note
// [Sharing in clones]).
struct CloneMemo {
  std::unordered_map<const TensorImpl*, Tensor> tensors;
  std::unordered_map<const Module*, std::shared_ptr<Module>> modules;
};
thread_local CloneMemo* clone_memo = nullptr;

// Makes a memo for the outermost clone() and drops it when that one ends.
class CloneMemoScope {
 public:
  CloneMemoScope() {
    if (clone_memo == nullptr) clone_memo = owned_ = new CloneMemo;
  }
  ~CloneMemoScope() {
    if (owned_ != nullptr) {
      clone_memo = nullptr;
      delete owned_;
    }
  }
  CloneMemoScope(const CloneMemoScope&) = delete;
  CloneMemoScope& operator=(const CloneMemoScope&) = delete;

 private:
  CloneMemo* owned_ = nullptr;
};

}  // namespace

std::shared_ptr<Module> Module::clone(std::optional<Device> device) const {
  CloneMemoScope scope;
  if (auto it = clone_memo->modules.find(this); it != clone_memo->modules.end()) {
    return it->second;
  }
  std::shared_ptr<Module> copy = CloneImpl(device);
  clone_memo->modules.emplace(this, copy);
  return copy;
}

std::shared_ptr<Module> Module::CloneImpl(std::optional<Device> device) const {
  EMBER_FAIL(name(), " can't be cloned: derive it from ember::nn::Cloneable<", name(),
             "> and implement reset(), or override CloneImpl()");
}

void Module::CopyStateFrom(const Module& source, std::optional<Device> device) {
  const std::string where = name();
  auto copy_entries = [&](std::vector<Entry>& to, const std::vector<Entry>& from, bool parameters) {
    EMBER_CHECK(to.size() == from.size(), where, ".clone: reset() registered ", to.size(),
                parameters ? " parameters" : " buffers", " but the original has ", from.size());
    autograd::NoGradGuard no_grad;
    for (size_t i = 0; i < to.size(); ++i) {
      const Tensor& src = from[i].tensor;
      EMBER_CHECK(to[i].name == from[i].name, where, ".clone: reset() registered \"", to[i].name,
                  "\" where the original has \"", from[i].name, "\"");
      to[i].persistent = from[i].persistent;
      if (!src.defined() || in_replicate) {
        to[i].tensor = src;
        continue;
      }
      if (clone_memo != nullptr) {
        if (auto it = clone_memo->tensors.find(src.impl()); it != clone_memo->tensors.end()) {
          to[i].tensor = it->second;  // shared in the original: shared in the copy
          continue;
        }
      }
      Tensor value = (device ? src.to(*device) : src);
      value = value.is_same(src) ? src.clone() : value;
      if (parameters) {
        to[i].tensor = AsLeaf(value, src.requires_grad());
        if (Tensor g = src.grad(); g.defined()) {
          Tensor gc = device ? g.to(*device) : g;
          to[i].tensor.set_grad(gc.is_same(g) ? g.clone() : gc);
        }
      } else {
        to[i].tensor = value;
      }
      if (clone_memo != nullptr) clone_memo->tensors.emplace(src.impl(), to[i].tensor);
    }
  };
  copy_entries(parameters_, source.parameters_, true);
  copy_entries(buffers_, source.buffers_, false);
  training_ = source.training_;
  EMBER_CHECK(children_.size() == source.children_.size(), where, ".clone: reset() registered ",
              children_.size(), " child modules but the original has ", source.children_.size());
  for (size_t i = 0; i < children_.size(); ++i) {
    EMBER_CHECK(children_[i].first == source.children_[i].first, where,
                ".clone: reset() registered child \"", children_[i].first,
                "\" where the original has \"", source.children_[i].first, "\"");
    if (source.replaced_children_.contains(children_[i].first)) {
      // reset() registered the original child; the replacement is cloned
      // whole, with its own hooks, state and flags.
      children_[i].second = source.children_[i].second->clone(device);
      replaced_children_.insert(children_[i].first);
      continue;
    }
    *children_[i].second->hooks_ = *source.children_[i].second->hooks_;
    children_[i].second->CopyStateFrom(*source.children_[i].second, device);
  }
}

std::shared_ptr<Module> Module::replicate_for_data_parallel(
    absl::Span<const Tensor> parameters, absl::Span<const Tensor> buffers) const {
  const std::vector<Tensor> own_parameters = this->parameters();
  const std::vector<Tensor> own_buffers = this->buffers();
  EMBER_CHECK(parameters.size() == own_parameters.size() && buffers.size() == own_buffers.size(),
              name(), ".replicate_for_data_parallel: got ", parameters.size(), " parameters and ",
              buffers.size(), " buffers for a module with ", own_parameters.size(),
              " parameters and ", own_buffers.size(), " buffers");
  std::unordered_map<const TensorImpl*, Tensor> replacement;
  for (size_t i = 0; i < own_parameters.size(); ++i) {
    replacement[own_parameters[i].impl()] = parameters[i];
  }
  for (size_t i = 0; i < own_buffers.size(); ++i) replacement[own_buffers[i].impl()] = buffers[i];
  struct ReplicateScope {
    bool previous = std::exchange(in_replicate, true);
    ~ReplicateScope() { in_replicate = previous; }
  };
  std::shared_ptr<Module> replica;
  {
    ReplicateScope scope;
    replica = clone();
  }
  replica->FillReplica(*this, replacement);
  return replica;
}

void Module::FillReplica(const Module& source,
                         const std::unordered_map<const TensorImpl*, Tensor>& replacement) {
  auto fill = [&](std::vector<Entry>& to, const std::vector<Entry>& from) {
    for (size_t i = 0; i < to.size(); ++i) {
      if (from[i].tensor.defined()) to[i].tensor = replacement.at(from[i].tensor.impl());
    }
  };
  fill(parameters_, source.parameters_);
  fill(buffers_, source.buffers_);
  for (size_t i = 0; i < children_.size(); ++i) {
    children_[i].second->FillReplica(*source.children_[i].second, replacement);
  }
}

// --- Printing -------------------------------------------------------------------

void Module::PrintTo(std::string& out, int indent) const {
  absl::StrAppend(&out, name(), "(", extra_repr());
  if (children_.empty()) {
    absl::StrAppend(&out, ")");
    return;
  }
  absl::StrAppend(&out, "\n");
  const std::string pad(indent + 2, ' ');
  for (const auto& [n, child] : children_) {
    absl::StrAppend(&out, pad, "(", n, "): ");
    child->PrintTo(out, indent + 2);
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, std::string(indent, ' '), ")");
}

std::string Module::str() const {
  std::string out;
  PrintTo(out, 0);
  return out;
}

std::ostream& operator<<(std::ostream& os, const Module& module) { return os << module.str(); }

}  // namespace ember::nn
