// A small GPT trained in each of the layouts of model parallelism
// (testonly): tensor parallel, pipeline parallel under each schedule, and
// FSDP over one dimension of a 2-D mesh with tensor parallelism over the
// other. The tests train one model's starting state for a few steps in a
// layout and compare each rank's parameters with the same training in one
// process (gpt_parallel_test) or in PyTorch 2.x (gpt_parallel_torch_test,
// whose side is testdata/torch_gpt_parallel.py, the same model and layouts).
//
//   const GptConfig config;
//   auto gpt = ember::parallel::testing::MakeGpt(config);  // random init
//   EMBER_ASSIGN_OR_RETURN(auto mine, TrainGpt("fsdp_tp", config, gpt->state_dict(),
//                                              tokens, targets));  // on 4 ranks
//   EMBER_ASSIGN_OR_RETURN(StateDict alone, TrainGptAlone(config, gpt->state_dict(),
//                                                          tokens, targets));
//   EMBER_ASSIGN_OR_RETURN(double rel, MaxRelativeDifference(mine, alone));
//
// The model: nn/models/gpt.h's causal GPT, Sequential("0": token and
// position embeddings, "1".."L": pre-LayerNorm transformer blocks, "L+1":
// LayerNorm, "L+2": the vocabulary head, Linear(dim, vocab)); the loss is
// cross_entropy (mean) of the logits against the next tokens. Training: SGD with momentum,
// `steps` batches of [batch, seq] tokens.
//
// Layouts (every rank of the default group calls TrainGpt with the same
// arguments):
//   "tp"             2 ranks, GptTpPlan over a 1-D mesh, the whole batch each.
//   "pp_gpipe", "pp_1f1b"
//                    2 ranks, one stage each (embeddings and the first
//                    block; the rest), 4 microbatches.
//   "pp_interleaved", "pp_zero_bubble"
//                    2 ranks, 4 stages (embeddings; each block; the norm and
//                    the head), two per rank, 4 microbatches.
//   "fsdp_tp"        4 ranks, a ("dp", "tp") mesh of 2 x 2: GptTpPlan over
//                    "tp", then fully_shard over "dp" with each block a unit;
//                    dp coordinate d trains rows [d B/2, (d + 1) B/2).
//   "alone"          this process: the whole model on the whole batch.
//
// Thread-safety: plain functions; TrainGpt is collective.
#ifndef EMBER_PARALLEL_GPT_PARALLEL_TESTING_H_
#define EMBER_PARALLEL_GPT_PARALLEL_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nn/container.h"
#include "nn/module.h"
#include "parallel/tensor_parallel.h"
#include "serialization/state_dict.h"
#include "tensor/tensor.h"

namespace ember::parallel::testing {

struct GptConfig {
  int64_t vocab = 16;
  int64_t dim = 8;
  int64_t head_dim = 2;  // dim / head_dim heads, which tensor parallelism splits
  int64_t hidden = 16;
  int64_t seq = 4;
  int layers = 2;
  double lr = 0.1;
  double momentum = 0.9;
};

// nn::models::make_gpt of the config, causal.
std::shared_ptr<nn::Sequential> MakeGpt(const GptConfig& config);

// Colwise q, k, v and fc1, rowwise o and fc2 in every block; the token
// embedding rowwise (its rows split, the lookups summed); the head colwise
// with its logits gathered (output Replicate). Position embedding and norms
// replicated.
ParallelizePlan GptTpPlan(const GptConfig& config);

// The dimension GptTpPlan shards parameter `name` along; -1: not sharded.
int64_t GptShardDim(const GptConfig& config, const std::string& name);

// mean cross_entropy of logits [b, s, vocab] against targets [b, s].
Tensor GptLoss(const Tensor& logits, const Tensor& targets);

// "tp", "pp_gpipe", "pp_1f1b", "pp_interleaved", "pp_zero_bubble", "fsdp_tp".
const std::vector<std::string>& GptLayouts();
// The number of ranks a layout runs on ("alone": this process, no group).
int GptLayoutRanks(const std::string& layout);

// One parameter this rank holds after training: the part `index` of `count`
// equal parts along `dim` of the whole parameter `name` (dim -1: all of it).
struct LocalParameter {
  std::string name;
  Tensor value;
  int64_t dim = -1;
  int index = 0;
  int count = 1;
};

// Trains the model whose whole starting state is `init` in `layout` (or
// "alone") on the default group (which must have GptLayoutRanks(layout)
// ranks), one step per tokens.select(0, s) / targets.select(0, s) ([steps,
// batch, seq]), and returns the parameters this rank holds at the end.
// `save_to` non-empty ("alone", "tp", "fsdp_tp"): then saves the model and
// the optimizer's state there as one distributed checkpoint
// (parallel/state_dict.h, with the tensor-parallel shards placed in the
// whole tensors), collectively over the default group.
absl::StatusOr<std::vector<LocalParameter>> TrainGpt(const std::string& layout,
                                                     const GptConfig& config,
                                                     const StateDict& init, const Tensor& tokens,
                                                     const Tensor& targets,
                                                     const std::string& save_to = "");

// Builds `layout` ("alone", "tp" or "fsdp_tp") from a start unlike any
// checkpoint's, loads the model and the optimizer's state from the
// distributed checkpoint at `checkpoint` (which any of those layouts may
// have saved: it reshards), trains on tokens / targets as TrainGpt does and
// returns the parameters this rank holds.
absl::StatusOr<std::vector<LocalParameter>> ResumeGpt(const std::string& layout,
                                                      const GptConfig& config,
                                                      const std::string& checkpoint,
                                                      const Tensor& tokens,
                                                      const Tensor& targets);

// The same training in this process alone: the whole model's final state.
absl::StatusOr<StateDict> TrainGptAlone(const GptConfig& config, const StateDict& init,
                                        const Tensor& tokens, const Tensor& targets);

// The largest, over `mine`, of max |value - part of whole| / max |part of
// whole|. NotFound for a name `whole` lacks, InvalidArgument for a shape
// that does not fit.
absl::StatusOr<double> MaxRelativeDifference(const std::vector<LocalParameter>& mine,
                                             const StateDict& whole);

}  // namespace ember::parallel::testing

#endif  // EMBER_PARALLEL_GPT_PARALLEL_TESTING_H_
