#include "autograd/engine.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "autograd/anomaly_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/saved_tensors_hooks.h"
#include "autograd/variable.h"
#include "tensor/device_guard.h"
#include "tensor/factories.h"
#include "tensor/stream.h"

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

// Note [Device workers]
// A node runs where its gradients are: a node whose first defined non-CPU
// gradient lives on a device of a type with a DeviceGuardImpl (cuda:N) runs
// on that device's worker thread, every other node on the thread that called
// backward (the graph task's owner), as in torch. One worker per device,
// started on first use and kept for the life of the process; each serves a
// queue ordered by sequence number that holds the ready nodes of every graph
// task with work on its device, and runs with its device current. The owner
// thread runs its own nodes and sleeps on the task's condition variable
// until either a node is ready for it or no node is queued or running
// anywhere (`outstanding` is zero): every wait ends by completion. A
// worker that calls backward again (a hook or a custom Function's backward)
// owns the new task and runs that task's nodes of its own device itself, so a
// re-entrant backward never waits on its own thread's queue. (A cycle of
// re-entrant calls across two devices, each waiting on the other's worker,
// would still block; torch breaks it with a second pool, not done here.)
// Errors: the first exception a node raises, on any thread, is kept; nodes
// queued after it are skipped; once nothing is outstanding the owner rethrows
// it. The bookkeeping of a task (dependencies, input buffers, captures,
// callbacks) is guarded by its mutex; nodes run outside it. Workers are
// stopped and joined at exit; a child forked while they ran starts with none.
//
// Note [Backward streams]
// PyTorch's "stream semantics of backward passes". Each node records, for
// each forward output, the stream current on that output's device when the
// op ran (InputMetadata::stream); Node::stream() is the first non-CPU one.
// The engine runs a node under a StreamGuard of that stream, so its backward
// kernels queue on the stream its forward used. A gradient is ready on the
// producing thread's current stream of its device when the producer returns
// (the producer's own stream for its device; the caller's current stream for
// the root gradients). A gradient is on its consumer's device (as torch's
// validate_outputs: a scalar on another device is moved there, anything
// else there is the producer's error, naming both devices). Before it
// enters the consumer's input buffer, the stream the consumer will read it
// on (the consumer's stream for that input) waits on an event recorded on
// the ready stream when the two differ, and sums in the buffer run on that
// stream. The streams where results land, those of AccumulateGrad-like
// nodes (no next edges) and of gradients captured for grad(), are leaf
// streams: when the graph is done the owner's current stream of each leaf
// stream's device waits on it, so backward()'s .grad and grad()'s results are
// ready on the caller's current streams, then the queued callbacks run.
// CPU tensors have no streams: none of this touches a CPU-only graph.

using Ready = std::pair<uint64_t, Node*>;

// The worker thread's device, on a worker thread (Note [Device workers]).
thread_local std::optional<Device> t_worker_device;

std::atomic<bool> g_cpu_nodes_on_worker{false};

std::atomic<uint64_t> g_next_graph_task_id{1};

struct GraphTask : std::enable_shared_from_this<GraphTask> {
  // Unique in the process (internal::CurrentGraphTaskId).
  uint64_t id = g_next_graph_task_id.fetch_add(1, std::memory_order_relaxed);
  bool keep_graph = false;
  bool create_graph = false;
  // The saved-tensor hooks of the calling thread, under which every node of
  // the task runs, on any thread (Note [Saved-tensor hooks]).
  std::shared_ptr<const internal::SavedTensorHooksState> hooks_state;
  // Where the NodeTasks live: in the nodes (claimed by this run), or, when
  // another run holds some of them, in `tasks`.
  bool in_nodes = true;
  std::vector<Node*> claimed;
  absl::flat_hash_map<Node*, NodeTask> tasks;
  // grad(): for each captured node, (its input number, index in `captured`).
  absl::flat_hash_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;
  variable_list captured;
  std::vector<std::function<void()>> callbacks;
  // The device whose worker owns this task (a re-entrant backward on a
  // worker), if any: its nodes run on the owner thread.
  std::optional<Device> owner_device;

  // Guards everything below and the NodeTasks (Note [Device workers]).
  std::mutex mutex;
  std::condition_variable cv;
  std::priority_queue<Ready> local;  // ready nodes for the owner thread
  int64_t outstanding = 0;           // nodes queued or running, anywhere
  std::exception_ptr error;
  std::vector<Stream> leaf_streams;  // Note [Backward streams]

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

  void AddLeafStream(const Stream& s) {
    if (std::find(leaf_streams.begin(), leaf_streams.end(), s) == leaf_streams.end()) {
      leaf_streams.push_back(s);
    }
  }

  struct OwnedElsewhere {};
};

thread_local std::vector<GraphTask*> t_running_tasks;

class RunningTask {
 public:
  explicit RunningTask(GraphTask* task) { t_running_tasks.push_back(task); }
  ~RunningTask() { t_running_tasks.pop_back(); }
};

// The worker threads, one per device (Note [Device workers]).
class DeviceWorkers {
 public:
  struct Item {
    uint64_t sequence_nr;
    std::shared_ptr<GraphTask> task;
    Node* fn;
    bool operator<(const Item& o) const { return sequence_nr < o.sequence_nr; }
  };

  // The process's workers (none yet in a freshly forked child).
  static DeviceWorkers& Get();

  void Push(Device device, Item item) {
    Worker& w = Of(device);
    {
      std::lock_guard<std::mutex> lock(w.mutex);
      w.items.push(std::move(item));
    }
    w.cv.notify_one();
  }

  // Stops every worker once its queue is empty and joins it (at exit, when
  // no backward should be running any more).
  ~DeviceWorkers() {
    std::vector<Worker*> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& w : workers_) all.push_back(w.get());
    }
    for (Worker* w : all) {
      {
        std::lock_guard<std::mutex> wl(w->mutex);
        w->stop = true;
      }
      w->cv.notify_all();
    }
    for (Worker* w : all) {
      if (w->thread.get_id() == std::this_thread::get_id()) {
        w->thread.detach();  // exit() called from a node on this worker
      } else {
        w->thread.join();
      }
    }
  }

 private:
  struct Worker {
    explicit Worker(Device d) : device(d) {}
    Device device;
    std::mutex mutex;
    std::condition_variable cv;
    std::priority_queue<Item> items;
    bool stop = false;
    std::thread thread;
  };

  Worker& Of(Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& w : workers_) {
      if (w->device == device) return *w;
    }
    workers_.push_back(std::make_unique<Worker>(device));
    Worker* w = workers_.back().get();
    w->thread = std::thread([w] { Main(*w); });
    return *w;
  }

  static void Main(Worker& w);

  std::mutex mutex_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

std::atomic<DeviceWorkers*> g_workers{nullptr};

// Deletes the workers at exit (stopping and joining their threads).
struct WorkersAtExit {
  ~WorkersAtExit() { delete g_workers.exchange(nullptr); }
};

DeviceWorkers& DeviceWorkers::Get() {
  static WorkersAtExit at_exit;
  static std::mutex creating;
  DeviceWorkers* w = g_workers.load(std::memory_order_acquire);
  if (w != nullptr) return *w;
  std::lock_guard<std::mutex> lock(creating);
  w = g_workers.load(std::memory_order_acquire);
  if (w == nullptr) {
    static std::once_flag at_fork;
    // The threads do not exist in a forked child: it starts afresh, leaving
    // the parent's objects (whose mutexes may be held) alone.
    std::call_once(at_fork, [] {
      pthread_atfork(nullptr, nullptr, [] { g_workers.store(nullptr); });
    });
    w = new DeviceWorkers();
    g_workers.store(w, std::memory_order_release);
  }
  return *w;
}

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
  if (grad.device() != meta.device) {
    // As torch's validate_outputs: a scalar moves, anything else is the
    // producer's error.
    EMBER_CHECK(grad.dim() == 0, "Function ", producer.name(), " returned an invalid gradient at index ",
                index, " - expected device ", meta.device.str(), " but got ",
                grad.device().str());
    grad = grad.to(meta.device);
  }
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

// Whether `device` has streams and events (a registered DeviceGuardImpl).
bool HasStreams(Device device) {
  return !device.is_cpu() && GetDeviceGuardImpl(device.type()) != nullptr;
}

// Work queued on `consumer` from now on waits for the work queued on
// `producer` so far (Note [Backward streams]).
void WaitStream(const Stream& consumer, const Stream& producer) {
  if (consumer == producer) return;
  Event event(producer.device().type());
  absl::Status status = event.record(producer);
  if (status.ok()) status = event.block(consumer);
  EMBER_CHECK(status.ok(), "autograd: could not make stream ", consumer.id(), " of ",
              consumer.device().str(), " wait for stream ", producer.id(), " of ",
              producer.device().str(), ": ", status.ToString());
}

// Where a node with these input gradients runs: a device's worker, or the
// owner thread (nullopt). Note [Device workers].
std::optional<Device> WorkerDevice(const variable_list& grads) {
  for (const Tensor& g : grads) {
    if (g.defined() && HasStreams(g.device())) return g.device();
  }
  if (g_cpu_nodes_on_worker.load(std::memory_order_relaxed)) return Device(DeviceType::kCPU, 0);
  return std::nullopt;
}

// Queues `fn`, whose gradients are all in, where it runs. Holds task.mutex.
// Counted once queued (a worker cannot finish it before: it needs the mutex).
void Enqueue(GraphTask& task, Node* fn) {
  std::optional<Device> device = WorkerDevice(task.Of(fn).buffer);
  if (!device.has_value() || device == task.owner_device) {
    task.local.push({fn->sequence_nr(), fn});
    ++task.outstanding;
    task.cv.notify_all();
    return;
  }
  DeviceWorkers::Get().Push(*device, {fn->sequence_nr(), task.shared_from_this(), fn});
  ++task.outstanding;
}

// A gradient from `fn`'s output `i`, in the consumer's layout; `ready` is the
// stream it is ready on, for a device gradient.
struct Produced {
  Tensor grad;
  std::optional<Stream> ready;
};

// Runs `fn` (its gradients are all in) and hands its results on; on any
// thread. Never throws: an error is kept in the task (Note [Device workers]).
// Holds task.mutex except while the node runs.
void RunNode(GraphTask& task, Node* fn) {
  std::unique_lock<std::mutex> lock(task.mutex);
  try {
    NodeTask& nt = task.Of(fn);
    variable_list inputs = std::move(nt.buffer);
    if (inputs.size() < fn->num_inputs()) inputs.resize(fn->num_inputs());
    bool run = task.error == nullptr;  // after an error elsewhere, skip
    if (!task.captures.empty()) {
      auto captured = task.captures.find(fn);
      if (captured != task.captures.end()) {
        for (auto [input_nr, index] : captured->second) task.captured[index] = inputs[input_nr];
      }
      run = run && nt.should_execute;
    }
    if (run) {
      lock.unlock();
      RunningTask running(&task);
      AutoGradMode grad_mode(task.create_graph);
      internal::ScopedSavedTensorHooksState hooks_state(task.hooks_state);
      const std::optional<Stream> stream = fn->stream();
      std::optional<StreamGuard> stream_guard;
      if (stream.has_value() && HasStreams(stream->device())) stream_guard.emplace(*stream);

      variable_list outputs = CallNode(*fn, std::move(inputs));
      if (!task.keep_graph) fn->release_variables();
      const size_t n = fn->num_outputs();
      EMBER_CHECK(outputs.size() == n || (outputs.empty() && n == 0), "function ", fn->name(),
                  " returned an incorrect number of gradients (expected ", n, ", got ",
                  outputs.size(), ")");
      absl::InlinedVector<Produced, 2> produced(n);
      for (size_t i = 0; i < n; ++i) {
        const Edge& edge = fn->next_edge(i);
        if (!edge.is_valid() || !outputs[i].defined()) continue;
        Produced& p = produced[i];
        p.grad = MatchInputLayout(std::move(outputs[i]), *fn, edge, i);
        if (HasStreams(p.grad.device())) p.ready = current_stream(p.grad.device());
      }

      lock.lock();
      if (n == 0 && stream_guard.has_value()) task.AddLeafStream(*stream);
      for (size_t i = 0; i < n; ++i) {
        const Edge& edge = fn->next_edge(i);
        if (!edge.is_valid()) continue;
        Node* consumer = edge.function.get();
        NodeTask& next = task.Of(consumer);
        if (!next.needed) continue;
        if (produced[i].grad.defined()) {
          Tensor grad = std::move(produced[i].grad);
          if (next.buffer.size() <= edge.input_nr) {
            next.buffer.resize(std::max<size_t>(consumer->num_inputs(), edge.input_nr + 1));
          }
          Tensor& slot = next.buffer[edge.input_nr];
          std::optional<StreamGuard> sum_stream;
          if (const std::optional<Stream>& ready = produced[i].ready; ready.has_value()) {
            // Note [Backward streams]: the consumer's stream for this input
            // (MatchInputLayout has put the gradient on its device).
            Stream target = *ready;
            if (edge.input_nr < consumer->num_inputs()) {
              target = consumer->input_metadata(edge.input_nr).stream;
            }
            if (target != *ready) {
              WaitStream(target, *ready);
              // Its memory is not reused before the consumer's stream is done with it.
              grad.record_stream(target);
            }
            sum_stream.emplace(target);
            if (!task.captures.empty()) {
              auto captured = task.captures.find(consumer);
              if (captured != task.captures.end()) {
                for (auto [input_nr, index] : captured->second) {
                  if (input_nr == edge.input_nr) task.AddLeafStream(target);
                }
              }
            }
          }
          slot = slot.defined() ? slot.add(grad) : std::move(grad);
        }
        if (--next.dependencies == 0) Enqueue(task, consumer);
      }
    }
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    if (task.error == nullptr) task.error = std::current_exception();
  }
  if (!lock.owns_lock()) lock.lock();
  if (--task.outstanding == 0) task.cv.notify_all();
}

void DeviceWorkers::Main(Worker& w) {
  t_worker_device = w.device;
  DeviceGuard device_guard(w.device);
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(w.mutex);
      w.cv.wait(lock, [&w] { return w.stop || !w.items.empty(); });
      if (w.items.empty()) return;  // stopped
      item = std::move(const_cast<Item&>(w.items.top()));
      w.items.pop();
    }
    RunNode(*item.task, item.fn);
  }
}

void Execute(GraphTask& task, const std::shared_ptr<Node>& root) {
  PrepareTask(task, root.get());
  task.owner_device = t_worker_device;
  {
    std::lock_guard<std::mutex> lock(task.mutex);
    Enqueue(task, root.get());
  }
  while (true) {
    Node* fn;
    {
      std::unique_lock<std::mutex> lock(task.mutex);
      task.cv.wait(lock, [&task] { return !task.local.empty() || task.outstanding == 0; });
      if (task.local.empty()) break;  // nothing queued or running anywhere
      fn = task.local.top().second;
      task.local.pop();
    }
    RunNode(task, fn);
  }
  if (task.error != nullptr) std::rethrow_exception(task.error);
  for (const Stream& leaf : task.leaf_streams) {
    WaitStream(current_stream(leaf.device()), leaf);
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
  // Shared with the workers that run its nodes (Note [Device workers]); its
  // claims on the nodes are released here, once nothing of it runs anywhere.
  auto task = std::make_shared<GraphTask>();
  task->keep_graph = keep_graph;
  task->create_graph = create_graph;
  task->hooks_state = internal::CurrentSavedTensorHooksState();
  task->captured.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].is_valid()) continue;
    task->captures[outputs[i].function.get()].push_back({outputs[i].input_nr, i});
  }
  struct Release {
    GraphTask& task;
    ~Release() { task.ReleaseClaims(); }
  } release{*task};
  RunningTask running(task.get());
  AutoGradMode grad_mode(create_graph);
  Execute(*task, root);
  return std::move(task->captured);
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

namespace internal {
void SetCpuNodesOnWorkerForTesting(bool enabled) { g_cpu_nodes_on_worker.store(enabled); }

uint64_t CurrentGraphTaskId() { return t_running_tasks.empty() ? 0 : t_running_tasks.back()->id; }
}  // namespace internal

void queue_callback(std::function<void()> callback) {
  EMBER_CHECK(!t_running_tasks.empty(),
              "Final callbacks can only be installed during backward pass.");
  GraphTask* task = t_running_tasks.back();
  std::lock_guard<std::mutex> lock(task->mutex);
  task->callbacks.push_back(std::move(callback));
}

}  // namespace ember::autograd
