// Reducer: the gradient synchronisation behind DistributedDataParallel
// (torch's c10d::Reducer). It groups the parameters into buckets, watches
// their gradient accumulation during backward, all_reduces each bucket as
// soon as its last gradient is ready and writes the averaged gradients back
// when backward ends. DistributedDataParallel is its only user; it is a
// separate target so that the mechanism can be read and tested on its own.
//
//   auto reducer = Reducer::Create(module->named_parameters(), group, {});
//   Tensor loss = ...(*module)(x)...;
//   reducer->PrepareForBackward(output);   // before backward, every iteration
//   loss.backward();                       // gradients are averaged over ranks
//
// Note [Gradient buckets]
// Buckets: the parameters that require grad, in reverse registration order
// (the order backward usually produces their gradients), are cut into
// buckets of at most `bucket_cap_bytes` (the first one: at most
// `first_bucket_cap_bytes`, so that communication starts early); parameters
// of different dtypes go to different buckets. Each bucket owns one flat,
// contiguous tensor; every parameter has a view of it in its own shape. The
// assignment depends only on the parameters' shapes and dtypes, so every rank
// computes the same buckets (DistributedDataParallel checks the shapes first).
//
// Readiness: a post hook on each parameter's AccumulateGrad node (held alive
// by the reducer, so it is the node every backward reaches) fires once the
// gradient has been accumulated into grad(). The hook copies the gradient
// into the parameter's view (or, with gradient_as_bucket_view, makes grad()
// that view) and, when it was the bucket's last one, starts the bucket's
// asynchronous all_reduce (SUM of gradients divided by the world size). Buckets start in index
// order, so every rank issues the same collectives in the same order whatever order its gradients
// arrive in. The first hook of a backward pass queues a callback (autograd::queue_callback) that
// runs when the engine is done: it waits for every bucket and writes the averaged gradients back
// into grad().
//
// Disagreement without hangs: the last bucket carries a few control values
// after the gradients: an error flag and, with find_unused_parameters, one
// "used" mark per parameter. A rank that reaches the end of backward with
// parameters that got no gradient (find_unused_parameters off) still
// launches every bucket it owes, with zeros in the missing slots and its
// error flag set; so the collectives stay matched, every rank learns from the
// reduced flag that some rank failed, and each raises an error (the failing
// rank names its parameters) instead of waiting for a collective that never
// comes. With find_unused_parameters, the parameters that the forward output
// does not reach (found by walking its autograd graph) are marked ready at
// the first hook with zeros, and the reduced "used" marks tell which
// parameters got a gradient on no rank at all: their grad() is left alone,
// as in torch.
//
// Devices: the buckets live on the parameters' device (one device per
// reducer). The hooks run on the engine's worker thread for that device, under
// the stream their gradient was produced on (Note [Backward streams] in
// autograd/engine.h): the copy into the bucket, the division and the
// all_reduce call queue there, and a device backend (nccl; gloo's pinned
// staging) makes its communication wait for that stream, so nothing blocks
// the host while backward runs. At the end of backward, Work::wait() makes
// the caller's current stream wait for each bucket (the host does not
// block on nccl), and the averaged gradients are copied into grad() on that
// stream; so backward() returns with the gradients ready on the caller's
// stream, as every other result of backward.
//
// Note [Device control values]
// Reading the reduced control values on the host would block it until the
// last all_reduce is done. On a device the error flag is therefore copied to
// pinned host memory on the caller's stream, behind the reduction, with an
// event after it. The next forward (PrepareForBackward or DisarmHooks) reads
// it if the event has completed, which it almost always has, and throws if
// some rank missed gradients; otherwise the forward after that does, and the
// end of the next synchronised backward reads it at the latest, waiting for
// it only then. The rank that missed gradients throws at once, as on the
// CPU; its peers learn of it one or two iterations late, where the CPU tells
// them at once. With find_unused_parameters the "used"
// marks decide which grad() to write, so they are read at the end of
// backward, blocking, as PyTorch's reducer reads its local_used_map.
//
// Errors: Reducer runs inside autograd's backward and Module::forward, which
// report through exceptions, so its failures throw ember::Error: a failed or
// timed-out all_reduce (the process group's status, naming the peer), a
// parameter marked ready twice, parameters without gradients. A failed
// collective also makes the reducer unusable (every later
// PrepareForBackward throws), because ranks no longer agree on the
// collective sequence.
//
// Thread-safety: thread-compatible. PrepareForBackward and the backward pass
// it prepares must run on one thread at a time (the hooks run on the thread
// that runs backward).
#ifndef EMBER_PARALLEL_REDUCER_H_
#define EMBER_PARALLEL_REDUCER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "autograd/node.h"
#include "distributed/future.h"
#include "distributed/process_group.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace ember::parallel {

// Note [Communication hooks]
// A communication hook replaces a bucket's reduction (torch's
// register_comm_hook): once a bucket's gradients are all in its flat tensor,
// the reducer calls hook(bucket) on the thread running backward, with the
// bucket's gradients summed locally and not divided by the world size, and
// the hook returns a Future (distributed/future.h) whose value()[0] is the
// reduced bucket: a tensor of the bucket's element count and dtype, usually
// its buffer() written in place (then nothing is copied). Hooks are called
// in bucket order, so the collective each starts at once overlaps the rest
// of backward; the steps chained after it run when the end of backward
// waits for each future in bucket order (Note [Futures run their steps when
// asked]), so every rank issues a hook's later collectives at the same
// point, whatever finished first. The result is then copied into the bucket
// unless it is the bucket. Without a hook the reducer's own reduction is
// torch's allreduce hook: divide by the world size, all_reduce SUM. The
// control values (Note [Gradient buckets]) are never given to a hook: they
// ride in the last bucket's all_reduce without one, and get an all_reduce
// of their own after every hook's future with one. A hook that throws,
// returns a null future, a future that fails or a tensor of the wrong size
// fails backward with an ember::Error naming the bucket.

// What a communication hook receives (torch.distributed.GradBucket).
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, Tensor buffer, std::vector<Tensor> gradients,
             std::vector<Tensor> parameters, std::shared_ptr<distributed::ProcessGroup> group)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameters_(std::move(parameters)),
        group_(std::move(group)) {}

  // The bucket's place in launch order (0 first); the same on every rank.
  size_t index() const { return index_; }
  // Whether it is the last bucket of the iteration.
  bool is_last() const { return is_last_; }
  // The bucket's gradients, flat (1-D), summed over this rank's backward.
  const Tensor& buffer() const { return buffer_; }
  // Per parameter of the bucket, its gradient: a view of buffer() in the
  // parameter's shape, in the order they sit in buffer().
  const std::vector<Tensor>& gradients() const { return gradients_; }
  const std::vector<Tensor>& parameters() const { return parameters_; }
  // The group the gradients are averaged over (the DDP's).
  const std::shared_ptr<distributed::ProcessGroup>& process_group() const { return group_; }

 private:
  size_t index_;
  bool is_last_;
  Tensor buffer_;
  std::vector<Tensor> gradients_;
  std::vector<Tensor> parameters_;
  std::shared_ptr<distributed::ProcessGroup> group_;
};

// A communication hook (Note [Communication hooks]); parallel/comm_hooks.h
// has PyTorch's built-in ones.
using CommHook = std::function<std::shared_ptr<distributed::Future>(GradBucket& bucket)>;

struct ReducerOptions {
  int64_t bucket_cap_bytes = int64_t{25} << 20;
  int64_t first_bucket_cap_bytes = int64_t{1} << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  // Note [Static graphs].
  bool static_graph = false;
};

// Note [Static graphs]
// With static_graph (torch's DDP static_graph=True) the user promises that
// every iteration uses the same parameters, each the same number of times.
// The first synchronised backward launches nothing while it runs: it counts
// how often each parameter's gradient is accumulated (a parameter inside
// several reentrant backward passes is accumulated once per pass) and, at
// its end, reduces every bucket with the "used" marks of every parameter
// (torch's delayed all_reduce of the first static iteration). The
// parameters no rank used are then known without walking any graph: from
// the second iteration on they are marked ready at the first hook with
// zeros, a parameter is ready at its counted accumulation, and the marks of
// the first iteration decide which grad() to leave alone, as
// find_unused_parameters does each iteration. An iteration whose
// accumulations differ from the first's throws, naming the parameters, since
// the ranks' collectives would no longer match.

// Timings summed over the iterations that synchronised gradients.
struct ReducerStats {
  int64_t iterations = 0;
  // From the first gradient hook to the end of the autograd graph.
  absl::Duration backward_compute_time;
  // Spent after the graph waiting for the buckets' all_reduce: the
  // communication that backward did not hide.
  absl::Duration backward_comm_wait_time;
};

// Note [Gradient readiness]
// The pieces DistributedDataParallel's Reducer and FullyShardedDataParallel
// share. A post hook on a parameter's AccumulateGrad node runs once per
// backward pass, after every gradient of that parameter has been summed into
// grad(): the moment its gradient can be communicated. The nodes are kept
// alive by the owner of the hooks, so that later backward passes reach the
// same nodes (a leaf's node is otherwise made afresh when the last graph
// holding it is gone). The first hook of a pass queues a callback with
// autograd::queue_callback that runs when the engine is done, where the
// owner waits for what it launched (EndOfBackward).

// Registers `on_ready(i)` to run after the gradient of params[i] has been
// accumulated, for every backward pass. Returns the AccumulateGrad nodes,
// which the caller must keep for as long as the hooks are to fire. `on_ready`
// runs on the thread that runs backward; it may throw ember::Error.
std::vector<std::shared_ptr<autograd::Node>> RegisterGradReadyHooks(
    const std::vector<Tensor>& params, std::function<void(size_t index)> on_ready);

// Queues a callback at most once per backward pass (Note [Gradient
// readiness]). Thread-compatible: used from the thread running backward.
class EndOfBackward {
 public:
  // Queues `callback` unless this pass already has; Done() re-arms.
  void QueueOnce(std::function<void()> callback);
  void Done() { queued_ = false; }
  bool queued() const { return queued_; }

 private:
  bool queued_ = false;
};

// The status of an op: the error of the call that issued it, else what its
// Work's wait() returns.
absl::Status WaitFor(const absl::StatusOr<std::shared_ptr<distributed::Work>>& work);

// Copies group rank `root`'s values into `tensors` on every rank: one
// broadcast per (device, dtype) through a flat staging tensor. Blocks up to
// the group's timeout.
absl::Status BroadcastFrom(distributed::ProcessGroup& group, int root,
                           const std::vector<Tensor>& tensors);
inline absl::Status BroadcastFromRank0(distributed::ProcessGroup& group,
                                       const std::vector<Tensor>& tensors) {
  return BroadcastFrom(group, 0, tensors);
}

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // `params`: the named parameters to synchronise (those that do not
  // require grad are skipped). Registers the gradient hooks.
  static std::shared_ptr<Reducer> Create(std::vector<std::pair<std::string, Tensor>> params,
                                         std::shared_ptr<distributed::ProcessGroup> group,
                                         ReducerOptions options);

  // Arms the hooks for the backward pass of `output` (forward with
  // gradient sync on). Waits for any bucket still in flight from an
  // iteration whose backward did not finish. With find_unused_parameters,
  // walks the graph of `output` to find the parameters it does not reach.
  // Throws ember::Error after an earlier communication failure.
  void PrepareForBackward(const Tensor& output);
  // The hooks ignore the next backward pass (forward under no_sync, or
  // without grad mode): gradients accumulate locally. Like
  // PrepareForBackward, first reads a control flag left by an earlier pass on
  // a device, if it has arrived (Note [Device control values]), and throws if
  // a peer failed.
  void DisarmHooks();

  // Join (parallel/join.h), on a rank that has run out of inputs: issues
  // every collective a synchronised backward pass issues (each bucket's
  // reduction, through the hook if one is registered, and the control values),
  // contributing zeros, waits for them, and writes the result into grad()
  // as the end of a synchronised backward does: the others' gradients,
  // divided as theirs are, so that an optimizer stepping on this rank
  // (ZeroRedundancyOptimizer's join hook) updates its share correctly. The
  // group's error, annotated, when a collective fails (the reducer is then
  // unusable, as after a failed backward).
  absl::Status ShadowBackward();
  // The number the built-in reduction divides each bucket by, from the next
  // bucket launched on: the group's size unless set (Join's
  // divide_by_initial_world_size = false sets the number of ranks still
  // training). InvalidArgument unless 1 <= divisor <= the group's size.
  absl::Status SetDivisor(int divisor);

  // Replaces the buckets' reduction from the next backward pass on (Note
  // [Communication hooks]). FailedPrecondition when a hook is already
  // registered (torch allows one) or a backward pass is armed.
  absl::Status RegisterCommHook(CommHook hook);

  // Per bucket, the indices (into the synchronised parameters) it holds,
  // in the order they sit in its flat tensor.
  std::vector<std::vector<size_t>> bucket_indices() const;
  // Per bucket, the bytes of gradients it holds.
  std::vector<int64_t> bucket_bytes() const;
  const ReducerStats& stats() const { return stats_; }

 private:
  struct Slot {
    std::string name;
    Tensor param;
    size_t bucket = 0;
    Tensor view;  // the parameter's piece of its bucket, in its shape
  };
  struct Bucket {
    std::vector<size_t> slots;
    Tensor flat;
    int64_t grad_elements = 0;  // before the control values (last bucket)
    size_t pending = 0;
    // The reduction in flight: the hook's future, or the all_reduce's.
    std::shared_ptr<distributed::Future> future;
  };

  Reducer(std::shared_ptr<distributed::ProcessGroup> group, ReducerOptions options)
      : group_(std::move(group)), options_(options) {}
  void Build(std::vector<std::pair<std::string, Tensor>> params);
  void RegisterHooks();
  void OnGradReady(size_t index);
  void MarkReady(size_t index);
  void LaunchReadyBuckets();
  void Finalize();
  // Starts bucket `b`'s reduction: the hook, or divide and all_reduce.
  void LaunchBucket(size_t b);
  // Waits for every launched bucket and copies a hook's results into the
  // buckets; the first failure, annotated.
  absl::Status WaitAll();
  [[noreturn]] void Fail(absl::Status status);
  // Clears the per-iteration state before a pass (or its shadow).
  void ResetIteration();
  // Throws when the reduced error flag says some rank missed gradients.
  void CheckPeerFlag(float flag, bool deferred);
  // Copies every bucket's reduced gradients into grad() (`marks`: the
  // reduced control values on the host, read with find_unused_parameters).
  void WriteGradients(const Tensor& marks);
  // Reads the flag a device pass left behind (Note [Device control values]);
  // without `block`, only when it has arrived.
  void CheckDeferredFlag(bool block);

  const std::shared_ptr<distributed::ProcessGroup> group_;
  const ReducerOptions options_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  // The AccumulateGrad node of every slot, kept alive so that the hooks on
  // them stay the ones backward reaches.
  std::vector<std::shared_ptr<autograd::Node>> accumulators_;
  int64_t control_elements_ = 0;  // after the gradients in the last bucket
  bool with_used_marks_ = false;  // find_unused_parameters or static_graph
  int divisor_ = 0;               // of the built-in reduction; set by Create
  CommHook comm_hook_;
  // Note [Static graphs]: whether the counting iteration has run, and per
  // slot the accumulations it counted and the reduced "used" marks.
  bool static_counted_ = false;
  std::vector<int> static_counts_;
  std::vector<bool> static_used_;
  std::vector<int> remaining_;  // per slot, accumulations still to come this pass
  // With a hook: the last bucket has been launched and the control values
  // still need their own all_reduce (Note [Communication hooks]).
  bool control_pending_ = false;

  // Per iteration.
  bool expect_hooks_ = false;
  EndOfBackward end_of_backward_;
  std::vector<bool> ready_;
  std::vector<bool> used_;
  std::vector<size_t> unused_;  // find_unused_parameters: not reached by forward
  size_t next_bucket_ = 0;
  bool local_missing_ = false;
  absl::Time first_hook_time_;

  // Note [Device control values]: the previous pass's reduced error flag,
  // in pinned host memory, and the event after which it is there.
  Tensor deferred_flag_;
  std::optional<Event> deferred_flag_ready_;

  absl::Status failure_;  // sticky: a communication failure
  ReducerStats stats_;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_REDUCER_H_
