#include "parallel/reducer.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"
#include "tensor/stream.h"

namespace ember::parallel {

std::vector<std::shared_ptr<autograd::Node>> RegisterGradReadyHooks(
    const std::vector<Tensor>& params, std::function<void(size_t index)> on_ready) {
  auto shared = std::make_shared<std::function<void(size_t)>>(std::move(on_ready));
  std::vector<std::shared_ptr<autograd::Node>> accumulators;
  for (size_t i = 0; i < params.size(); ++i) {
    std::shared_ptr<autograd::Node> accumulator = autograd::GradAccumulator(params[i]);
    accumulator->register_post_hook(
        [shared, i](const autograd::variable_list&, const autograd::variable_list&) {
          (*shared)(i);
          return autograd::variable_list();
        });
    accumulators.push_back(std::move(accumulator));
  }
  return accumulators;
}

void EndOfBackward::QueueOnce(std::function<void()> callback) {
  if (queued_) return;
  autograd::queue_callback(std::move(callback));
  queued_ = true;
}

absl::Status WaitFor(const absl::StatusOr<std::shared_ptr<distributed::Work>>& work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

absl::Status BroadcastFrom(distributed::ProcessGroup& group, int root,
                           const std::vector<Tensor>& tensors) {
  // One flat tensor per (device, dtype), in first-seen order, so that every
  // rank issues the same broadcasts; it lives where its tensors do, so a
  // device backend (nccl) moves it without staging.
  std::vector<std::pair<std::pair<Device, Dtype>, std::vector<Tensor>>> groups;
  for (const Tensor& t : tensors) {
    const std::pair<Device, Dtype> key(t.device(), t.dtype());
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
    it->second.push_back(t.detach());
  }
  for (auto& [key, list] : groups) {
    int64_t total = 0;
    for (const Tensor& t : list) total += t.numel();
    Tensor flat = empty({total}, TensorOptions().dtype(key.second).device(key.first));
    if (group.rank() == root) {
      int64_t offset = 0;
      for (const Tensor& t : list) {
        flat.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
        offset += t.numel();
      }
    }
    // On a device, wait() makes the current stream wait for the broadcast
    // (nccl, gloo's staging): the copies below queue after it.
    absl::Status status = WaitFor(group.broadcast(flat, {.root = root}));
    if (!status.ok()) return status;
    if (group.rank() == root) continue;
    int64_t offset = 0;
    for (const Tensor& t : list) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<Reducer> Reducer::Create(std::vector<std::pair<std::string, Tensor>> params,
                                         std::shared_ptr<distributed::ProcessGroup> group,
                                         ReducerOptions options) {
  std::shared_ptr<Reducer> reducer(new Reducer(std::move(group), options));
  reducer->divisor_ = reducer->group_->size();
  reducer->Build(std::move(params));
  reducer->RegisterHooks();
  return reducer;
}

// Note [Gradient buckets] in reducer.h.
void Reducer::Build(std::vector<std::pair<std::string, Tensor>> params) {
  for (auto& [name, param] : params) {
    if (param.requires_grad()) slots_.push_back({std::move(name), std::move(param)});
  }
  // One device per reducer (DistributedDataParallel checks the module first):
  // the buckets live there and every collective runs there.
  for (const Slot& slot : slots_) {
    EMBER_CHECK(slot.param.device() == slots_.front().param.device(),
                "Reducer: parameter '", slot.name, "' is on ", slot.param.device().str(),
                " but parameter '", slots_.front().name, "' is on ",
                slots_.front().param.device().str(), "; all must be on one device");
  }
  // Reverse order; one open bucket per dtype.
  struct Open {
    std::vector<size_t> slots;
    int64_t bytes = 0;
    size_t first_position = 0;
  };
  std::map<Dtype, Open> open;
  std::vector<Open> closed;
  auto close = [&](Dtype dtype) {
    closed.push_back(std::move(open[dtype]));
    open.erase(dtype);
  };
  for (size_t position = 0; position < slots_.size(); ++position) {
    const size_t index = slots_.size() - 1 - position;
    const Tensor& p = slots_[index].param;
    Open& bucket = open[p.dtype()];
    if (bucket.slots.empty()) bucket.first_position = position;
    bucket.slots.push_back(index);
    bucket.bytes += static_cast<int64_t>(p.nbytes());
    const int64_t cap = closed.empty()
                            ? std::min(options_.first_bucket_cap_bytes, options_.bucket_cap_bytes)
                            : options_.bucket_cap_bytes;
    if (bucket.bytes >= cap) close(p.dtype());
  }
  while (!open.empty()) close(open.begin()->first);
  // Buckets start in the order their first gradient is expected.
  std::stable_sort(closed.begin(), closed.end(), [](const Open& a, const Open& b) {
    return a.first_position < b.first_position;
  });
  with_used_marks_ = options_.find_unused_parameters || options_.static_graph;
  control_elements_ = 1 + (with_used_marks_ ? static_cast<int64_t>(slots_.size()) : 0);
  for (size_t b = 0; b < closed.size(); ++b) {
    Bucket bucket;
    bucket.slots = closed[b].slots;
    const Dtype dtype = slots_[bucket.slots.front()].param.dtype();
    for (size_t index : bucket.slots) bucket.grad_elements += slots_[index].param.numel();
    const bool last = b + 1 == closed.size();
    bucket.flat = zeros({bucket.grad_elements + (last ? control_elements_ : 0)},
                        TensorOptions().dtype(dtype).device(slots_[bucket.slots.front()].param.device()));
    int64_t offset = 0;
    for (size_t index : bucket.slots) {
      Slot& slot = slots_[index];
      slot.bucket = b;
      slot.view = bucket.flat.narrow(0, offset, slot.param.numel()).view(slot.param.sizes());
      offset += slot.param.numel();
    }
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(slots_.size(), false);
  used_.assign(slots_.size(), false);
  static_counts_.assign(slots_.size(), 0);
  static_used_.assign(slots_.size(), false);
  remaining_.assign(slots_.size(), 0);
}

void Reducer::RegisterHooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  std::vector<Tensor> params;
  for (const Slot& slot : slots_) params.push_back(slot.param);
  accumulators_ = RegisterGradReadyHooks(params, [weak](size_t i) {
    if (std::shared_ptr<Reducer> reducer = weak.lock()) reducer->OnGradReady(i);
  });
}

void Reducer::PrepareForBackward(const Tensor& output) {
  if (!failure_.ok()) {
    EMBER_FAIL(
        "DistributedDataParallel cannot run another iteration: an earlier gradient "
        "all_reduce failed (",
        failure_.ToString(),
        "), so the ranks no longer agree on their collectives; destroy the process group "
        "and restart the job");
  }
  // A backward pass that stopped early (an exception) may have left buckets
  // in flight; their buffers are about to be reused.
  CheckDeferredFlag(/*block=*/false);
  if (absl::Status waited = WaitAll(); !waited.ok()) Fail(waited);
  ResetIteration();
  expect_hooks_ = true;
  if (options_.static_graph) {
    // Note [Static graphs]: the counting pass marks nothing in advance; the
    // later ones know their unused parameters from it, without a graph walk.
    if (!static_counted_) return;
    for (size_t i = 0; i < slots_.size(); ++i) {
      remaining_[i] = static_counts_[i];
      if (static_counts_[i] == 0) unused_.push_back(i);
    }
    return;
  }
  if (!options_.find_unused_parameters) return;
  // Walk the graph of `output`: the AccumulateGrad nodes it reaches.
  std::unordered_set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  if (output.defined() && output.requires_grad()) {
    if (auto root = std::static_pointer_cast<autograd::Node>(output.grad_fn())) {
      stack.push_back(root.get());
      seen.insert(root.get());
    } else {
      // The output is itself a leaf parameter.
      const autograd::Edge edge = autograd::GradientEdge(output);
      if (edge.is_valid()) seen.insert(edge.function.get());
    }
  }
  while (!stack.empty()) {
    const autograd::Node* node = stack.back();
    stack.pop_back();
    for (const autograd::Edge& edge : node->next_edges()) {
      if (!edge.is_valid() || !seen.insert(edge.function.get()).second) continue;
      stack.push_back(edge.function.get());
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!seen.contains(accumulators_[i].get())) unused_.push_back(i);
  }
}

void Reducer::ResetIteration() {
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.slots.size();
    bucket.future.reset();
  }
  control_pending_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(used_.begin(), used_.end(), false);
  unused_.clear();
  next_bucket_ = 0;
  local_missing_ = false;
  end_of_backward_.Done();
}

void Reducer::OnGradReady(size_t index) {
  if (!expect_hooks_) return;
  if (!end_of_backward_.queued()) {
    first_hook_time_ = absl::Now();
    std::weak_ptr<Reducer> weak = weak_from_this();
    end_of_backward_.QueueOnce([weak] {
      if (std::shared_ptr<Reducer> reducer = weak.lock()) reducer->Finalize();
    });
    for (size_t i : unused_) MarkReady(i);
  }
  if (options_.static_graph) {
    // Note [Static graphs].
    used_[index] = true;
    if (!static_counted_) {
      ++static_counts_[index];
      return;
    }
    if (remaining_[index] == 0) {
      EMBER_FAIL("DistributedDataParallel: static_graph = true, but parameter '",
                 slots_[index].name,
                 "' got more gradient accumulations in this backward pass "
                 "than the ",
                 static_counts_[index],
                 " of the first iteration: the graph is not static. Wrap the module without "
                 "static_graph (find_unused_parameters = true handles graphs that change)");
    }
    if (--remaining_[index] == 0) MarkReady(index);
    return;
  }
  if (ready_[index]) {
    EMBER_FAIL("DistributedDataParallel: parameter '", slots_[index].name,
               "' got a gradient twice in one iteration. A parameter must be reduced once per "
               "iteration: this happens when a parameter is used outside forward(), when "
               "backward runs more than once on one forward's graph (retain_graph), or when one "
               "of the unused parameters that find_unused_parameters found before backward "
               "gets a gradient after all");
  }
  used_[index] = true;
  MarkReady(index);
}

void Reducer::MarkReady(size_t index) {
  Slot& slot = slots_[index];
  ready_[index] = true;
  const Tensor grad = slot.param.grad();
  if (!grad.defined()) {
    slot.view.zero_();
  } else if (!options_.gradient_as_bucket_view || grad.raw_data() != slot.view.raw_data()) {
    slot.view.copy_(grad);
    if (options_.gradient_as_bucket_view) slot.param.set_grad(slot.view);
  }
  if (--buckets_[slot.bucket].pending == 0) LaunchReadyBuckets();
}

void Reducer::LaunchReadyBuckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    LaunchBucket(next_bucket_);
    ++next_bucket_;
  }
}

void Reducer::LaunchBucket(size_t b) {
  Bucket& bucket = buckets_[b];
  const bool last = b + 1 == buckets_.size();
  Tensor control;
  if (last) {
    // The control values (Note [Gradient buckets]), written where the
    // bucket lives. The error flag is a fill, which on a device queues on
    // the current stream without waiting; the "used" marks come from the
    // host (on a device, a copy that waits, as PyTorch's local_used_map).
    control = bucket.flat.narrow(0, bucket.grad_elements, control_elements_);
    control.narrow(0, 0, 1).fill_(local_missing_ ? 1.0 : 0.0);
    if (with_used_marks_) {
      Tensor marks = zeros({control_elements_ - 1});
      float* m = marks.data_ptr<float>();
      for (size_t i = 0; i < used_.size(); ++i) m[i] = used_[i] ? 1.0f : 0.0f;
      control.narrow(0, 1, control_elements_ - 1).copy_(marks);
    }
  }
  if (!comm_hook_) {
    // Divided by the world size, then summed, as PyTorch's reducer does:
    // every backend reduces with SUM (gloo and NCCL before 2.10 have no
    // AVG), and the division before the sum keeps large gradients from
    // overflowing. The control values ride along.
    bucket.flat.div_(divisor_);
    absl::StatusOr<std::shared_ptr<distributed::Work>> work =
        group_->allreduce(bucket.flat, {.op = distributed::ReduceOp::kSum});
    bucket.future = work.ok() ? (*work)->get_future() : distributed::Future::Failed(work.status());
    return;
  }
  std::vector<Tensor> gradients, parameters;
  for (size_t index : bucket.slots) {
    gradients.push_back(slots_[index].view);
    parameters.push_back(slots_[index].param);
  }
  GradBucket view(b, last, bucket.flat.narrow(0, 0, bucket.grad_elements), std::move(gradients),
                  std::move(parameters), group_);
  std::shared_ptr<distributed::Future> future;
  try {
    future = comm_hook_(view);
    if (future == nullptr) {
      future = distributed::Future::Failed(
          absl::InvalidArgumentError("the communication hook returned a null future"));
    }
  } catch (const Error& e) {
    future = distributed::Future::Failed(absl::InternalError(
        absl::StrCat("the communication hook threw: ", e.what())));
  }
  bucket.future = std::move(future);
  control_pending_ = last;
}

absl::Status Reducer::WaitAll() {
  absl::Status first;
  auto note = [&](size_t b, const absl::Status& status) {
    if (status.ok() || !first.ok()) return;
    first = absl::Status(
        status.code(), absl::StrCat("DistributedDataParallel: the gradient ",
                                    comm_hook_ ? "communication hook" : "all_reduce",
                                    " of bucket ", b, " of ", buckets_.size(), " failed on rank ",
                                    group_->rank(), ": ", status.message()));
  };
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.future == nullptr) continue;
    const absl::Status status = bucket.future->wait();
    note(b, status);
    if (!status.ok() || !comm_hook_) continue;
    // The hook's result becomes the bucket's gradients.
    const Tensor grads = bucket.flat.narrow(0, 0, bucket.grad_elements);
    const std::vector<Tensor>& value = bucket.future->value();
    if (value.size() != 1 || !value[0].defined() || value[0].numel() != bucket.grad_elements ||
        value[0].dtype() != grads.dtype() || value[0].device() != grads.device()) {
      note(b, absl::InvalidArgumentError(absl::StrCat(
                  "the communication hook's future completed with ",
                  value.size() == 1 && value[0].defined()
                      ? absl::StrCat(std::string(dtype_name(value[0].dtype())), " ",
                                     ShapeToString(value[0].sizes()), " on ",
                                     value[0].device().str())
                      : absl::StrCat(value.size(), " tensors"),
                  ", but the bucket holds ", bucket.grad_elements, " ",
                  std::string(dtype_name(grads.dtype())), " elements on ", grads.device().str(),
                  "; a hook's future must complete with one tensor of the bucket's size, dtype "
                  "and device (usually bucket.buffer() reduced in place)")));
      continue;
    }
    if (value[0].raw_data() != grads.raw_data()) grads.copy_(value[0].reshape({-1}));
  }
  if (control_pending_) {
    // After every hook's chain (Note [Communication hooks]).
    control_pending_ = false;
    const Bucket& last = buckets_.back();
    absl::StatusOr<std::shared_ptr<distributed::Work>> work = group_->allreduce(
        last.flat.narrow(0, last.grad_elements, control_elements_), {.op = distributed::ReduceOp::kSum});
    note(buckets_.size() - 1, work.ok() ? (*work)->wait() : work.status());
  }
  return first;
}

absl::Status Reducer::RegisterCommHook(CommHook hook) {
  if (!hook) {
    return absl::InvalidArgumentError(
        "DistributedDataParallel::register_comm_hook: the hook is empty");
  }
  if (comm_hook_) {
    return absl::FailedPreconditionError(
        "DistributedDataParallel: register_comm_hook can only be called once; this module "
        "already has a communication hook");
  }
  if (expect_hooks_) {
    return absl::FailedPreconditionError(
        "DistributedDataParallel: register_comm_hook was called between a forward and its "
        "backward; register the hook before the first forward, or between iterations");
  }
  comm_hook_ = std::move(hook);
  return absl::OkStatus();
}

void Reducer::Fail(absl::Status status) {
  failure_ = status;
  for (Bucket& bucket : buckets_) bucket.future.reset();
  control_pending_ = false;
  EMBER_FAIL(status.message(), " [", absl::StatusCodeToString(status.code()), "]");
}

void Reducer::Finalize() {
  expect_hooks_ = false;
  end_of_backward_.Done();
  const absl::Time graph_done = absl::Now();
  const bool counting = options_.static_graph && !static_counted_;
  std::vector<std::string> missing;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (ready_[i]) continue;
    if (counting) {
      // Note [Static graphs]: the counting pass reduces every bucket now,
      // in order; a parameter without a gradient is unused, not an error.
      MarkReady(i);
    } else if (options_.static_graph) {
      missing.push_back(absl::StrCat(slots_[i].name, " (", static_counts_[i] - remaining_[i],
                                     " of ", static_counts_[i], ")"));
    } else {
      missing.push_back(slots_[i].name);
    }
  }
  if (!missing.empty()) {
    // Launch what this rank owes anyway, flagged, so that no rank waits for
    // a collective that never comes (Note [Gradient buckets]).
    local_missing_ = true;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!ready_[i]) MarkReady(i);
    }
  }
  absl::Status waited = WaitAll();
  stats_.iterations += 1;
  stats_.backward_compute_time += graph_done - first_hook_time_;
  stats_.backward_comm_wait_time += absl::Now() - graph_done;
  if (!waited.ok()) Fail(waited);
  for (Bucket& bucket : buckets_) bucket.future.reset();
  control_pending_ = false;

  if (!missing.empty() && options_.static_graph) {
    EMBER_FAIL(
        "DistributedDataParallel: static_graph = true, but parameters got fewer gradient "
        "accumulations in this backward pass on rank ",
        group_->rank(), " than in the first iteration: ", absl::StrJoin(missing, ", "),
        ": the graph is not static. Wrap the module without static_graph "
        "(find_unused_parameters = true handles graphs that change)");
  }
  if (!missing.empty()) {
    EMBER_FAIL(
        "DistributedDataParallel: parameters that got no gradient in this backward pass on "
        "rank ",
        group_->rank(), ": ", absl::StrJoin(missing, ", "),
        ". Every parameter must get a gradient in every iteration unless the module is "
        "wrapped with find_unused_parameters = true; also make sure every output of "
        "forward() contributes to the loss");
  }
  const Bucket& last = buckets_.back();
  const Tensor control = last.flat.narrow(0, last.grad_elements, control_elements_);
  Tensor marks;  // the reduced control values on the host, when read now
  if (control.is_cpu() || options_.find_unused_parameters || counting) {
    // On a device this waits for the reduction, as PyTorch's reducer does for
    // the used-parameter map of find_unused_parameters.
    marks = control.cpu().to(kFloat32).contiguous();
    CheckPeerFlag(marks.data_ptr<float>()[0], /*deferred=*/false);
  } else {
    // Note [Device control values]: the flag travels to pinned host memory on
    // the current stream and is read once it is there.
    CheckDeferredFlag(/*block=*/true);  // the previous pass's, if still unread
    deferred_flag_ = control.narrow(0, 0, 1).to(kCPU, /*non_blocking=*/true);
    deferred_flag_ready_.emplace(control.device().type());
    const absl::Status recorded = deferred_flag_ready_->record(current_stream(control.device()));
    if (!recorded.ok()) {
      Fail(absl::Status(recorded.code(),
                        absl::StrCat("DistributedDataParallel: recording the end of the gradient "
                                     "reduction failed: ",
                                     recorded.message())));
    }
  }
  if (counting) {
    for (size_t i = 0; i < slots_.size(); ++i) static_used_[i] = marks.data_ptr<float>()[1 + i] > 0;
    static_counted_ = true;
  }
  WriteGradients(marks);
}

void Reducer::WriteGradients(const Tensor& marks) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    // No rank produced a gradient (find_unused_parameters: this pass;
    // static_graph: the first); leave grad() as it is.
    if (options_.static_graph
            ? !static_used_[i]
            : options_.find_unused_parameters && !(marks.data_ptr<float>()[1 + i] > 0)) {
      continue;
    }
    Slot& slot = slots_[i];
    const Tensor grad = slot.param.grad();
    if (options_.gradient_as_bucket_view) {
      if (!grad.defined() || grad.raw_data() != slot.view.raw_data())
        slot.param.set_grad(slot.view);
    } else if (grad.defined()) {
      grad.copy_(slot.view);
    } else {
      slot.param.set_grad(slot.view.clone());
    }
  }
}

void Reducer::CheckPeerFlag(float flag, bool deferred) {
  if (!(flag > 0)) return;
  const int ranks = static_cast<int>(flag * static_cast<float>(group_->size()) + 0.5f);
  EMBER_FAIL("DistributedDataParallel: ", ranks, " of ", group_->size(),
             " ranks got no gradient for some parameters in ",
             deferred ? "the previous backward pass" : "this backward pass",
             " (their errors name them), while rank ", group_->rank(),
             " got all of them; ranks must agree on which parameters get gradients, or the "
             "module must be wrapped with find_unused_parameters = true",
             deferred ? " (on a device the flag is read at the next forward, so that the end "
                        "of backward does not block the host; the gradients of that pass "
                        "are not to be trusted)"
                      : "");
}

void Reducer::CheckDeferredFlag(bool block) {
  if (!deferred_flag_.defined()) return;
  if (!block && !deferred_flag_ready_->query()) return;  // read at a later call
  const Tensor flag = std::move(deferred_flag_);
  deferred_flag_ = Tensor();
  const absl::Status ready = deferred_flag_ready_->synchronize();
  deferred_flag_ready_.reset();
  if (!ready.ok()) {
    Fail(absl::Status(ready.code(), absl::StrCat("DistributedDataParallel: waiting for the "
                                                 "previous gradient reduction failed: ",
                                                 ready.message())));
  }
  CheckPeerFlag(flag.to(kFloat32).contiguous().data_ptr<float>()[0], /*deferred=*/true);
}

absl::Status Reducer::ShadowBackward() {
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DistributedDataParallel: cannot shadow the other ranks' backward pass: an earlier "
        "gradient all_reduce failed (",
        failure_.ToString(), ")"));
  }
  absl::Status status = WaitAll();
  ResetIteration();
  expect_hooks_ = false;
  for (Bucket& bucket : buckets_) {
    bucket.flat.zero_();
    bucket.pending = 0;
  }
  if (status.ok()) {
    for (size_t b = 0; b < buckets_.size(); ++b) LaunchBucket(b);
    next_bucket_ = buckets_.size();
    status = WaitAll();
  }
  for (Bucket& bucket : buckets_) bucket.future.reset();
  control_pending_ = false;
  if (!status.ok()) {
    failure_ = status;
    return status;
  }
  // The others' average (this rank's share zero) becomes grad(), as after a
  // synchronised backward, so an optimizer that steps here sees it.
  const Bucket& last = buckets_.back();
  Tensor marks;
  if (options_.find_unused_parameters) {
    marks = last.flat.narrow(0, last.grad_elements, control_elements_)
                .cpu()
                .to(kFloat32)
                .contiguous();
  }
  WriteGradients(marks);
  return absl::OkStatus();
}

absl::Status Reducer::SetDivisor(int divisor) {
  if (divisor < 1 || divisor > group_->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedDataParallel: the gradient divisor must be between 1 and the "
                     "group's size ",
                     group_->size(), ", got ", divisor));
  }
  divisor_ = divisor;
  return absl::OkStatus();
}

void Reducer::DisarmHooks() {
  CheckDeferredFlag(/*block=*/false);
  expect_hooks_ = false;
}

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<size_t>> result;
  for (const Bucket& bucket : buckets_) result.push_back(bucket.slots);
  return result;
}

std::vector<int64_t> Reducer::bucket_bytes() const {
  std::vector<int64_t> result;
  for (const Bucket& bucket : buckets_) {
    result.push_back(bucket.grad_elements * static_cast<int64_t>(bucket.flat.element_size()));
  }
  return result;
}

}  // namespace ember::parallel
