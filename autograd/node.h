// Node: one recorded operation of the autograd graph, and Edge, the link from
// a node to the node that receives one of its gradients.
//
// Note [Autograd graph]
// An op that records (its input requires grad and grad mode is on) creates a
// Node whose apply() maps the gradients of the op's outputs to gradients of
// its inputs. next_edges()[i] leads to where the gradient of input i goes:
// the node that produced that input, or the AccumulateGrad node of a leaf, or
// nowhere (an input that does not require grad). Each output tensor points
// back at its node (grad_fn) with its output number, which is the node's
// input number in backward. Nodes hold strong references to the next nodes,
// so a graph lives as long as a tensor that can reach it. Sequence numbers
// grow with creation order on each thread; the engine runs ready nodes with
// the highest number first, which is the reverse of the forward order.
//
// Ops make their nodes with MakeNode and link them with add_next_edge
// (record.h). Users meet nodes as Tensor::grad_fn(), which hands them out
// through AutogradNodeInterface (tensor/tensor.h; name() and
// next_functions()), so that the tensor layer does not depend on this one.
// Every such node is a Node: std::static_pointer_cast<Node>(t.grad_fn())
// gives the full class (hooks, sequence number, next edges):
//
//   ```cpp
//   #include <memory>
//   #include "autograd/node.h"
//   #include "tensor/factories.h"
//   ember::Tensor x = ember::ones({3}).requires_grad_();
//   ember::Tensor y = x * 2;
//   auto node = std::static_pointer_cast<ember::autograd::Node>(y.grad_fn());  // MulBackward
//   const ember::autograd::Edge& to_x = node->next_edge(0);  // x's AccumulateGrad, input 0
//   if (!to_x.is_valid()) return absl::InternalError("x requires grad but has no edge");
//   ```
//
// Thread-safety: a node is built on one thread; the engine runs it on one
// thread at a time, the calling thread's or a device's worker (Note [Device
// workers] in engine.cc). Hooks must be registered before backward runs.
#ifndef EMBER_AUTOGRAD_NODE_H_
#define EMBER_AUTOGRAD_NODE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "tensor/allocator.h"
#include "tensor/tensor.h"

namespace ember::autograd {

class Node;

using variable_list = std::vector<Tensor>;

// Where a gradient flows: input `input_nr` of `function`. Invalid (null
// function) for inputs that need no gradient.
struct Edge {
  Edge() = default;
  Edge(std::shared_ptr<Node> function, uint32_t input_nr)
      : function(std::move(function)), input_nr(input_nr) {}
  bool is_valid() const { return function != nullptr; }

  std::shared_ptr<Node> function;
  uint32_t input_nr = 0;
};

using edge_list = absl::InlinedVector<Edge, 2>;

// What a node's input gradient must look like: the shape, dtype and device of
// the forward output it belongs to. The engine sums broadcast gradients back
// to `shape` and converts them to `dtype` (Note [Gradient layout]). `stream`
// is the stream current on `device` when the output was made (the CPU's
// Stream() for CPU outputs): the backward reads the gradient there (Note
// [Backward streams] in engine.cc).
struct InputMetadata {
  SizeVector shape;
  Dtype dtype = kFloat32;
  Device device = kCPU;
  Stream stream;
};

// The engine's bookkeeping for one node during one backward run (Note
// [Engine]): how many gradients are still to come, and their sum so far.
struct NodeTask {
  int dependencies = 0;
  bool should_execute = true;  // grad(): the node leads to a captured edge.
  bool needed = true;          // should_execute, or its input is captured.
  variable_list buffer;
};

class Node : public AutogradNodeInterface {
 public:
  // Gradients in, possibly modified gradients out.
  using PreHook = std::function<variable_list(const variable_list& grad_outputs)>;
  // (grad_inputs, grad_outputs) -> replacement grad_inputs, or an empty list
  // to keep them.
  using PostHook = std::function<variable_list(const variable_list& grad_inputs,
                                               const variable_list& grad_outputs)>;

  Node();
  ~Node() override = default;
  // Nodes come from the object pool (Note [Object pool] in
  // tensor/allocator.h): graphs of small ops allocate one per op.
  static void* operator new(size_t n) {
    return n <= kPoolMaxBytes ? ::ember::internal::PoolAllocate(n) : ::operator new(n);
  }
  static void operator delete(void* p, size_t n) {
    if (n <= kPoolMaxBytes) {
      ::ember::internal::PoolFree(p, n);
    } else {
      ::operator delete(p);
    }
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Runs the pre hooks, apply() and the post hooks. `grads` has one entry per
  // input (num_inputs()); undefined entries stand for zeros.
  variable_list Run(variable_list&& grads);

  // "MulBackward", "AccumulateGrad", ...
  std::string name() const override = 0;
  // (next_edge(i).function, next_edge(i).input_nr) for each next edge, as
  // torch's grad_fn.next_functions; a null node for invalid edges.
  std::vector<std::pair<std::shared_ptr<AutogradNodeInterface>, uint32_t>> next_functions()
      const override;
  // Frees saved tensors once the graph will not be run again (retain_graph
  // false). Later use of them raises PyTorch's "backward through the graph a
  // second time" error.
  virtual void release_variables() {}

  uint64_t sequence_nr() const { return sequence_nr_; }

  const edge_list& next_edges() const { return next_edges_; }
  const Edge& next_edge(size_t i) const { return next_edges_[i]; }
  size_t num_outputs() const { return next_edges_.size(); }
  void add_next_edge(Edge edge) { next_edges_.push_back(std::move(edge)); }
  void set_next_edges(edge_list edges) { next_edges_ = std::move(edges); }

  // Records that the forward output numbered num_inputs() looks like `t`
  // and returns that number.
  uint32_t add_input_metadata(const Tensor& t);
  size_t num_inputs() const { return input_metadata_.size(); }
  const InputMetadata& input_metadata(size_t i) const { return input_metadata_[i]; }
  // The stream the forward op ran on: that of its first output on a device
  // other than the CPU, or nullopt when all are on the CPU. The engine runs
  // the backward there (Note [Backward streams] in engine.cc).
  std::optional<Stream> stream() const;

  void register_pre_hook(PreHook hook) { extras().pre_hooks.push_back(std::move(hook)); }
  void register_post_hook(PostHook hook) { extras().post_hooks.push_back(std::move(hook)); }
  // Hooks of one forward output (tensor hooks, retain_grad): run on that
  // input's gradient before apply(); they return the replacement gradient or
  // an undefined tensor to keep it.
  void register_tensor_pre_hook(uint32_t input_nr, std::function<Tensor(const Tensor&)> hook);

  // Engine use only: the NodeTask of the backward run that claimed this node
  // (owner), kept in the node so that a run needs no lookup table. A run that
  // finds a node claimed by another run (two threads differentiating one
  // graph) keeps its bookkeeping in a table instead.
  std::atomic<const void*> engine_owner_{nullptr};
  NodeTask engine_task_;

  // Anomaly mode: the forward op that created this node ("mul").
  std::string forward_op() const { return extras_ ? extras_->forward_op : std::string(); }
  void set_forward_op(std::string op) { extras().forward_op = std::move(op); }

 protected:
  virtual variable_list apply(variable_list&& grads) = 0;

 private:
  // What few nodes have (hooks, anomaly data), kept out of line so that the
  // graphs of small ops stay compact.
  struct Extras {
    std::vector<PreHook> pre_hooks;
    std::vector<PostHook> post_hooks;
    std::vector<std::pair<uint32_t, std::function<Tensor(const Tensor&)>>> tensor_pre_hooks;
    std::string forward_op;
  };
  Extras& extras() {
    if (extras_ == nullptr) extras_ = std::make_unique<Extras>();
    return *extras_;
  }

  uint64_t sequence_nr_;
  edge_list next_edges_;
  absl::InlinedVector<InputMetadata, 1> input_metadata_;
  std::unique_ptr<Extras> extras_;
};

namespace internal {
// Deletes nodes one at a time, so that dropping a long chain does not recurse
// once per node (Note [Node deletion]).
void DeleteNode(Node* node);
}  // namespace internal

// Creates a node owned by a shared_ptr whose deleter keeps deletion of long
// chains iterative.
template <typename T, typename... Args>
std::shared_ptr<T> MakeNode(Args&&... args) {
  return std::shared_ptr<T>(new T(std::forward<Args>(args)...), &internal::DeleteNode,
                            PoolAllocator<T>());
}

// The next sequence number of this thread (what the next node will get).
uint64_t PeekSequenceNr();

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_NODE_H_
