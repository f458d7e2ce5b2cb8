#include "parallel/pipelining.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "autograd/engine.h"
#include "distributed/distributed.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

// Note [Pipeline schedules]
// Every schedule is, on each rank, an ordered list of actions (forward or
// backward of one microbatch on one local stage), computed on every rank
// as torch computes its pipeline order; one runtime (PipelineSchedule::Run)
// executes any such list. Before an action it receives what the action
// needs (the previous stage's activation, or the next stage's gradient),
// issuing in the same batch_p2p the sends that earlier actions left
// pending, as torch fuses fwd_send with bwd_recv and bwd_send with
// fwd_recv; it waits for that receive (bounded by the group's timeout),
// computes, and leaves its own send pending for the next batch. Sends are
// waited for only at the end of the step, so a rank never blocks on a peer
// that has not yet reached the matching receive; since torch's orders are
// deadlock-free when each rank receives before computing and sends after,
// so are these.
//
// Each direction of each stage boundary has its own tags (header and data
// of the forward, the gradient of the backward), and on each tag a stage's
// microbatches go in increasing order in every schedule, so a receive
// always matches the message it is for even when one pair of ranks carries
// several boundaries both ways (interleaved). nccl ignores tags (as torch):
// there the interleaved schedule relies on both sides issuing a pair's ops
// in the same order, which this runtime does not check.
//
// The zero-bubble schedule splits a backward in two: I computes only the
// gradient of the stage's input (autograd::grad with the graph kept) and
// sends it on, W later computes only the weights' gradients from the same
// root and adds them to grad(); the activations stay held until W.
//
// The activation's header (dtype, ndim, up to 8 sizes) goes ahead of the
// data so the receiver can size its buffer per microbatch: torch.tensor_split
// makes the last microbatches a row shorter when the batch does not divide.

namespace ember::parallel {
namespace {

constexpr int kHeaderWords = 10;  // dtype, ndim, sizes[8]
constexpr int kMaxDims = kHeaderWords - 2;
constexpr int kTagBase = 7100;

constexpr auto kF = PipelineSchedule::Computation::kForward;
constexpr auto kB = PipelineSchedule::Computation::kBackward;
constexpr auto kI = PipelineSchedule::Computation::kBackwardInput;
constexpr auto kW = PipelineSchedule::Computation::kBackwardWeight;

int FwdHeaderTag(int from_stage) { return kTagBase + 3 * from_stage; }
int FwdDataTag(int from_stage) { return kTagBase + 3 * from_stage + 1; }
int BwdTag(int to_stage) { return kTagBase + 3 * to_stage + 2; }

std::string ShapeString(IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes.begin(), sizes.end(), ", "), "]");
}

absl::StatusOr<std::shared_ptr<distributed::ProcessGroup>> ResolveGroup(
    std::shared_ptr<distributed::ProcessGroup> group) {
  if (group != nullptr) return group;
  absl::StatusOr<distributed::Group> found = distributed::get_default_group();
  if (!found.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PipelineStage: no process group was given and there is no default group; call "
        "init_process_group first or pass options.group (",
        found.status().message(), ")"));
  }
  return *std::move(found);
}

}  // namespace

std::vector<int64_t> MicrobatchSizes(int64_t rows, int chunks) {
  std::vector<int64_t> sizes;
  if (chunks <= 0) return sizes;
  const int64_t base = rows / chunks, extra = rows % chunks;
  for (int i = 0; i < chunks; ++i) sizes.push_back(base + (i < extra ? 1 : 0));
  return sizes;
}

absl::StatusOr<std::shared_ptr<PipelineStage>> PipelineStage::create(
    std::shared_ptr<nn::Module> submodule, int stage_index, int num_stages,
    PipelineStageOptions options) {
  if (submodule == nullptr) {
    return absl::InvalidArgumentError("PipelineStage: the submodule is null");
  }
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineStage: num_stages must be at least 1, got ", num_stages));
  }
  if (stage_index < 0 || stage_index >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("PipelineStage: stage_index ", stage_index,
                                                   " is outside [0, ", num_stages,
                                                   ") for num_stages ", num_stages));
  }
  EMBER_ASSIGN_OR_RETURN(auto group, ResolveGroup(options.group));
  if (num_stages < group->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PipelineStage: num_stages (", num_stages, ") is smaller than the group size (",
        group->size(), "); every rank needs at least one stage"));
  }
  if (stage_index % group->size() != group->rank()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PipelineStage: stage ", stage_index, " runs on rank ", stage_index % group->size(),
        " (stage_index % group size ", group->size(), ") but this is rank ", group->rank()));
  }
  if (options.input_shape && options.input_shape->size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineStage: input_shape has ", options.input_shape->size(),
                     " dimensions; at most ", kMaxDims, " are supported"));
  }
  std::shared_ptr<PipelineStage> stage(new PipelineStage());
  stage->submod_ = std::move(submodule);
  stage->stage_index_ = stage_index;
  stage->num_stages_ = num_stages;
  stage->group_ = std::move(group);
  stage->options_ = std::move(options);
  const std::vector<Tensor> params = stage->submod_->parameters();
  if (!params.empty()) stage->device_ = params.front().device();
  return stage;
}

absl::Status PipelineSchedule::Init(std::vector<std::shared_ptr<PipelineStage>> stages,
                                    int n_microbatches, ScheduleOptions options, const char* name) {
  if (stages.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no stages were given"));
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": stage ", i, " of the list is null"));
    }
    if (stages[i]->group() != stages[0]->group()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": stages ", stages[0]->stage_index(), " and ", stages[i]->stage_index(),
          " use different process groups; all of a rank's stages share one group"));
    }
    if (stages[i]->num_stages() != stages[0]->num_stages()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": stage ", stages[i]->stage_index(), " says num_stages ", stages[i]->num_stages(),
          " but stage ", stages[0]->stage_index(), " says ", stages[0]->num_stages()));
    }
  }
  if (n_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": n_microbatches must be at least 1, got ", n_microbatches));
  }
  std::sort(stages.begin(), stages.end(),
            [](const auto& a, const auto& b) { return a->stage_index() < b->stage_index(); });
  stages_ = std::move(stages);
  n_microbatches_ = n_microbatches;
  options_ = std::move(options);
  return absl::OkStatus();
}

std::string PipelineSchedule::ActionName(const Action& action) {
  const char* letter = "F";
  if (action.computation == kB) letter = "B";
  if (action.computation == kI) letter = "I";
  if (action.computation == kW) letter = "W";
  return absl::StrCat(action.stage, letter, action.microbatch);
}

// --- The runtime ---------------------------------------------------------------

struct PipelineSchedule::Run {
  PipelineSchedule& schedule;
  const std::shared_ptr<distributed::ProcessGroup>& group;
  std::vector<Tensor> input_chunks, target_chunks;
  std::vector<Tensor> outputs_of_last;  // by microbatch
  std::vector<Tensor> losses;
  // Per (stage, microbatch): the stage's input (a leaf) and output.
  std::map<std::pair<int, int>, Tensor> inputs, outputs;
  // Zero bubble: the root of W's backward and its gradient, saved by I.
  std::map<std::pair<int, int>, std::pair<Tensor, Tensor>> weight_roots;
  // Handoffs between consecutive stages on this rank (a group of one).
  std::map<std::pair<int, int>, Tensor> local_activations, local_grads;
  std::vector<distributed::P2PRequest> pending_sends;
  // Issued sends with their tensors, kept alive until the send completes.
  std::vector<std::pair<std::shared_ptr<distributed::Work>, Tensor>> send_works;
  absl::Duration wait_time;
  int in_flight = 0, peak_in_flight = 0;

  PipelineStage& Stage(int s) {
    for (const auto& st : schedule.stages_) {
      if (st->stage_index() == s) return *st;
    }
    throw Error(absl::StrCat("pipeline stage ", s, " is not on this rank"));
  }
  bool Local(const PipelineStage& st, int s) const { return st.stage_rank(s) == group->rank(); }

  // Issues the pending sends and then `recvs` as one batch; waits for the
  // receives.
  absl::Status Exchange(std::vector<distributed::P2PRequest> recvs, const std::string& what) {
    std::vector<distributed::P2PRequest> ops = std::move(pending_sends);
    pending_sends.clear();
    const size_t n_sends = ops.size();
    for (auto& r : recvs) ops.push_back(std::move(r));
    if (ops.empty()) return absl::OkStatus();
    EMBER_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<distributed::Work>> works,
                           group->batch_p2p(ops));
    for (size_t i = 0; i < n_sends; ++i) send_works.emplace_back(works[i], ops[i].tensor);
    // Sends that are done (and succeeded) release their tensors now; failed
    // ones stay for the step's final wait to report.
    std::erase_if(send_works, [](auto& sent) {
      return sent.first->is_completed() && sent.first->status().ok();
    });
    const absl::Time start = absl::Now();
    for (size_t i = n_sends; i < works.size(); ++i) {
      absl::Status s = works[i]->wait();
      if (!s.ok()) {
        wait_time += absl::Now() - start;
        return absl::Status(s.code(), absl::StrCat("pipeline ", what, ": ", s.message()));
      }
    }
    wait_time += absl::Now() - start;
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> ReceiveActivation(PipelineStage& st, int mb) {
    const int s = st.stage_index();
    const int src = st.stage_rank(s - 1);
    Tensor header = empty({kHeaderWords}, TensorOptions(kInt64).device(st.device_));
    EMBER_RETURN_IF_ERROR(
        Exchange({{.op = distributed::OpType::kRecv,
                   .tensor = header,
                   .peer = src,
                   .options = {.tag = FwdHeaderTag(s - 1)}}},
                 absl::StrCat("receive of an activation header (stage ", s, ", microbatch ", mb,
                              ", from stage ", s - 1, " on rank ", src, ")")));
    Tensor h = header.to(kCPU).contiguous();
    const int64_t* w = h.data_ptr<int64_t>();
    const int64_t code = w[0], ndim = w[1];
    if (code < 0 || code >= kNumDtypes || ndim < 0 || ndim > kMaxDims) {
      return absl::InternalError(absl::StrCat("pipeline stage ", s, ": the header from stage ",
                                              s - 1, " for microbatch ", mb,
                                              " is malformed (dtype code ", code, ", ndim ", ndim,
                                              "); do both ranks run the same schedule?"));
    }
    const Dtype dtype = static_cast<Dtype>(code);
    std::vector<int64_t> sizes(w + 2, w + 2 + ndim);
    const PipelineStageOptions& want = st.options_;
    bool mismatch = want.input_dtype.has_value() && *want.input_dtype != dtype;
    if (want.input_shape) {
      if (want.input_shape->size() != sizes.size()) mismatch = true;
      for (size_t d = 0; !mismatch && d < sizes.size(); ++d) {
        if ((*want.input_shape)[d] != -1 && (*want.input_shape)[d] != sizes[d]) mismatch = true;
      }
    }
    if (mismatch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline stage ", s, " expects its input as ",
          want.input_dtype ? std::string(dtype_name(*want.input_dtype)) : std::string("any dtype"),
          " ", want.input_shape ? ShapeString(*want.input_shape) : std::string("any shape"),
          " but stage ", s - 1, " sent ", std::string(dtype_name(dtype)), " ", ShapeString(sizes),
          " for microbatch ", mb, "; fix the stage's input_shape/input_dtype or the split"));
    }
    Tensor data = empty(sizes, TensorOptions(dtype).device(st.device_));
    EMBER_RETURN_IF_ERROR(
        Exchange({{.op = distributed::OpType::kRecv,
                   .tensor = data,
                   .peer = src,
                   .options = {.tag = FwdDataTag(s - 1)}}},
                 absl::StrCat("receive of an activation (stage ", s, ", microbatch ", mb,
                              ", from stage ", s - 1, " on rank ", src, ")")));
    return data;
  }

  absl::Status Forward(int s, int mb) {
    PipelineStage& st = Stage(s);
    Tensor input;
    if (st.is_first()) {
      input = input_chunks[mb];
      EMBER_RETURN_IF_ERROR(Exchange({}, "send"));
    } else if (Local(st, s - 1)) {
      input = local_activations.at({s, mb});
      local_activations.erase({s, mb});
      EMBER_RETURN_IF_ERROR(Exchange({}, "send"));
    } else {
      EMBER_ASSIGN_OR_RETURN(input, ReceiveActivation(st, mb));
    }
    const bool backward = schedule.options_.loss_fn != nullptr;
    if (!st.is_first() && backward && is_floating_point(input.dtype())) input.requires_grad_(true);
    Tensor output;
    try {
      output = (*st.submod())(input);
      if (st.is_last()) {
        outputs_of_last[mb] = output.detach();
        if (backward) losses[mb] = schedule.options_.loss_fn(output, target_chunks[mb]);
      }
    } catch (const Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline stage ", s, ", forward of microbatch ", mb, ": ", e.what()));
    }
    if (!st.is_last()) {
      if (output.dim() > kMaxDims) {
        return absl::InvalidArgumentError(absl::StrCat("pipeline stage ", s, " output has ",
                                                       output.dim(), " dimensions; at most ",
                                                       kMaxDims, " can be sent to the next stage"));
      }
      if (Local(st, s + 1)) {
        local_activations[{s + 1, mb}] = output.detach();
      } else {
        std::vector<int64_t> words(kHeaderWords, 0);
        words[0] = static_cast<int64_t>(output.dtype());
        words[1] = output.dim();
        for (int64_t d = 0; d < output.dim(); ++d) words[2 + d] = output.size(d);
        Tensor header = tensor(words, TensorOptions(kInt64)).to(st.device_);
        const int dst = st.stage_rank(s + 1);
        pending_sends.push_back({.op = distributed::OpType::kSend,
                                 .tensor = header,
                                 .peer = dst,
                                 .options = {.tag = FwdHeaderTag(s)}});
        pending_sends.push_back({.op = distributed::OpType::kSend,
                                 .tensor = output.detach().contiguous(),
                                 .peer = dst,
                                 .options = {.tag = FwdDataTag(s)}});
      }
    }
    if (backward) {
      inputs[{s, mb}] = input;
      outputs[{s, mb}] = output;
      peak_in_flight = std::max(peak_in_flight, ++in_flight);
    }
    return absl::OkStatus();
  }

  // The gradient of stage s's output for microbatch mb: undefined on the
  // last stage (its root is the loss), else received or handed over.
  absl::StatusOr<Tensor> OutputGrad(PipelineStage& st, int mb) {
    const int s = st.stage_index();
    if (st.is_last()) {
      EMBER_RETURN_IF_ERROR(Exchange({}, "send"));
      return Tensor();
    }
    if (Local(st, s + 1)) {
      Tensor grad = local_grads.at({s, mb});
      local_grads.erase({s, mb});
      EMBER_RETURN_IF_ERROR(Exchange({}, "send"));
      return grad;
    }
    const Tensor& output = outputs.at({s, mb});
    Tensor grad = empty(output.sizes(), output.options());
    EMBER_RETURN_IF_ERROR(
        Exchange({{.op = distributed::OpType::kRecv,
                   .tensor = grad,
                   .peer = st.stage_rank(s + 1),
                   .options = {.tag = BwdTag(s)}}},
                 absl::StrCat("receive of a gradient (stage ", s, ", microbatch ", mb,
                              ", from stage ", s + 1, " on rank ", st.stage_rank(s + 1), ")")));
    return grad;
  }

  // Sends (or hands over) the gradient of stage s's input to stage s - 1.
  void SendInputGrad(PipelineStage& st, int mb, Tensor g) {
    const int s = st.stage_index();
    if (st.is_first()) return;
    if (!g.defined()) g = zeros_like(inputs.at({s, mb}));
    if (Local(st, s - 1)) {
      local_grads[{s - 1, mb}] = g;
    } else {
      pending_sends.push_back({.op = distributed::OpType::kSend,
                               .tensor = g.contiguous(),
                               .peer = st.stage_rank(s - 1),
                               .options = {.tag = BwdTag(s - 1)}});
    }
  }

  void Release(int s, int mb) {
    inputs.erase({s, mb});
    outputs.erase({s, mb});
    weight_roots.erase({s, mb});
    --in_flight;
  }

  absl::Status Backward(int s, int mb) {
    PipelineStage& st = Stage(s);
    EMBER_ASSIGN_OR_RETURN(Tensor grad, OutputGrad(st, mb));
    try {
      if (st.is_last()) {
        losses[mb].backward();
      } else {
        const Tensor& output = outputs.at({s, mb});
        if (output.requires_grad()) output.backward(grad);
      }
    } catch (const Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline stage ", s, ", backward of microbatch ", mb, ": ", e.what()));
    }
    if (!st.is_first()) SendInputGrad(st, mb, inputs.at({s, mb}).grad());
    Release(s, mb);
    return absl::OkStatus();
  }

  // Zero bubble's I: the input's gradient only, keeping the graph for W.
  absl::Status BackwardInput(int s, int mb) {
    PipelineStage& st = Stage(s);
    EMBER_ASSIGN_OR_RETURN(Tensor grad, OutputGrad(st, mb));
    Tensor root = st.is_last() ? losses[mb] : outputs.at({s, mb});
    weight_roots[{s, mb}] = {root, grad};
    if (st.is_first()) return absl::OkStatus();
    const Tensor& input = inputs.at({s, mb});
    Tensor g;
    try {
      if (root.requires_grad() && input.requires_grad()) {
        g = autograd::grad({root}, {input},
                           grad.defined() ? std::vector<Tensor>{grad} : std::vector<Tensor>{},
                           /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true)[0];
      }
    } catch (const Error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline stage ", s, ", backward (input) of microbatch ", mb, ": ", e.what()));
    }
    SendInputGrad(st, mb, g);
    return absl::OkStatus();
  }

  // Zero bubble's W: the weights' gradients, accumulated into grad().
  absl::Status BackwardWeight(int s, int mb) {
    PipelineStage& st = Stage(s);
    EMBER_RETURN_IF_ERROR(Exchange({}, "send"));
    const auto [root, grad] = weight_roots.at({s, mb});
    std::vector<Tensor> params;
    for (const Tensor& p : st.submod()->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    try {
      if (!params.empty() && root.requires_grad()) {
        const std::vector<Tensor> grads = autograd::grad(
            {root}, params, grad.defined() ? std::vector<Tensor>{grad} : std::vector<Tensor>{},
            /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t i = 0; i < params.size(); ++i) {
          if (!grads[i].defined()) continue;
          const Tensor old = params[i].grad();
          params[i].set_grad(old.defined() ? old + grads[i] : grads[i]);
        }
      }
    } catch (const Error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline stage ", s, ", backward (weights) of microbatch ", mb, ": ", e.what()));
    }
    Release(s, mb);
    return absl::OkStatus();
  }
};

absl::StatusOr<Tensor> PipelineSchedule::step(const Tensor& input, const Tensor& target,
                                              std::vector<Tensor>* losses) {
  const absl::Time start = absl::Now();
  const std::shared_ptr<distributed::ProcessGroup>& group = stages_.front()->group();
  Run run{.schedule = *this, .group = group};
  const int m = n_microbatches_;
  const bool has_first = stages_.front()->is_first();
  const bool has_last = stages_.back()->is_last();
  const bool backward = options_.loss_fn != nullptr;
  auto split = [&](const Tensor& t, const char* what) -> absl::StatusOr<std::vector<Tensor>> {
    if (t.dim() == 0 || t.size(0) < m) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline step: the ", what, "'s size ", t.dim() == 0 ? 0 : t.size(0),
                       " on dim 0 is smaller than n_microbatches (", m,
                       "); use a batch of at least ", m, " rows or fewer microbatches"));
    }
    std::vector<Tensor> chunks;
    int64_t offset = 0;
    for (int64_t rows : MicrobatchSizes(t.size(0), m)) {
      chunks.push_back(t.narrow(0, offset, rows));
      offset += rows;
    }
    return chunks;
  };
  if (has_first) {
    if (!input.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline step: this rank holds stage 0, the first stage: pass the batch as input"));
    }
    EMBER_ASSIGN_OR_RETURN(run.input_chunks, split(input, "input"));
  }
  if (has_last) {
    if (backward) {
      if (!target.defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pipeline step: this rank holds stage ", stages_.back()->stage_index(),
                         ", the last stage, and the schedule has a loss_fn: pass the target"));
      }
      EMBER_ASSIGN_OR_RETURN(run.target_chunks, split(target, "target"));
    }
    run.outputs_of_last.resize(m);
    run.losses.resize(m);
  }
  absl::Status status;
  for (const Action& a : actions_) {
    switch (a.computation) {
      case Computation::kForward:
        status = run.Forward(a.stage, a.microbatch);
        break;
      case Computation::kBackward:
        status = run.Backward(a.stage, a.microbatch);
        break;
      case Computation::kBackwardInput:
        status = run.BackwardInput(a.stage, a.microbatch);
        break;
      case Computation::kBackwardWeight:
        status = run.BackwardWeight(a.stage, a.microbatch);
        break;
    }
    if (!status.ok()) break;
  }
  if (status.ok()) status = run.Exchange({}, "send");
  const absl::Time wait_start = absl::Now();
  for (const auto& [work, sent] : run.send_works) {
    absl::Status s = work->wait();
    if (status.ok() && !s.ok()) {
      status = absl::Status(s.code(), absl::StrCat("pipeline send: ", s.message()));
    }
  }
  run.wait_time += absl::Now() - wait_start;
  stats_ = {.step_time = absl::Now() - start,
            .wait_time = run.wait_time,
            .peak_in_flight = run.peak_in_flight};
  EMBER_RETURN_IF_ERROR(status);
  if (backward && options_.scale_grads && m > 1) {
    for (const auto& st : stages_) {
      for (const Tensor& p : st->submod()->parameters()) {
        Tensor g = p.grad();
        if (g.defined()) p.set_grad(g / static_cast<double>(m));
      }
    }
  }
  if (!has_last) return Tensor();
  if (losses != nullptr) {
    losses->clear();
    if (backward) {
      for (const Tensor& l : run.losses) losses->push_back(l.detach());
    }
  }
  return cat(run.outputs_of_last, 0);
}

// --- The schedules' orders -------------------------------------------------------

absl::StatusOr<std::unique_ptr<ScheduleGPipe>> ScheduleGPipe::create(
    std::shared_ptr<PipelineStage> stage, int n_microbatches, ScheduleOptions options) {
  std::unique_ptr<ScheduleGPipe> schedule(new ScheduleGPipe());
  EMBER_RETURN_IF_ERROR(
      schedule->Init({stage}, n_microbatches, std::move(options), "ScheduleGPipe"));
  if (stage->num_stages() != stage->group()->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ScheduleGPipe runs one stage per rank: num_stages (", stage->num_stages(),
                     ") must equal the group size (", stage->group()->size(),
                     "); use ScheduleInterleaved1F1B for several stages per rank"));
  }
  const int s = stage->stage_index();
  for (int mb = 0; mb < n_microbatches; ++mb) schedule->actions_.push_back({s, kF, mb});
  if (schedule->options_.loss_fn) {
    for (int mb = 0; mb < n_microbatches; ++mb) schedule->actions_.push_back({s, kB, mb});
  }
  return schedule;
}

absl::StatusOr<std::unique_ptr<Schedule1F1B>> Schedule1F1B::create(
    std::shared_ptr<PipelineStage> stage, int n_microbatches, ScheduleOptions options) {
  std::unique_ptr<Schedule1F1B> schedule(new Schedule1F1B());
  EMBER_RETURN_IF_ERROR(
      schedule->Init({stage}, n_microbatches, std::move(options), "Schedule1F1B"));
  const int num_stages = stage->num_stages();
  if (num_stages != stage->group()->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Schedule1F1B runs one stage per rank: num_stages (", num_stages,
                     ") must equal the group size (", stage->group()->size(),
                     "); use ScheduleInterleaved1F1B for several stages per rank"));
  }
  if (n_microbatches < num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Number of microbatches (", n_microbatches,
        ") must be greater than or equal to the number of stages (", num_stages, ")."));
  }
  const int s = stage->stage_index();
  auto& actions = schedule->actions_;
  if (!schedule->options_.loss_fn) {
    for (int mb = 0; mb < n_microbatches; ++mb) actions.push_back({s, kF, mb});
    return schedule;
  }
  // torch: the last stage warms up with one forward, stage s with
  // num_stages - s; then backward and forward in turn; then the rest.
  const int warmup = std::min(n_microbatches, num_stages - s);
  int f = 0, b = 0;
  while (f < warmup) actions.push_back({s, kF, f++});
  while (true) {
    actions.push_back({s, kB, b++});
    if (f == n_microbatches) break;
    actions.push_back({s, kF, f++});
  }
  while (b < n_microbatches) actions.push_back({s, kB, b++});
  return schedule;
}

// The checks the interleaved schedules share (placement, torch's rounds);
// sets world, rank, n_local and per_round.
absl::Status CheckInterleaved(const std::vector<std::shared_ptr<PipelineStage>>& local, int m,
                              const char* name, const char* rule, int& world, int& rank,
                              int& n_local, int& per_round) {
  world = local.front()->group()->size();
  rank = local.front()->group()->rank();
  n_local = static_cast<int>(local.size());
  const int num_stages = local.front()->num_stages();
  if (num_stages != n_local * world) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_stages (", num_stages, ") must be the group size (", world,
                     ") times the stages on each rank (", n_local, " here)"));
  }
  for (int k = 0; k < n_local; ++k) {
    if (local[k]->stage_index() != rank + k * world) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": rank ", rank, " must hold stages ", rank, ", ", rank + world,
          ", ... (looped placement) but its stage ", k, " is ", local[k]->stage_index()));
    }
  }
  const int rounds = std::max(1, m / world);
  per_round = m / rounds;
  if (m % rounds != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        rule, " requires the number of microbatches to be a multiple of the number of rounds (",
        rounds, "), but got ", m, "."));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ScheduleInterleaved1F1B>> ScheduleInterleaved1F1B::create(
    std::vector<std::shared_ptr<PipelineStage>> stages, int n_microbatches,
    ScheduleOptions options) {
  std::unique_ptr<ScheduleInterleaved1F1B> schedule(new ScheduleInterleaved1F1B());
  EMBER_RETURN_IF_ERROR(schedule->Init(std::move(stages), n_microbatches, std::move(options),
                                       "ScheduleInterleaved1F1B"));
  int world = 1, rank = 0, n_local = 1, per_round = 1;
  EMBER_RETURN_IF_ERROR(CheckInterleaved(schedule->stages_, n_microbatches,
                                         "ScheduleInterleaved1F1B", "Interleaved 1F1B", world, rank,
                                         n_local, per_round));
  const int m = n_microbatches;
  auto& actions = schedule->actions_;
  if (!schedule->options_.loss_fn) {
    // Forwards only: each local stage in turn over a round of microbatches.
    std::vector<int> next(n_local, 0);
    for (int op = 0; op < n_local * m; ++op) {
      const int k = (op / per_round) % n_local;
      actions.push_back({k * world + rank, kF, next[k]++});
    }
    return schedule;
  }
  // torch's _get_warmup_ops and _get_1f1b_rank_ops (without the no-op
  // slots, which only align its timeline).
  const int warmup = std::min((n_local - 1) * per_round + 2 * (world - 1 - rank), m * n_local);
  const int total = n_local * m;
  const int fwd_bwd = total - warmup;
  auto fwd_stage = [&](int op) { return ((op / per_round) % n_local) * world + rank; };
  auto bwd_stage = [&](int op) {
    return (n_local - 1 - ((op - warmup) / per_round) % n_local) * world + rank;
  };
  std::map<int, int> fwd_mb, bwd_mb;
  for (int op = 0; op < warmup + fwd_bwd + warmup; ++op) {
    if (op < warmup) {
      const int st = fwd_stage(op);
      actions.push_back({st, kF, fwd_mb[st]++});
    } else if (op < warmup + fwd_bwd) {
      const int fs = fwd_stage(op);
      actions.push_back({fs, kF, fwd_mb[fs]++});
      const int bs = bwd_stage(op);
      actions.push_back({bs, kB, bwd_mb[bs]++});
    } else {
      const int bs = bwd_stage(op);
      actions.push_back({bs, kB, bwd_mb[bs]++});
    }
  }
  return schedule;
}

absl::StatusOr<std::unique_ptr<ScheduleInterleavedZeroBubble>>
ScheduleInterleavedZeroBubble::create(std::vector<std::shared_ptr<PipelineStage>> stages,
                                      int n_microbatches, ScheduleOptions options) {
  std::unique_ptr<ScheduleInterleavedZeroBubble> schedule(new ScheduleInterleavedZeroBubble());
  EMBER_RETURN_IF_ERROR(schedule->Init(std::move(stages), n_microbatches, std::move(options),
                                       "ScheduleInterleavedZeroBubble"));
  int world = 1, rank = 0, n_local = 1, per_round = 1;
  EMBER_RETURN_IF_ERROR(CheckInterleaved(schedule->stages_, n_microbatches,
                                         "ScheduleInterleavedZeroBubble", "Zero bubble", world,
                                         rank, n_local, per_round));
  const int m = n_microbatches;
  auto& actions = schedule->actions_;
  if (!schedule->options_.loss_fn) {
    std::vector<int> next(n_local, 0);
    for (int op = 0; op < n_local * m; ++op) {
      const int k = (op / per_round) % n_local;
      actions.push_back({k * world + rank, kF, next[k]++});
    }
    return schedule;
  }
  // torch's _get_1f1b_rank_ops with enable_zero_bubble: warmup of one
  // forward per hop from the last rank; in the steady phase each F is
  // followed by an I and, once `rank` of them have run, by the W of the
  // oldest I still without one; the remaining Ws at the end. torch's
  // _add_bubbles_to_actions only inserts no-op slots, which change no
  // rank's order.
  const int warmup = std::min((n_local - 1) * per_round + (world - 1 - rank), m * n_local);
  const int total = n_local * m;
  const int fwd_bwd = total - warmup;
  auto fwd_stage = [&](int op) { return ((op / per_round) % n_local) * world + rank; };
  auto bwd_stage = [&](int op) {
    return (n_local - 1 - ((op - warmup) / per_round) % n_local) * world + rank;
  };
  std::map<int, int> fwd_mb, bwd_mb, weight_mb;
  std::vector<int> backward_ops;
  size_t weights_done = 0;
  auto next_weight = [&] {
    const int ws = bwd_stage(backward_ops[weights_done++]);
    actions.push_back({ws, kW, weight_mb[ws]++});
  };
  for (int op = 0; op < warmup + fwd_bwd + warmup; ++op) {
    if (op < warmup) {
      const int st = fwd_stage(op);
      actions.push_back({st, kF, fwd_mb[st]++});
      continue;
    }
    if (op < warmup + fwd_bwd) {
      const int fs = fwd_stage(op);
      actions.push_back({fs, kF, fwd_mb[fs]++});
    }
    const int bs = bwd_stage(op);
    actions.push_back({bs, kI, bwd_mb[bs]++});
    backward_ops.push_back(op);
    if (op - warmup >= rank) next_weight();
  }
  while (weights_done < backward_ops.size()) next_weight();
  return schedule;
}

}  // namespace ember::parallel
