// Pipeline schedules against PyTorch 2.x's torch.distributed.pipelining
// (testdata/torch_pipelining.py runs it on the CPU over gloo and writes the
// starting parameters, the batches, each schedule's final parameters per
// rank and the last stage's microbatch losses): the same 4-layer MLP on 2
// ranks (forked processes) over gloo, ScheduleGPipe and Schedule1F1B with
// one stage of 2 layers per rank, ScheduleInterleaved1F1B and
// ScheduleInterleavedZeroBubble with 4 stages of one layer, 2 per rank; 4
// microbatches of a 16-row batch, mse_loss mean, scale_grads on, SGD lr
// 0.1, 3 steps. Every parameter of every rank must be
// within 1e-5 relative (max |ours - torch| / max |torch|) of torch's, and
// every microbatch loss of every step too; each rank prints its figures.
// Skips without the peer (tools/install_peers.sh installs it).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/pipelining.h"
#include "parallel/rank_testing.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Get;
using ::ember::parallel::rank_testing::Guard;

namespace testing = ::ember::distributed::testing;

constexpr int kLayers = 4;
constexpr int kSteps = 3;
constexpr int kMicrobatches = 4;

const rank_testing::TorchRun& Torch() {
  return rank_testing::RunTorchOnce("parallel/testdata/torch_pipelining.py", "torch_pipelining");
}

double MaxRel(const Tensor& ours, const Tensor& theirs) {
  const double diff = (ours - theirs).abs().max().item<double>();
  return diff / std::max(theirs.abs().max().item<double>(), 1e-12);
}

absl::Status Train(testing::Rank& me, const std::string& name) {
  return Guard([&]() -> absl::Status {
    const std::string& dir = Torch().dir;
    EMBER_ASSIGN_OR_RETURN(const StateDict init, load(dir + "/init.pt"));
    EMBER_ASSIGN_OR_RETURN(const StateDict data, load(dir + "/data.pt"));
    const bool interleaved = name == "interleaved" || name == "zero_bubble";
    const int num_stages = interleaved ? 2 * me.world_size : me.world_size;
    const int per = kLayers / num_stages;
    std::vector<std::shared_ptr<nn::Linear>> layers;
    for (int i = 0; i < kLayers; ++i) {
      auto lin = std::make_shared<nn::Linear>(8, 8);
      EMBER_RETURN_IF_ERROR(
          lin->load_state_dict({{"weight", Get(init, absl::StrCat("layer", i, ".weight"))},
                                {"bias", Get(init, absl::StrCat("layer", i, ".bias"))}}));
      layers.push_back(lin);
    }
    std::vector<std::shared_ptr<PipelineStage>> stages;
    std::vector<Tensor> params;
    for (int s = me.rank; s < num_stages; s += me.world_size) {
      auto part = std::make_shared<nn::Sequential>();
      for (int i = s * per; i < (s + 1) * per; ++i) {
        part->push_back(layers[i]);
        if (i + 1 < kLayers) part->push_back(std::make_shared<nn::ReLU>());
      }
      for (const Tensor& p : part->parameters()) params.push_back(p);
      EMBER_ASSIGN_OR_RETURN(auto stage,
                             PipelineStage::create(part, s, num_stages, {.group = me.group}));
      stages.push_back(stage);
    }
    ScheduleOptions options{.loss_fn = [](const Tensor& out, const Tensor& y) {
      return nn::functional::mse_loss(out, y);
    }};
    std::unique_ptr<PipelineSchedule> schedule;
    if (name == "gpipe") {
      EMBER_ASSIGN_OR_RETURN(schedule, ScheduleGPipe::create(stages[0], kMicrobatches, options));
    } else if (name == "1f1b") {
      EMBER_ASSIGN_OR_RETURN(schedule, Schedule1F1B::create(stages[0], kMicrobatches, options));
    } else if (name == "interleaved") {
      EMBER_ASSIGN_OR_RETURN(schedule,
                             ScheduleInterleaved1F1B::create(stages, kMicrobatches, options));
    } else {
      EMBER_ASSIGN_OR_RETURN(schedule,
                             ScheduleInterleavedZeroBubble::create(stages, kMicrobatches, options));
    }
    const bool last = stages.back()->is_last();
    StateDict their_losses;
    if (last) {
      EMBER_ASSIGN_OR_RETURN(their_losses, load(absl::StrCat(dir, "/losses_", name, ".pt")));
    }
    nn::optim::SGD opt(params, {.lr = 0.1});
    const Tensor xs = Get(data, "x"), ys = Get(data, "y");
    double loss_rel = 0;
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      std::vector<Tensor> losses;
      EMBER_RETURN_IF_ERROR(schedule
                                ->step(me.rank == 0 ? xs.select(0, step) : Tensor(),
                                       last ? ys.select(0, step) : Tensor(), &losses)
                                .status());
      if (last) {
        const Tensor theirs = Get(their_losses, absl::StrCat("step", step));
        loss_rel = std::max(loss_rel, MaxRel(stack(losses), theirs));
      }
      opt.step();
    }
    EMBER_ASSIGN_OR_RETURN(const StateDict final_params,
                           load(absl::StrCat(dir, "/final_", name, "_rank", me.rank, ".pt")));
    double param_rel = 0;
    for (int s = me.rank; s < num_stages; s += me.world_size) {
      for (int i = s * per; i < (s + 1) * per; ++i) {
        param_rel = std::max(
            param_rel,
            MaxRel(layers[i]->weight(), Get(final_params, absl::StrCat("layer", i, ".weight"))));
        param_rel = std::max(
            param_rel,
            MaxRel(layers[i]->bias(), Get(final_params, absl::StrCat("layer", i, ".bias"))));
      }
    }
    std::fprintf(stderr, "%s rank %d: parameters max relative difference from torch %.3g%s\n",
                 name.c_str(), me.rank, param_rel,
                 last ? absl::StrCat(", losses ", absl::StrFormat("%.3g", loss_rel)).c_str() : "");
    if (!(param_rel <= 1e-5) || !(loss_rel <= 1e-5)) {
      return absl::InternalError(
          absl::StrCat(name, " rank ", me.rank, ": differs from torch: parameters by ", param_rel,
                       " relative, losses by ", loss_rel, " (tolerance 1e-5)"));
    }
    return absl::OkStatus();
  });
}

class PipeliningTorchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PipeliningTorchTest, FinalParametersAndLossesMatchTorch) {
  const rank_testing::TorchRun& torch = Torch();
  if (absl::IsNotFound(torch.status)) GTEST_SKIP() << torch.status.message();
  ASSERT_TRUE(torch.status.ok()) << torch.status;
  testing::RunRanksOptions options;
  options.backend = "gloo";
  const std::string name = GetParam();
  const std::vector<testing::ProcessResult> results = testing::RunRankProcesses(
      2, [&](testing::Rank& me) { return Train(me, name); }, options);
  for (const auto& r : results) std::printf("%s", r.output.c_str());
  ExpectAllSucceeded(results);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipeliningTorchTest,
                         ::testing::Values("gpipe", "1f1b", "interleaved", "zero_bubble"));

}  // namespace
}  // namespace ember::parallel
