#include "parallel/gpt_parallel_testing.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "distributed/device_mesh.h"
#include "distributed/distributed.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/optim/sgd.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/pipelining.h"
#include "parallel/state_dict.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel::testing {
namespace {

namespace dist = ::ember::distributed;

constexpr int kMicrobatches = 4;

nn::optim::SGDOptions Sgd(const GptConfig& config) {
  return {.lr = config.lr, .momentum = config.momentum};
}

// The whole model holding `init`.
absl::StatusOr<std::shared_ptr<nn::Sequential>> GptFrom(const GptConfig& config,
                                                        const StateDict& init) {
  auto gpt = MakeGpt(config);
  EMBER_RETURN_IF_ERROR(gpt->load_state_dict(init));
  return gpt;
}

// The children [first, last) of the whole model, for one pipeline stage.
std::shared_ptr<nn::Sequential> Part(const nn::Sequential& gpt, int first, int last) {
  auto part = std::make_shared<nn::Sequential>();
  for (int i = first; i < last; ++i) part->push_back(gpt[i]);
  return part;
}

// The parameters of whole-model children [first, last), named as in the
// whole model.
void AddChildren(const nn::Sequential& gpt, int first, int last,
                 std::vector<LocalParameter>* out) {
  for (int i = first; i < last; ++i) {
    for (const auto& [name, p] : gpt[i]->named_parameters()) {
      out->push_back({.name = absl::StrCat(i, ".", name), .value = p.detach().clone()});
    }
  }
}

// Each parameter of a tensor-parallel model (or its FSDP full state) as
// this rank's part along GptShardDim.
std::vector<LocalParameter> TpParameters(const GptConfig& config,
                                         const std::vector<std::pair<std::string, Tensor>>& named,
                                         int tp_rank, int tp_size) {
  std::vector<LocalParameter> out;
  for (const auto& [name, p] : named) {
    const int64_t dim = GptShardDim(config, name);
    out.push_back({.name = name,
                   .value = p.detach().clone(),
                   .dim = dim,
                   .index = dim < 0 ? 0 : tp_rank,
                   .count = dim < 0 ? 1 : tp_size});
  }
  return out;
}

// One rank's model in a layout whose ranks each run the whole forward
// ("alone", "tp", "fsdp_tp"), with its optimizer.
struct Replica {
  std::shared_ptr<nn::Module> model;                // what forward runs
  std::shared_ptr<FullyShardedDataParallel> fsdp;   // fsdp_tp: `model` itself
  ParameterShards shards;                           // tp, fsdp_tp
  std::unique_ptr<nn::optim::SGD> opt;
  int64_t row_part = 0;   // this rank trains part row_part of row_parts of each batch
  int64_t row_parts = 1;
  int tp_rank = 0;
  int tp_size = 1;
};

absl::StatusOr<Replica> MakeReplica(const std::string& layout, const GptConfig& config,
                                    const StateDict& init) {
  EMBER_ASSIGN_OR_RETURN(auto gpt, GptFrom(config, init));
  Replica r;
  if (layout == "alone") {
    r.model = gpt;
  } else if (layout == "tp") {
    EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh mesh, dist::init_device_mesh("cpu", {2}, {"tp"}));
    EMBER_ASSIGN_OR_RETURN(r.model, parallelize_module(gpt, mesh, GptTpPlan(config)));
    EMBER_ASSIGN_OR_RETURN(r.shards, parameter_shards(gpt, mesh, GptTpPlan(config)));
    EMBER_ASSIGN_OR_RETURN(r.tp_rank, mesh.get_local_rank("tp"));
    r.tp_size = 2;
  } else {
    EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh mesh,
                           dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
    EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh tp_mesh, mesh["tp"]);
    EMBER_ASSIGN_OR_RETURN(dist::Group dp_group, mesh.get_group("dp"));
    EMBER_ASSIGN_OR_RETURN(int dp_rank, mesh.get_local_rank("dp"));
    EMBER_ASSIGN_OR_RETURN(r.tp_rank, mesh.get_local_rank("tp"));
    r.tp_size = 2;
    r.row_part = dp_rank;
    r.row_parts = 2;
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> tp,
                           parallelize_module(gpt, tp_mesh, GptTpPlan(config)));
    EMBER_ASSIGN_OR_RETURN(r.shards, parameter_shards(gpt, tp_mesh, GptTpPlan(config)));
    std::vector<std::shared_ptr<nn::Module>> blocks;
    for (int i = 1; i <= config.layers; ++i) blocks.push_back(tp->child(absl::StrCat(i)));
    EMBER_ASSIGN_OR_RETURN(r.fsdp, fully_shard(tp, {.process_group = dp_group,
                                                    .units = blocks,
                                                    .sync_module_states = false}));
    r.model = r.fsdp;
  }
  r.opt = std::make_unique<nn::optim::SGD>(r.model->parameters(), Sgd(config));
  return r;
}

void Train(Replica& r, const Tensor& tokens, const Tensor& targets) {
  const int64_t rows = tokens.size(1) / r.row_parts;
  for (int64_t s = 0; s < tokens.size(0); ++s) {
    r.opt->zero_grad();
    Tensor x = tokens.select(0, s).narrow(0, r.row_part * rows, rows);
    Tensor y = targets.select(0, s).narrow(0, r.row_part * rows, rows);
    GptLoss((*r.model)(x), y).backward();
    r.opt->step();
  }
}

absl::StatusOr<ModelStateDict> CheckpointState(Replica& r) {
  if (r.fsdp != nullptr) return get_state_dict(*r.fsdp, r.opt.get(), r.shards);
  return get_state_dict(*r.model, r.opt.get(), r.shards);
}

absl::StatusOr<std::vector<LocalParameter>> Parameters(const GptConfig& config, Replica& r) {
  if (r.fsdp != nullptr) {
    EMBER_ASSIGN_OR_RETURN(StateDict full, r.fsdp->full_state_dict());
    return TpParameters(config, full, r.tp_rank, r.tp_size);
  }
  if (r.tp_size == 1) {
    std::vector<LocalParameter> out;
    for (const auto& [name, p] : r.model->named_parameters()) {
      out.push_back({.name = name, .value = p.detach().clone()});
    }
    return out;
  }
  return TpParameters(config, r.model->named_parameters(), r.tp_rank, r.tp_size);
}

absl::Status CheckLayout(const std::string& layout, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), layout) == allowed.end()) {
    return absl::InvalidArgumentError(absl::StrCat("no layout \"", layout, "\" here"));
  }
  const int world = dist::is_initialized() ? dist::get_world_size() : 1;
  if (world != GptLayoutRanks(layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat(layout, " runs on ", GptLayoutRanks(layout), " ranks, not ", world));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LocalParameter>> TrainPp(const std::string& layout,
                                                    const GptConfig& config,
                                                    const StateDict& init, const Tensor& tokens,
                                                    const Tensor& targets) {
  EMBER_ASSIGN_OR_RETURN(auto gpt, GptFrom(config, init));
  const int rank = dist::get_rank();
  const int children = static_cast<int>(gpt->size());  // embeddings, blocks, norm, head
  // Stage s holds whole-model children [bounds[s], bounds[s + 1]).
  std::vector<int> bounds;
  const bool interleaved = layout == "pp_interleaved" || layout == "pp_zero_bubble";
  if (interleaved) {
    for (int i = 0; i <= config.layers + 1; ++i) bounds.push_back(i);  // one child each
    bounds.push_back(children);
  } else {
    bounds = {0, 2, children};
  }
  const int num_stages = static_cast<int>(bounds.size()) - 1;
  std::vector<std::shared_ptr<PipelineStage>> stages;
  std::vector<LocalParameter> mine;
  std::vector<Tensor> params;
  for (int s = rank; s < num_stages; s += 2) {
    auto part = Part(*gpt, bounds[s], bounds[s + 1]);
    EMBER_ASSIGN_OR_RETURN(auto stage, PipelineStage::create(part, s, num_stages));
    stages.push_back(stage);
    for (const Tensor& p : part->parameters()) params.push_back(p);
  }
  ScheduleOptions options{.loss_fn = [](const Tensor& out, const Tensor& target) {
    return GptLoss(out, target);
  }};
  std::unique_ptr<PipelineSchedule> schedule;
  if (layout == "pp_gpipe") {
    EMBER_ASSIGN_OR_RETURN(schedule, ScheduleGPipe::create(stages[0], kMicrobatches, options));
  } else if (layout == "pp_1f1b") {
    EMBER_ASSIGN_OR_RETURN(schedule, Schedule1F1B::create(stages[0], kMicrobatches, options));
  } else if (layout == "pp_interleaved") {
    EMBER_ASSIGN_OR_RETURN(schedule,
                           ScheduleInterleaved1F1B::create(stages, kMicrobatches, options));
  } else {
    EMBER_ASSIGN_OR_RETURN(schedule,
                           ScheduleInterleavedZeroBubble::create(stages, kMicrobatches, options));
  }
  const bool first = stages.front()->is_first();
  const bool last = stages.back()->is_last();
  nn::optim::SGD opt(params, Sgd(config));
  for (int64_t s = 0; s < tokens.size(0); ++s) {
    opt.zero_grad();
    EMBER_RETURN_IF_ERROR(schedule
                              ->step(first ? tokens.select(0, s) : Tensor(),
                                     last ? targets.select(0, s) : Tensor())
                              .status());
    opt.step();
  }
  for (int s = rank; s < num_stages; s += 2) AddChildren(*gpt, bounds[s], bounds[s + 1], &mine);
  return mine;
}

}  // namespace

std::shared_ptr<nn::Sequential> MakeGpt(const GptConfig& config) {
  return nn::models::make_gpt({.vocab_size = config.vocab,
                               .block_size = config.seq,
                               .n_embd = config.dim,
                               .head_dim = config.head_dim,
                               .hidden = config.hidden,
                               .n_layer = config.layers,
                               .causal = true});
}

ParallelizePlan GptTpPlan(const GptConfig& config) {
  ParallelizePlan plan = {{"0.wte", RowwiseParallel{.input_layouts = Replicate()}}};
  for (int i = 1; i <= config.layers; ++i) {
    for (const char* colwise : {"attn.q", "attn.k", "attn.v", "fc1"}) {
      plan.push_back({absl::StrCat(i, ".", colwise), ColwiseParallel{}});
    }
    for (const char* rowwise : {"attn.o", "fc2"}) {
      plan.push_back({absl::StrCat(i, ".", rowwise), RowwiseParallel{}});
    }
  }
  plan.push_back({absl::StrCat(config.layers + 2),
                  ColwiseParallel{.output_layouts = Replicate()}});
  return plan;
}

int64_t GptShardDim(const GptConfig& config, const std::string& name) {
  if (name == "0.wte.weight") return 0;
  const std::string head = absl::StrCat(config.layers + 2, ".");
  if (name == head + "weight" || name == head + "bias") return 0;
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  int block = 0;
  if (parts.size() < 3 || !absl::SimpleAtoi(parts[0], &block) || block < 1 ||
      block > config.layers) {
    return -1;
  }
  const std::string module = parts.size() == 4 ? parts[1] + "." + parts[2] : parts[1];
  const std::string& tensor = parts.back();
  if (module == "attn.q" || module == "attn.k" || module == "attn.v" || module == "fc1") {
    return 0;  // colwise: weight and bias rows
  }
  if (module == "attn.o" || module == "fc2") return tensor == "weight" ? 1 : -1;
  return -1;
}

Tensor GptLoss(const Tensor& logits, const Tensor& targets) {
  return nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                       targets.reshape({-1}));
}

const std::vector<std::string>& GptLayouts() {
  static const auto* layouts = new std::vector<std::string>{
      "tp", "pp_gpipe", "pp_1f1b", "pp_interleaved", "pp_zero_bubble", "fsdp_tp"};
  return *layouts;
}


int GptLayoutRanks(const std::string& layout) {
  return layout == "fsdp_tp" ? 4 : layout == "alone" ? 1 : 2;
}

absl::StatusOr<std::vector<LocalParameter>> TrainGpt(const std::string& layout,
                                                     const GptConfig& config,
                                                     const StateDict& init, const Tensor& tokens,
                                                     const Tensor& targets,
                                                     const std::string& save_to) {
  std::vector<std::string> layouts = GptLayouts();
  layouts.push_back("alone");
  EMBER_RETURN_IF_ERROR(CheckLayout(layout, layouts));
  if (absl::StartsWith(layout, "pp_")) {
    if (!save_to.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(layout, " does not save checkpoints here"));
    }
    return TrainPp(layout, config, init, tokens, targets);
  }
  EMBER_ASSIGN_OR_RETURN(Replica r, MakeReplica(layout, config, init));
  Train(r, tokens, targets);
  if (!save_to.empty()) {
    EMBER_ASSIGN_OR_RETURN(ModelStateDict state, CheckpointState(r));
    distributed::checkpoint::CheckpointOptions options{.path = save_to};
    if (dist::is_initialized()) {
      EMBER_ASSIGN_OR_RETURN(options.process_group, dist::get_default_group());
    }
    EMBER_RETURN_IF_ERROR(save_state_dict(state, r.opt.get(), options));
  }
  return Parameters(config, r);
}

absl::StatusOr<std::vector<LocalParameter>> ResumeGpt(const std::string& layout,
                                                      const GptConfig& config,
                                                      const std::string& checkpoint,
                                                      const Tensor& tokens,
                                                      const Tensor& targets) {
  EMBER_RETURN_IF_ERROR(CheckLayout(layout, {"alone", "tp", "fsdp_tp"}));
  manual_seed(999);  // a start unlike the checkpoint's: the load must replace it
  EMBER_ASSIGN_OR_RETURN(Replica r, MakeReplica(layout, config, MakeGpt(config)->state_dict()));
  EMBER_ASSIGN_OR_RETURN(ModelStateDict state, CheckpointState(r));
  EMBER_RETURN_IF_ERROR(load_state_dict(state, r.opt.get(), {.path = checkpoint}));
  Train(r, tokens, targets);
  return Parameters(config, r);
}

absl::StatusOr<StateDict> TrainGptAlone(const GptConfig& config, const StateDict& init,
                                        const Tensor& tokens, const Tensor& targets) {
  EMBER_ASSIGN_OR_RETURN(Replica r, MakeReplica("alone", config, init));
  Train(r, tokens, targets);
  StateDict out;
  for (const auto& [name, p] : r.model->named_parameters()) out.push_back({name, p.detach()});
  return out;
}

absl::StatusOr<double> MaxRelativeDifference(const std::vector<LocalParameter>& mine,
                                             const StateDict& whole) {
  double worst = 0;
  for (const LocalParameter& p : mine) {
    auto it = std::find_if(whole.begin(), whole.end(),
                           [&](const auto& entry) { return entry.first == p.name; });
    if (it == whole.end()) return absl::NotFoundError(absl::StrCat("no parameter ", p.name));
    Tensor want = it->second;
    if (p.dim >= 0) {
      if (p.dim >= want.dim() || want.size(p.dim) % p.count != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(p.name, ": dim ", p.dim, " does not split into ", p.count));
      }
      const int64_t length = want.size(p.dim) / p.count;
      want = want.narrow(p.dim, p.index * length, length);
    }
    if (p.value.sizes() != want.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(p.name, ": shape differs from the whole's part"));
    }
    const double scale = want.abs().max().item<double>();
    const double diff = (p.value - want).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(scale, 1e-12));
  }
  return worst;
}

}  // namespace ember::parallel::testing
