#include "autograd/node.h"

#include <vector>

#include "tensor/stream.h"

namespace ember::autograd {
namespace {
thread_local uint64_t t_next_sequence_nr = 0;
}  // namespace

Node::Node() : sequence_nr_(t_next_sequence_nr++) {}

uint64_t PeekSequenceNr() { return t_next_sequence_nr; }

std::vector<std::pair<std::shared_ptr<AutogradNodeInterface>, uint32_t>> Node::next_functions()
    const {
  std::vector<std::pair<std::shared_ptr<AutogradNodeInterface>, uint32_t>> out;
  out.reserve(next_edges_.size());
  for (const Edge& e : next_edges_) out.emplace_back(e.function, e.input_nr);
  return out;
}

uint32_t Node::add_input_metadata(const Tensor& t) {
  const Device device = t.device();
  input_metadata_.push_back(InputMetadata{SizeVector(t.sizes().begin(), t.sizes().end()),
                                          t.dtype(), device,
                                          device.is_cpu() ? Stream() : current_stream(device)});
  return static_cast<uint32_t>(input_metadata_.size() - 1);
}

std::optional<Stream> Node::stream() const {
  for (const InputMetadata& m : input_metadata_) {
    if (!m.device.is_cpu()) return m.stream;
  }
  return std::nullopt;
}

void Node::register_tensor_pre_hook(uint32_t input_nr, std::function<Tensor(const Tensor&)> hook) {
  extras().tensor_pre_hooks.emplace_back(input_nr, std::move(hook));
}

variable_list Node::Run(variable_list&& grads) {
  if (extras_ == nullptr) return apply(std::move(grads));
  for (auto& [input_nr, hook] : extras_->tensor_pre_hooks) {
    if (input_nr >= grads.size() || !grads[input_nr].defined()) continue;
    Tensor replaced = hook(grads[input_nr]);
    if (replaced.defined()) grads[input_nr] = std::move(replaced);
  }
  for (const PreHook& hook : extras_->pre_hooks) {
    variable_list replaced = hook(grads);
    if (!replaced.empty()) {
      EMBER_CHECK(replaced.size() == grads.size(), "a pre hook of ", name(), " returned ",
                  replaced.size(), " gradients; expected ", grads.size());
      grads = std::move(replaced);
    }
  }
  if (extras_->post_hooks.empty()) return apply(std::move(grads));
  variable_list grad_outputs = grads;
  variable_list grad_inputs = apply(std::move(grads));
  for (const PostHook& hook : extras_->post_hooks) {
    variable_list replaced = hook(grad_inputs, grad_outputs);
    if (!replaced.empty()) {
      EMBER_CHECK(replaced.size() == grad_inputs.size(), "a post hook of ", name(), " returned ",
                  replaced.size(), " gradients; expected ", grad_inputs.size());
      grad_inputs = std::move(replaced);
    }
  }
  return grad_inputs;
}

// Note [Node deletion]
// A node owns its next nodes, so dropping the last tensor of a chain of N ops
// would run N nested destructors and overflow the stack for long chains (a
// 100,000-step recurrence). Instead, a deletion that starts while another is
// in progress on this thread is queued, and the outermost one drains the
// queue: the depth stays constant.
namespace internal {
void DeleteNode(Node* node) {
  thread_local std::vector<Node*> pending;
  thread_local bool deleting = false;
  if (deleting) {
    pending.push_back(node);
    return;
  }
  deleting = true;
  delete node;
  while (!pending.empty()) {
    Node* next = pending.back();
    pending.pop_back();
    delete next;
  }
  deleting = false;
}
}  // namespace internal

}  // namespace ember::autograd
