// A GPT (nn/models/gpt.h) trained with FSDP x TP under the launch utility,
// then a distributed checkpoint that resumes in another layout. The
// processes form a ("dp", "tp") DeviceMesh of world/tp x tp: tensor
// parallelism (parallel/tensor_parallel.h) splits every block's heads and
// MLP, the token embedding and the vocabulary head over "tp"; fully_shard
// (parallel/fully_sharded_data_parallel.h) shards what each tp rank holds
// over "dp", each block a unit; each dp coordinate trains its own batches.
// The checkpoint holds every parameter and AdamW's state under the whole
// model's names and shapes (each rank writes its flat ranges of its TP
// boxes), so it loads into any layout: FSDP x TP at another size, TP alone,
// FSDP alone, or one process.
//
//   bazel build //tools/launch //examples:gpt_fsdp_tp
//   gpt="bazel-bin/examples/gpt_fsdp_tp --checkpoint_dir=/tmp/gpt_ckpt"
//   bazel-bin/tools/launch/launch --nproc_per_node=4 $gpt --tp=2 --steps=200   # FSDP 2 x TP 2
//   bazel-bin/tools/launch/launch --nproc_per_node=2 $gpt --tp=2 --resume       # TP 2
//   bazel-bin/tools/launch/launch --nproc_per_node=1 $gpt --tp=1 --resume       # one process
//
// The task: sequences of 16 tokens over a vocabulary of 64 in which every
// token after the second is perm[t[i-2]] for a fixed random permutation, so
// attention must look two positions back; the first two are random (the
// loss cannot go below ln(64) / 16 = 0.26 on average). Rank 0
// prints the loss, the held-out loss and where it saved or resumed.
// Options: --tp=N (2; must divide the number of processes), --steps=N (200),
// --batch=N (sequences per dp rank, 16), --checkpoint_dir=PATH (gpt_ckpt),
// --resume. Exits non-zero, with the error, when anything fails.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "autograd/grad_mode.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/device_mesh.h"
#include "distributed/distributed.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/optim/adam.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/state_dict.h"
#include "parallel/tensor_parallel.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace dist = ember::distributed;
namespace dcp = ember::distributed::checkpoint;
namespace par = ember::parallel;
using ember::Tensor;

namespace {

constexpr int64_t kVocab = 64;
constexpr int64_t kTokens = 16;
const ember::nn::models::GPTConfig kConfig{.vocab_size = kVocab,
                                           .block_size = kTokens,
                                           .n_embd = 64,
                                           .head_dim = 16,
                                           .hidden = 128,
                                           .n_layer = 2};

struct Options {
  int tp = 2;
  int steps = 200;
  int64_t batch = 16;
  std::string checkpoint_dir = "gpt_ckpt";
  bool resume = false;
};

absl::Status PositiveFlag(absl::string_view name, absl::string_view value, int64_t* out) {
  if (!absl::SimpleAtoi(value, out) || *out < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a positive integer, got '", value, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    absl::string_view rest = arg;
    int64_t value = 0;
    if (absl::ConsumePrefix(&rest, "--tp=")) {
      EMBER_RETURN_IF_ERROR(PositiveFlag("tp", rest, &value));
      options.tp = static_cast<int>(value);
    } else if (absl::ConsumePrefix(&rest, "--steps=")) {
      EMBER_RETURN_IF_ERROR(PositiveFlag("steps", rest, &value));
      options.steps = static_cast<int>(value);
    } else if (absl::ConsumePrefix(&rest, "--batch=")) {
      EMBER_RETURN_IF_ERROR(PositiveFlag("batch", rest, &options.batch));
    } else if (absl::ConsumePrefix(&rest, "--checkpoint_dir=")) {
      options.checkpoint_dir = std::string(rest);
    } else if (arg == "--resume") {
      options.resume = true;
    } else if (!absl::StartsWith(arg, "--local_rank=")) {  // added by launch
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown argument '", arg,
          "'; expected --tp=N, --steps=N, --batch=N, --checkpoint_dir=PATH or --resume"));
    }
  }
  return options;
}

// The task's sequences: [n, kTokens + 1] (inputs and next tokens).
struct Task {
  Tensor perm;
  Task() {
    ember::Generator gen(1234);
    perm = ember::randperm(kVocab, {}, &gen);
  }
  Tensor Sample(int64_t n, ember::Generator& gen) const {
    Tensor text = ember::randint(0, kVocab, {n, kTokens + 1}, {}, &gen);
    const int64_t* p = perm.data_ptr<int64_t>();
    int64_t* t = text.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) {
      int64_t* row = t + r * (kTokens + 1);
      for (int64_t i = 2; i <= kTokens; ++i) row[i] = p[row[i - 2]];
    }
    return text;
  }
};

Tensor Loss(ember::nn::Module& model, const Tensor& text) {
  Tensor logits = model(text.narrow(1, 0, kTokens));
  return ember::nn::functional::cross_entropy(logits.reshape({-1, kVocab}),
                                              text.narrow(1, 1, kTokens).reshape({-1}));
}

// The same held-out batch on every rank (the forward is collective).
double HeldOutLoss(const Task& task, ember::nn::Module& model) {
  ember::Generator held_out(7);
  const Tensor text = task.Sample(256, held_out);
  ember::autograd::NoGradGuard no_grad;
  return Loss(model, text).item<double>();
}

// The plan: each block's q, k, v and fc1 by columns, o and fc2 by rows; the
// token embedding by rows (lookups summed); the head by columns, its logits
// gathered.
par::ParallelizePlan Plan() {
  par::ParallelizePlan plan = {{"0.wte", par::RowwiseParallel{.input_layouts = par::Replicate()}}};
  for (int64_t i = 1; i <= kConfig.n_layer; ++i) {
    for (const char* colwise : {"attn.q", "attn.k", "attn.v", "fc1"}) {
      plan.push_back({absl::StrCat(i, ".", colwise), par::ColwiseParallel{}});
    }
    for (const char* rowwise : {"attn.o", "fc2"}) {
      plan.push_back({absl::StrCat(i, ".", rowwise), par::RowwiseParallel{}});
    }
  }
  plan.push_back({absl::StrCat(kConfig.n_layer + 2),
                  par::ColwiseParallel{.output_layouts = par::Replicate()}});
  return plan;
}

absl::Status Train(const Options& options) {
  EMBER_RETURN_IF_ERROR(dist::init_process_group({.backend = "gloo"}));
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  if (world % options.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp=", options.tp, " does not divide the ",
                                                   world, " processes; pass a divisor"));
  }
  const int dp = world / options.tp;
  EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh mesh,
                         dist::init_device_mesh("cpu", {dp, options.tp}, {"dp", "tp"}));
  EMBER_ASSIGN_OR_RETURN(int dp_rank, mesh.get_local_rank("dp"));

  ember::manual_seed(0);  // the same whole model on every rank before sharding
  std::shared_ptr<ember::nn::Module> model = ember::nn::models::make_gpt(kConfig);
  par::ParameterShards shards;
  if (options.tp > 1) {
    EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh tp_mesh, mesh["tp"]);
    EMBER_ASSIGN_OR_RETURN(shards, par::parameter_shards(model, tp_mesh, Plan()));
    EMBER_ASSIGN_OR_RETURN(model, par::parallelize_module(model, tp_mesh, Plan()));
  }
  std::shared_ptr<par::FullyShardedDataParallel> fsdp;
  if (dp > 1) {
    EMBER_ASSIGN_OR_RETURN(dist::Group dp_group, mesh.get_group("dp"));
    std::vector<std::shared_ptr<ember::nn::Module>> blocks;
    for (int64_t i = 1; i <= kConfig.n_layer; ++i) blocks.push_back(model->child(absl::StrCat(i)));
    EMBER_ASSIGN_OR_RETURN(fsdp, par::fully_shard(model, {.process_group = dp_group,
                                                          .units = blocks}));
    model = fsdp;
  }
  ember::nn::optim::AdamW optimizer(model->parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  // This rank's part of every parameter and of AdamW's state, under the
  // whole model's names, plus the step counter (parallel/state_dict.h).
  absl::StatusOr<par::ModelStateDict> state =
      fsdp != nullptr ? par::get_state_dict(*fsdp, &optimizer, shards)
                      : par::get_state_dict(*model, &optimizer, shards);
  EMBER_RETURN_IF_ERROR(state.status());
  Tensor step_counter = ember::zeros({1}, ember::TensorOptions().dtype(ember::kInt64));
  state->model.emplace_back("train.step", dcp::replicated(step_counter));

  const std::string layout = absl::StrCat("dp ", dp, " x tp ", options.tp);
  const Task task;
  int first_step = 1;
  if (options.resume) {
    EMBER_RETURN_IF_ERROR(
        par::load_state_dict(*state, &optimizer, {.path = options.checkpoint_dir}));
    first_step = static_cast<int>(step_counter.data_ptr<int64_t>()[0]) + 1;
    const double loss = HeldOutLoss(task, *model);
    if (rank == 0) {
      std::printf("resumed from %s at step %d on %s; held-out loss %.4f\n",
                  options.checkpoint_dir.c_str(), first_step - 1, layout.c_str(), loss);
    }
  }
  ember::Generator gen(1000 * first_step + dp_rank);  // tp ranks of one dp coordinate alike
  double window = 0;
  int window_steps = 0;
  const int last_step = first_step + options.steps - 1;
  for (int step = first_step; step <= last_step; ++step) {
    optimizer.zero_grad();
    Tensor loss = Loss(*model, task.Sample(options.batch, gen));
    loss.backward();
    optimizer.step();
    window += loss.item<double>();
    ++window_steps;
    if ((step % 50 == 0 || step == last_step) && rank == 0) {
      std::printf("step %d  loss %.4f  (%s)\n", step, window / window_steps, layout.c_str());
      std::fflush(stdout);
      window = 0;
      window_steps = 0;
    }
  }
  const double held_out = HeldOutLoss(task, *model);
  if (rank == 0) std::printf("held-out loss: %.4f\n", held_out);

  step_counter.data_ptr<int64_t>()[0] = last_step;
  EMBER_ASSIGN_OR_RETURN(dist::Group group, dist::get_default_group());
  EMBER_RETURN_IF_ERROR(par::save_state_dict(
      *state, &optimizer, {.path = options.checkpoint_dir, .process_group = group}));
  if (rank == 0) {
    std::printf("saved a distributed checkpoint of step %d from %s to %s\n", last_step,
                layout.c_str(), options.checkpoint_dir.c_str());
  }
  return dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseArgs(argc, argv);
  absl::Status status = options.status();
  if (status.ok()) {
    try {
      status = Train(*options);
    } catch (const ember::Error& e) {
      status = absl::InternalError(e.what());
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "gpt_fsdp_tp: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
