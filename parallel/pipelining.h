// Pipeline parallelism (torch.distributed.pipelining): a model cut into
// consecutive stages, one process group rank running each stage (or, for the
// interleaved schedule, several), with the batch split into microbatches
// whose activations flow forward and whose gradients flow backward between
// the ranks by point-to-point ops.
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "nn/optim/sgd.h"
//   #include "parallel/pipelining.h"
//   #include "tensor/factories.h"
//   // Every process, started by `launch --nproc_per_node=2 prog`:
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "gloo"}));
//   const int rank = ember::distributed::get_rank();
//   auto part = std::make_shared<ember::nn::Sequential>();  // this rank's half
//   part->push_back(std::make_shared<ember::nn::Linear>(16, 16));
//   part->push_back(std::make_shared<ember::nn::ReLU>());
//   EMBER_ASSIGN_OR_RETURN(auto stage,
//                          ember::parallel::PipelineStage::create(part, rank, /*num_stages=*/2));
//   EMBER_ASSIGN_OR_RETURN(
//       auto schedule,
//       ember::parallel::Schedule1F1B::create(
//           stage, /*n_microbatches=*/4,
//           {.loss_fn = [](const ember::Tensor& out, const ember::Tensor& y) {
//             return ember::nn::functional::mse_loss(out, y);
//           }}));
//   ember::nn::optim::SGD opt(part->parameters(), {.lr = 0.1});
//   ember::Tensor x = ember::randn({32, 16}), y = ember::randn({32, 16});
//   opt.zero_grad();
//   std::vector<ember::Tensor> losses;  // one per microbatch, on the last stage
//   if (rank == 0) {
//     EMBER_RETURN_IF_ERROR(schedule->step(x).status());
//   } else {
//     EMBER_ASSIGN_OR_RETURN(ember::Tensor out, schedule->step({}, y, &losses));
//   }
//   opt.step();
//   ```
//
// What it does, as torch's (Note [Pipeline schedules] in pipelining.cc):
//
// - A PipelineStage owns one stage's module. Stage i runs on group rank
//   i % group size (torch's looped placement), so with one stage per rank
//   stage i is rank i; with two per rank on two ranks, rank 0 holds stages 0
//   and 2 and rank 1 stages 1 and 3.
// - step(input, target, losses) splits the input (first stage) and the
//   target (last stage) along dim 0 as torch.tensor_split does: a batch of n
//   rows in m microbatches gives the first n % m microbatches n / m + 1 rows
//   and the others n / m. The last stage applies loss_fn to each
//   microbatch's output and its target and appends the losses, in
//   microbatch order, to *losses; each microbatch's backward starts from its
//   own loss as loss_fn returned it, so parameter gradients accumulate the
//   sum over microbatches; with scale_grads (the default, as torch) every
//   gradient is divided by the number of microbatches at the end of the
//   step, which for a mean-reduced loss over even microbatches is the
//   gradient of the whole batch's mean loss. Without loss_fn a step runs
//   forwards only.
// - Activations are sent with a small header (dtype and shape) first, so a
//   stage learns its input's shape from the previous stage on every
//   microbatch (the uneven last microbatches included); input_shape and
//   input_dtype, when given, are checked against it. Gradients come back in
//   the shape of the stage's own output.
// - Sends that a schedule issues just before a receive go out in one
//   ProcessGroup::batch_p2p with that receive (torch's fused
//   batch_isend_irecv, which nccl groups), each direction of each stage
//   boundary on its own tag.
// - step() returns the last stage's outputs concatenated along dim 0 (torch's
//   merged output) on the rank holding the last stage and an undefined
//   tensor elsewhere. Gradients are not zeroed: call zero_grad().
//
// Schedules (torch's names): ScheduleGPipe (all forwards, then all
// backwards), Schedule1F1B (stage s runs num_stages - s warmup forwards, then
// one backward and one forward in turn, then the remaining backwards; needs
// n_microbatches >= num_stages, as torch), ScheduleInterleaved1F1B (several
// stages per rank, torch's depth-first order of warmup, 1F1B and cooldown
// over the local stages; n_microbatches must be a multiple of
// max(1, n_microbatches / group size) as torch requires),
// ScheduleInterleavedZeroBubble (the same placement, each backward split
// into the input's gradient, sent on at once, and the weights' gradient,
// run later in torch's ZB1P order).
//
// Errors: create() returns kInvalidArgument naming the value for a null
// module, a stage index outside [0, num_stages), a stage placed on the
// wrong rank, n_microbatches < 1, 1F1B's n_microbatches < num_stages, a
// single-stage schedule whose num_stages is not the group size, stages of
// different groups, an interleaved rank's stages not r, r + world, ..., or
// n_microbatches not in whole rounds; kFailedPrecondition without a group
// and without a default one. step() returns kInvalidArgument for a
// missing input on the first stage or target on the last, a batch with
// fewer rows than microbatches ("... is smaller than n_microbatches"), an
// input whose dtype or shape differs from the declared one, and the
// module's or loss's own error (named by stage and microbatch); the group's
// error when a send or receive fails. Every receive waits at most the
// group's timeout, so a rank whose peer failed or runs a different schedule
// fails with kDeadlineExceeded instead of hanging.
//
// Thread-safety: thread-compatible. step() is collective over the ranks of
// the pipeline: every rank calls it once per step with the same
// n_microbatches.
#ifndef EMBER_PARALLEL_PIPELINING_H_
#define EMBER_PARALLEL_PIPELINING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::parallel {

struct PipelineStageOptions {
  // The pipeline's group; the default group when null.
  std::shared_ptr<distributed::ProcessGroup> group;
  // This stage's forward input per microbatch, checked on every arrival; -1
  // in a dimension accepts any size (dim 0 is the microbatch's rows).
  // Inferred from what the previous stage sends when unset.
  std::optional<std::vector<int64_t>> input_shape;
  std::optional<Dtype> input_dtype;
};

class PipelineStage {
 public:
  static absl::StatusOr<std::shared_ptr<PipelineStage>> create(
      std::shared_ptr<nn::Module> submodule, int stage_index, int num_stages,
      PipelineStageOptions options = {});

  int stage_index() const { return stage_index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return stage_index_ == 0; }
  bool is_last() const { return stage_index_ == num_stages_ - 1; }
  const std::shared_ptr<nn::Module>& submod() const { return submod_; }
  const std::shared_ptr<distributed::ProcessGroup>& group() const { return group_; }
  // The group rank that runs stage `s`: s % group size.
  int stage_rank(int s) const { return s % group_->size(); }

 private:
  friend class PipelineSchedule;
  PipelineStage() = default;

  std::shared_ptr<nn::Module> submod_;
  int stage_index_ = 0;
  int num_stages_ = 1;
  std::shared_ptr<distributed::ProcessGroup> group_;
  PipelineStageOptions options_;
  Device device_ = kCPU;
};

// The loss of one microbatch: the last stage's output and its target.
using PipelineLossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

struct ScheduleOptions {
  // Applied on the last stage; null: forwards only.
  PipelineLossFn loss_fn;
  // Divide every gradient by n_microbatches at the end of step() (torch's
  // scale_grads): right for a mean-reduced loss; turn off for a summed one.
  bool scale_grads = true;
};

// What the last step() did on this rank, for benchmarks.
struct PipelineStepStats {
  absl::Duration step_time;  // the whole step() on this rank
  absl::Duration wait_time;  // blocked in receives and the final send waits
  // The most microbatches whose forward had run but not yet their backward
  // (activations held), over this rank's stages together.
  int peak_in_flight = 0;
};

// One step of a pipeline over this rank's stages. The schedules below build
// it; step() is the same for all.
class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;
  PipelineSchedule(const PipelineSchedule&) = delete;
  PipelineSchedule& operator=(const PipelineSchedule&) = delete;

  // input: the whole batch, on the rank holding stage 0 (ignored elsewhere);
  // target and losses: on the rank holding the last stage. Returns the
  // last stage's merged output there, an undefined tensor elsewhere. Blocks
  // until this rank's part of the step is done, every receive and send
  // bounded by the group's timeout.
  absl::StatusOr<Tensor> step(const Tensor& input = Tensor(), const Tensor& target = Tensor(),
                              std::vector<Tensor>* losses = nullptr);

  int n_microbatches() const { return n_microbatches_; }
  const PipelineStepStats& last_step_stats() const { return stats_; }

  // One unit of this rank's work on one microbatch of one stage (torch's
  // _Action): F forward, B full backward, I backward to the input only, W
  // backward to the weights only (the zero-bubble schedule's split of B).
  enum class Computation { kForward, kBackward, kBackwardInput, kBackwardWeight };
  struct Action {
    int stage = 0;
    Computation computation = Computation::kForward;
    int microbatch = 0;
  };
  // "2F0", "3W1": stage, torch's letter, microbatch.
  static std::string ActionName(const Action& action);
  // This rank's order of work in a step.
  const std::vector<Action>& actions() const { return actions_; }

 protected:
  PipelineSchedule() = default;
  // Checks the stages and options shared by every schedule; sets the members.
  absl::Status Init(std::vector<std::shared_ptr<PipelineStage>> stages, int n_microbatches,
                    ScheduleOptions options, const char* name);

  std::vector<std::shared_ptr<PipelineStage>> stages_;  // ascending stage index
  int n_microbatches_ = 1;
  ScheduleOptions options_;
  std::vector<Action> actions_;

 private:
  struct Run;
  PipelineStepStats stats_;
};

class ScheduleGPipe : public PipelineSchedule {
 public:
  static absl::StatusOr<std::unique_ptr<ScheduleGPipe>> create(std::shared_ptr<PipelineStage> stage,
                                                               int n_microbatches,
                                                               ScheduleOptions options = {});

 private:
  ScheduleGPipe() = default;
};

class Schedule1F1B : public PipelineSchedule {
 public:
  static absl::StatusOr<std::unique_ptr<Schedule1F1B>> create(std::shared_ptr<PipelineStage> stage,
                                                              int n_microbatches,
                                                              ScheduleOptions options = {});

 private:
  Schedule1F1B() = default;
};

class ScheduleInterleaved1F1B : public PipelineSchedule {
 public:
  // `stages`: this rank's stages (rank r holds r, r + world, r + 2 world...).
  static absl::StatusOr<std::unique_ptr<ScheduleInterleaved1F1B>> create(
      std::vector<std::shared_ptr<PipelineStage>> stages, int n_microbatches,
      ScheduleOptions options = {});

 private:
  ScheduleInterleaved1F1B() = default;
};

// Interleaved zero bubble (torch's ScheduleInterleavedZeroBubble, the ZB1P
// schedule): the interleaved order with each backward split in two, the
// gradient of the stage's input first (I, sent on at once) and of its
// weights later (W), which fills what would be the pipeline's bubble.
// torch's warmup (one forward per hop from the last rank) and its rule on
// whole rounds of microbatches.
class ScheduleInterleavedZeroBubble : public PipelineSchedule {
 public:
  static absl::StatusOr<std::unique_ptr<ScheduleInterleavedZeroBubble>> create(
      std::vector<std::shared_ptr<PipelineStage>> stages, int n_microbatches,
      ScheduleOptions options = {});

 private:
  ScheduleInterleavedZeroBubble() = default;
};

// The rows of each microbatch when `rows` split into `chunks` as
// torch.tensor_split does (the first rows % chunks get one more).
std::vector<int64_t> MicrobatchSizes(int64_t rows, int chunks);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_PIPELINING_H_
