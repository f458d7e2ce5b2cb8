#include "autograd/engine.h"

#include <algorithm>
#include <queue>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "autograd/anomaly_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "tensor/factories.h"

namespace ember::autograd {
namespace {

// Hands the root gradients to the roots.
class GraphRoot final : public Node {
 public:
  explicit GraphRoot(variable_list grads) : grads_(std::move(grads)) {}
  std::string name() const override { return "GraphRoot"; }

 protected:
  variable_list apply(variable_list&&) override { return std::move(grads_); }

 private:
  variable_list grads_;
};

struct GraphTask {
  bool keep_graph = false;
  // Where the NodeTasks live: in the nodes (claimed by this run), or, when
  // another run holds some of them, in `tasks`.
  bool in_nodes = true;
  std::vector<Node*> claimed;
  absl::flat_hash_map<Node*, NodeTask> tasks;
  // grad(): for each captured node, (its input number, index in `captured`).
  absl::flat_hash_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;
  variable_list captured;
  std::vector<std::function<void()>> callbacks;

  NodeTask& Of(Node* fn) { return in_nodes ? fn->engine_task_ : tasks[fn]; }

  // Registers `fn`; false if it was registered before.
  bool Visit(Node* fn) {
    if (!in_nodes) return tasks.try_emplace(fn).second;
    const void* expected = nullptr;
    if (fn->engine_owner_.compare_exchange_strong(expected, this, std::memory_order_acq_rel)) {
      claimed.push_back(fn);
      return true;
    }
    if (expected == this) return false;
    throw OwnedElsewhere{};
  }

  void ReleaseClaims() {
    for (Node* fn : claimed) {
      fn->engine_task_ = NodeTask();
      fn->engine_owner_.store(nullptr, std::memory_order_release);
    }
    claimed.clear();
  }
  ~GraphTask() { ReleaseClaims(); }

  struct OwnedElsewhere {};
};

thread_local std::vector<GraphTask*> t_running_tasks;

class RunningTask {
 public:
  explicit RunningTask(GraphTask* task) { t_running_tasks.push_back(task); }
  ~RunningTask() { t_running_tasks.pop_back(); }
};

// Counts dependencies; with captures, marks which nodes must run: those from
// which a captured edge is reachable. Iterative post-order, as graphs can be
// long chains.
void PrepareNodes(GraphTask& task, Node* root) {
  const bool capturing = !task.captures.empty();
  struct Frame {
    Node* fn;
    size_t next;
  };
  std::vector<Frame> stack;
  task.Visit(root);
  stack.push_back({root, 0});
  while (!stack.empty()) {
    Frame& frame = stack.back();
    Node* fn = frame.fn;
    if (frame.next < fn->num_outputs()) {
      const Edge& edge = fn->next_edge(frame.next++);
      if (!edge.is_valid()) continue;
      Node* next = edge.function.get();
      const bool first = task.Visit(next);
      ++task.Of(next).dependencies;
      if (first) stack.push_back({next, 0});
      continue;
    }
    stack.pop_back();
    if (!capturing) continue;
    NodeTask& nt = task.Of(fn);
    bool execute = false;
    for (const Edge& edge : fn->next_edges()) {
      if (edge.is_valid() && task.Of(edge.function.get()).needed) execute = true;
    }
    nt.should_execute = execute;
    nt.needed = execute || task.captures.contains(fn);
  }
}

void PrepareTask(GraphTask& task, Node* root) {
  try {
    PrepareNodes(task, root);
  } catch (const GraphTask::OwnedElsewhere&) {
    // Another backward run holds part of this graph: keep the bookkeeping of
    // this one in a table.
    task.ReleaseClaims();
    task.in_nodes = false;
    PrepareNodes(task, root);
  }
}

Tensor MatchInputLayout(Tensor grad, const Node& producer, const Edge& edge, size_t index) {
  const Node& consumer = *edge.function;
  if (edge.input_nr >= consumer.num_inputs()) return grad;
  const InputMetadata& meta = consumer.input_metadata(edge.input_nr);
  if (grad.sizes() != IntArrayRef(meta.shape)) {
    bool expandable = grad.dim() >= static_cast<int64_t>(meta.shape.size());
    for (size_t i = 1; expandable && i <= meta.shape.size(); ++i) {
      int64_t want = meta.shape[meta.shape.size() - i];
      int64_t have = grad.sizes()[grad.dim() - i];
      expandable = want == have || want == 1;
    }
    EMBER_CHECK(expandable, "Function ", producer.name(), " returned an invalid gradient at index ",
                index, " - got ", ShapeToString(grad.sizes()),
                " but expected shape compatible with ", ShapeToString(meta.shape));
    grad = SumToSize(grad, meta.shape);
  }
  if (grad.dtype() != meta.dtype) grad = grad.to(meta.dtype);
  return grad;
}

void CheckNoNan(const Node& fn, const variable_list& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i];
    if (!t.defined() || !t.is_floating_point() || t.numel() == 0) continue;
    NoGradGuard no_grad;
    EMBER_CHECK(t.ne(t).logical_not().sum().item<int64_t>() == t.numel(), "Function '", fn.name(),
                "' returned nan values in its ", i, "th output.");
  }
}

variable_list CallNode(Node& fn, variable_list&& inputs) {
  if (!AnomalyMode::is_enabled()) return fn.Run(std::move(inputs));
  variable_list outputs;
  try {
    outputs = fn.Run(std::move(inputs));
  } catch (const Error& e) {
    std::string origin = fn.forward_op().empty()
                             ? std::string()
                             : ::ember::internal::Concat(" (forward op: ", fn.forward_op(), ")");
    EMBER_FAIL("Error detected in ", fn.name(), origin, ". ", e.what());
  }
  CheckNoNan(fn, outputs);
  return outputs;
}

void Execute(GraphTask& task, const std::shared_ptr<Node>& root) {
  PrepareTask(task, root.get());
  using Ready = std::pair<uint64_t, Node*>;
  std::priority_queue<Ready> ready;
  ready.push({root->sequence_nr(), root.get()});
  while (!ready.empty()) {
    Node* fn = ready.top().second;
    ready.pop();
    variable_list inputs;
    {
      NodeTask& nt = task.Of(fn);
      inputs = std::move(nt.buffer);
      if (inputs.size() < fn->num_inputs()) inputs.resize(fn->num_inputs());
      if (!task.captures.empty()) {
        auto captured = task.captures.find(fn);
        if (captured != task.captures.end()) {
          for (auto [input_nr, index] : captured->second) task.captured[index] = inputs[input_nr];
        }
        if (!nt.should_execute) continue;
      }
    }
    variable_list outputs = CallNode(*fn, std::move(inputs));
    if (!task.keep_graph) fn->release_variables();
    const size_t n = fn->num_outputs();
    EMBER_CHECK(outputs.size() == n || (outputs.empty() && n == 0), "function ", fn->name(),
                " returned an incorrect number of gradients (expected ", n, ", got ",
                outputs.size(), ")");
    for (size_t i = 0; i < n; ++i) {
      const Edge& edge = fn->next_edge(i);
      if (!edge.is_valid()) continue;
      NodeTask& next = task.Of(edge.function.get());
      if (!next.needed) continue;
      if (outputs[i].defined()) {
        Tensor grad = MatchInputLayout(std::move(outputs[i]), *fn, edge, i);
        if (next.buffer.size() <= edge.input_nr) {
          next.buffer.resize(std::max<size_t>(edge.function->num_inputs(), edge.input_nr + 1));
        }
        Tensor& slot = next.buffer[edge.input_nr];
        slot = slot.defined() ? slot.add(grad) : std::move(grad);
      }
      if (--next.dependencies == 0) ready.push({edge.function->sequence_nr(), edge.function.get()});
    }
  }
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    std::function<void()> callback = std::move(task.callbacks[i]);
    callback();
  }
}

// Checks the roots and makes their gradients (ones for one-element roots).
variable_list RootGrads(const variable_list& tensors, const variable_list& grad_tensors,
                        edge_list& roots) {
  EMBER_CHECK(grad_tensors.empty() || grad_tensors.size() == tensors.size(),
              "grad can be implicitly created only for scalar outputs; got ", grad_tensors.size(),
              " gradients for ", tensors.size(), " tensors");
  variable_list grads;
  grads.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    EMBER_CHECK(t.defined(), "element ", i, " of tensors is undefined");
    EMBER_CHECK(t.requires_grad(), "element ", i,
                " of tensors does not require grad and does not have a grad_fn");
    Tensor g = grad_tensors.empty() ? Tensor() : grad_tensors[i];
    if (!g.defined()) {
      EMBER_CHECK(t.numel() == 1,
                  "grad can be implicitly created only for scalar outputs (got "
                  "a tensor of shape ",
                  ShapeToString(t.sizes()), "); pass a gradient");
      g = ones_like(t);
    } else {
      EMBER_CHECK(g.sizes() == t.sizes(), "Mismatch in shape: grad_output[", i, "] has a shape of ",
                  ShapeToString(g.sizes()), " and output[", i, "] has a shape of ",
                  ShapeToString(t.sizes()), ".");
    }
    roots.push_back(GradientEdge(t));
    grads.push_back(std::move(g));
  }
  return grads;
}

}  // namespace

Tensor SumToSize(const Tensor& grad, IntArrayRef shape) {
  if (grad.sizes() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  EMBER_CHECK(lead >= 0, "sum_to_size: size ", ShapeToString(shape), " is not expandable to size ",
              ShapeToString(grad.sizes()));
  SizeVector dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (int64_t d = lead; d < grad.dim(); ++d) {
    const int64_t want = shape[d - lead];
    if (want == 1 && grad.sizes()[d] != 1) {
      dims.push_back(d);
    } else {
      EMBER_CHECK(want == grad.sizes()[d], "sum_to_size: size ", ShapeToString(shape),
                  " is not expandable to size ", ShapeToString(grad.sizes()));
    }
  }
  Tensor r = dims.empty() ? grad : grad.sum(dims, /*keepdim=*/true);
  return r.view(shape);
}

variable_list RunBackward(const edge_list& roots, variable_list inputs, bool keep_graph,
                          bool create_graph, const edge_list& outputs) {
  // The root outlives the task, whose destructor releases the nodes it claimed.
  auto root = MakeNode<GraphRoot>(std::move(inputs));
  root->set_next_edges(roots);
  GraphTask task;
  task.keep_graph = keep_graph;
  task.captured.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].is_valid()) continue;
    task.captures[outputs[i].function.get()].push_back({outputs[i].input_nr, i});
  }
  RunningTask running(&task);
  AutoGradMode grad_mode(create_graph);
  Execute(task, root);
  return std::move(task.captured);
}

void backward(const variable_list& tensors, const variable_list& grad_tensors,
              std::optional<bool> retain_graph, bool create_graph) {
  edge_list roots;
  variable_list grads = RootGrads(tensors, grad_tensors, roots);
  RunBackward(roots, std::move(grads), retain_graph.value_or(create_graph), create_graph, {});
}

variable_list grad(const variable_list& outputs, const variable_list& inputs,
                   const variable_list& grad_outputs, std::optional<bool> retain_graph,
                   bool create_graph, bool allow_unused) {
  edge_list roots;
  variable_list grads = RootGrads(outputs, grad_outputs, roots);
  edge_list input_edges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EMBER_CHECK(inputs[i].defined() && inputs[i].requires_grad(),
                "One of the differentiated Tensors (input ", i, ") does not require grad");
    input_edges.push_back(GradientEdge(inputs[i]));
  }
  variable_list result = RunBackward(roots, std::move(grads), retain_graph.value_or(create_graph),
                                     create_graph, input_edges);
  for (size_t i = 0; i < result.size(); ++i) {
    EMBER_CHECK(result[i].defined() || allow_unused, "One of the differentiated Tensors (input ", i,
                ") appears to not have been used in the graph. Set allow_unused=true if this "
                "is the desired behavior.");
  }
  return result;
}

void queue_callback(std::function<void()> callback) {
  EMBER_CHECK(!t_running_tasks.empty(),
              "Final callbacks can only be installed during backward pass.");
  t_running_tasks.back()->callbacks.push_back(std::move(callback));
}

}  // namespace ember::autograd
