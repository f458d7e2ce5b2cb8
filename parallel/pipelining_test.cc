// Pipeline parallelism over real process groups: ranks are forked processes
// (distributed/testing/ranks.h) over tcp, and gloo for one case. An MLP of
// Linear+ReLU layers is cut into 2 or 4 stages; every rank trains its
// stages with a schedule for a few SGD steps and checks itself against one
// process that trains the whole model on the whole batch.
//
// What is compared: with a mean-reduced mse_loss per microbatch and
// scale_grads (torch's default), the pipeline's gradient is the mean over
// microbatches of each microbatch's loss gradient, so the reference's loss
// is mse_loss of the whole batch when the microbatches are even, and the sum
// of the microbatches' losses divided by their count when they are not
// (the split given by hand, as torch.tensor_split makes it). With a
// sum-reduced loss and scale_grads off the reference is the whole batch's
// summed loss. After the steps every parameter of every stage must be
// within 1e-5 relative (max |a - b| / max |b|) of the reference's; the
// losses the last stage returns and its merged output are checked at the
// first step, and the activations held at once (microbatches in flight)
// against the schedule's figure.
#include "parallel/pipelining.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/rank_testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Describe;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Guard;
using ::testing::HasSubstr;

namespace testing = ::ember::distributed::testing;

constexpr int64_t kWidth = 8;
constexpr int kSteps = 3;

std::vector<std::shared_ptr<nn::Linear>> Layers(int n) {
  manual_seed(4242);
  std::vector<std::shared_ptr<nn::Linear>> layers;
  for (int i = 0; i < n; ++i) layers.push_back(std::make_shared<nn::Linear>(kWidth, kWidth));
  return layers;
}

// Layers [first, last) with a ReLU after each but the model's last.
std::shared_ptr<nn::Sequential> Part(const std::vector<std::shared_ptr<nn::Linear>>& layers,
                                     int first, int last) {
  auto seq = std::make_shared<nn::Sequential>();
  for (int i = first; i < last; ++i) {
    seq->push_back(layers[i]);
    if (i + 1 < static_cast<int>(layers.size())) seq->push_back(std::make_shared<nn::ReLU>());
  }
  return seq;
}

struct Batch {
  Tensor x, y;
};
Batch StepBatch(int step, int64_t rows) {
  Generator gen(900 + step);
  Tensor x = randn({rows, kWidth}, {}, &gen);
  return {x, randn({rows, kWidth}, {}, &gen)};
}

enum class Kind { kGPipe, k1F1B, kInterleaved, kZeroBubble };

struct Config {
  Kind kind = Kind::k1F1B;
  int num_stages = 2;
  int layers = 4;
  int microbatches = 4;
  int64_t batch = 16;
  // The microbatch rows, by hand; empty: even.
  std::vector<int64_t> uneven;
  bool summed = false;  // nn::Reduction::kSum and scale_grads off
  std::string backend = "tcp";
  // The activations each local stage holds at once (by stage index); -1:
  // not checked.
  std::function<int(int stage)> peak = [](int) { return -1; };
};

int World(const Config& c) {
  return c.kind == Kind::kInterleaved || c.kind == Kind::kZeroBubble ? c.num_stages / 2
                                                                     : c.num_stages;
}

absl::Status MaxRelative(const Tensor& got, const Tensor& want, const std::string& what) {
  const double diff = (got - want).abs().max().item<double>();
  const double scale = std::max(want.abs().max().item<double>(), 1e-12);
  if (!(diff / scale <= 1e-5)) {
    return absl::InternalError(absl::StrCat(what, " differs from one process by ", diff,
                                            " (relative ", diff / scale, ", tolerance 1e-5)"));
  }
  return absl::OkStatus();
}

absl::Status Train(testing::Rank& me, const Config& c) {
  return Guard([&]() -> absl::Status {
    const int world = me.world_size;
    const int per_stage = c.layers / c.num_stages;
    std::vector<std::shared_ptr<nn::Linear>> layers = Layers(c.layers);
    std::vector<std::shared_ptr<nn::Linear>> ref_layers = Layers(c.layers);
    auto reference = Part(ref_layers, 0, c.layers);
    std::vector<std::shared_ptr<PipelineStage>> stages;
    std::vector<Tensor> params;
    for (int s = me.rank; s < c.num_stages; s += world) {
      auto part = Part(layers, s * per_stage, (s + 1) * per_stage);
      for (const Tensor& p : part->parameters()) params.push_back(p);
      EMBER_ASSIGN_OR_RETURN(auto stage,
                             PipelineStage::create(part, s, c.num_stages, {.group = me.group}));
      stages.push_back(stage);
    }
    const nn::Reduction reduction = c.summed ? nn::Reduction::kSum : nn::Reduction::kMean;
    ScheduleOptions options{.loss_fn =
                                [reduction](const Tensor& out, const Tensor& y) {
                                  return nn::functional::mse_loss(out, y, reduction);
                                },
                            .scale_grads = !c.summed};
    std::unique_ptr<PipelineSchedule> schedule;
    if (c.kind == Kind::kGPipe) {
      EMBER_ASSIGN_OR_RETURN(schedule, ScheduleGPipe::create(stages[0], c.microbatches, options));
    } else if (c.kind == Kind::k1F1B) {
      EMBER_ASSIGN_OR_RETURN(schedule, Schedule1F1B::create(stages[0], c.microbatches, options));
    } else if (c.kind == Kind::kInterleaved) {
      EMBER_ASSIGN_OR_RETURN(schedule,
                             ScheduleInterleaved1F1B::create(stages, c.microbatches, options));
    } else {
      EMBER_ASSIGN_OR_RETURN(
          schedule, ScheduleInterleavedZeroBubble::create(stages, c.microbatches, options));
    }
    const bool first = me.rank == 0;
    const bool last = stages.back()->is_last();
    const double lr = c.summed ? 0.005 : 0.1;
    nn::optim::SGD opt(params, {.lr = lr});
    nn::optim::SGD ref_opt(reference->parameters(), {.lr = lr});
    std::vector<int64_t> sizes = c.uneven;
    if (sizes.empty()) sizes.assign(c.microbatches, c.batch / c.microbatches);
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = StepBatch(step, c.batch);
      opt.zero_grad();
      std::vector<Tensor> losses;
      EMBER_ASSIGN_OR_RETURN(
          Tensor out, schedule->step(first ? b.x : Tensor(), last ? b.y : Tensor(), &losses));
      // The reference, and the microbatch losses the last stage must return.
      std::vector<Tensor> mb_losses;
      int64_t offset = 0;
      for (int64_t rows : sizes) {
        mb_losses.push_back(nn::functional::mse_loss((*reference)(b.x.narrow(0, offset, rows)),
                                                     b.y.narrow(0, offset, rows), reduction));
        offset += rows;
      }
      if (step == 0 && last) {
        if (losses.size() != static_cast<size_t>(c.microbatches)) {
          return absl::InternalError(absl::StrCat("the last stage returned ", losses.size(),
                                                  " losses for ", c.microbatches, " microbatches"));
        }
        for (int i = 0; i < c.microbatches; ++i) {
          EMBER_RETURN_IF_ERROR(
              MaxRelative(losses[i], mb_losses[i].detach(), absl::StrCat("loss ", i)));
        }
        EMBER_RETURN_IF_ERROR(MaxRelative(out, (*reference)(b.x).detach(), "the merged output"));
      }
      if (!last && out.defined()) {
        return absl::InternalError("a rank without the last stage got an output");
      }
      for (const auto& st : stages) {
        const int want = c.peak(st->stage_index());
        if (want >= 0 && schedule->last_step_stats().peak_in_flight != want) {
          return absl::InternalError(absl::StrCat(
              "stage ", st->stage_index(), " held ", schedule->last_step_stats().peak_in_flight,
              " microbatches' activations at once; the schedule holds ", want));
        }
      }
      Tensor ref_loss;
      if (c.summed) {
        ref_loss = nn::functional::mse_loss((*reference)(b.x), b.y, nn::Reduction::kSum);
      } else if (c.uneven.empty()) {
        ref_loss = nn::functional::mse_loss((*reference)(b.x), b.y);
      } else {
        for (const Tensor& l : mb_losses) ref_loss = ref_loss.defined() ? ref_loss + l : l;
        ref_loss = ref_loss / static_cast<double>(c.microbatches);
      }
      ref_opt.zero_grad();
      ref_loss.backward();
      opt.step();
      ref_opt.step();
    }
    for (int s = me.rank; s < c.num_stages; s += world) {
      for (int i = s * per_stage; i < (s + 1) * per_stage; ++i) {
        EMBER_RETURN_IF_ERROR(MaxRelative(layers[i]->weight(), ref_layers[i]->weight(),
                                          absl::StrCat("layer ", i, " weight (stage ", s, ")")));
        EMBER_RETURN_IF_ERROR(MaxRelative(layers[i]->bias(), ref_layers[i]->bias(),
                                          absl::StrCat("layer ", i, " bias (stage ", s, ")")));
      }
    }
    return absl::OkStatus();
  });
}

void ExpectMatchesOneProcess(const Config& c) {
  testing::RunRanksOptions options;
  options.backend = c.backend;
  ExpectAllSucceeded(testing::RunRankProcesses(
      World(c), [&](testing::Rank& me) { return Train(me, c); }, options));
}

TEST(PipeliningTest, MicrobatchSizesAreTensorSplits) {
  EXPECT_EQ(MicrobatchSizes(16, 4), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(MicrobatchSizes(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(MicrobatchSizes(9, 8), (std::vector<int64_t>{2, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(PipeliningTest, GPipeTwoStagesFourMicrobatches) {
  ExpectMatchesOneProcess({.kind = Kind::kGPipe, .peak = [](int) { return 4; }});
}

TEST(PipeliningTest, GPipeFourStagesEightMicrobatches) {
  ExpectMatchesOneProcess(
      {.kind = Kind::kGPipe, .num_stages = 4, .layers = 8, .microbatches = 8, .peak = [](int) {
         return 8;
       }});
}

TEST(PipeliningTest, OneFOneBTwoStagesFourMicrobatches) {
  // Stage s holds at most num_stages - s microbatches.
  ExpectMatchesOneProcess({.kind = Kind::k1F1B, .peak = [](int s) { return 2 - s; }});
}

TEST(PipeliningTest, OneFOneBFourStagesEightMicrobatches) {
  ExpectMatchesOneProcess(
      {.kind = Kind::k1F1B, .num_stages = 4, .layers = 8, .microbatches = 8, .peak = [](int s) {
         return 4 - s;
       }});
}

TEST(PipeliningTest, OneFOneBFourStagesFourMicrobatchesFourLayers) {
  ExpectMatchesOneProcess(
      {.kind = Kind::k1F1B, .num_stages = 4, .layers = 4, .microbatches = 4, .peak = [](int s) {
         return 4 - s;
       }});
}

TEST(PipeliningTest, OneFOneBOverGloo) {
  ExpectMatchesOneProcess(
      {.kind = Kind::k1F1B, .microbatches = 8, .backend = "gloo", .peak = [](int s) {
         return 2 - s;
       }});
}

TEST(PipeliningTest, UnevenLastMicrobatchesAsTensorSplit) {
  // 10 rows in 4 microbatches: 3, 3, 2, 2 (each stage learns the shape
  // from the header).
  ExpectMatchesOneProcess(
      {.kind = Kind::k1F1B, .microbatches = 4, .batch = 10, .uneven = {3, 3, 2, 2}});
}

TEST(PipeliningTest, SummedLossWithoutScaleGrads) {
  ExpectMatchesOneProcess({.kind = Kind::kGPipe, .microbatches = 8, .summed = true});
}

TEST(PipeliningTest, InterleavedTwoStagesPerRankOnTwoRanks) {
  ExpectMatchesOneProcess({.kind = Kind::kInterleaved, .num_stages = 4, .layers = 8});
}

TEST(PipeliningTest, InterleavedEightMicrobatches) {
  ExpectMatchesOneProcess(
      {.kind = Kind::kInterleaved, .num_stages = 4, .layers = 8, .microbatches = 8});
}

TEST(PipeliningTest, InterleavedOverGlooUneven) {
  ExpectMatchesOneProcess({.kind = Kind::kInterleaved,
                           .num_stages = 4,
                           .layers = 4,
                           .microbatches = 4,
                           .batch = 10,
                           .uneven = {3, 3, 2, 2},
                           .backend = "gloo"});
}

TEST(PipeliningTest, TwoStagesOnOneRankHandOverLocally) {
  // A group of one: stage 0's output and stage 1's gradient never leave
  // the process.
  ExpectMatchesOneProcess({.kind = Kind::kInterleaved, .num_stages = 2, .layers = 4});
  ExpectMatchesOneProcess({.kind = Kind::kZeroBubble, .num_stages = 2, .layers = 4});
}

TEST(PipeliningTest, ZeroBubbleTwoStagesPerRankOnTwoRanks) {
  ExpectMatchesOneProcess({.kind = Kind::kZeroBubble, .num_stages = 4, .layers = 8});
}

TEST(PipeliningTest, ZeroBubbleEightMicrobatches) {
  ExpectMatchesOneProcess(
      {.kind = Kind::kZeroBubble, .num_stages = 4, .layers = 8, .microbatches = 8});
}

TEST(PipeliningTest, ZeroBubbleFourRanksOverGlooUneven) {
  ExpectMatchesOneProcess({.kind = Kind::kZeroBubble,
                           .num_stages = 8,
                           .layers = 8,
                           .microbatches = 8,
                           .batch = 12,
                           .uneven = {2, 2, 2, 2, 1, 1, 1, 1},
                           .backend = "gloo"});
}

// This rank's order of work, in torch's notation.
std::string Order(const PipelineSchedule& schedule) {
  std::string got;
  for (const auto& a : schedule.actions()) {
    absl::StrAppend(&got, got.empty() ? "" : " ", PipelineSchedule::ActionName(a));
  }
  return got;
}

// The orders below are what torch 2.15's _get_1f1b_rank_ops gives (without
// its no-op slots) for 2 ranks, 2 local stages, 4 microbatches.
TEST(PipeliningTest, InterleavedAndZeroBubbleOrdersAreTorchs) {
  absl::Status s = testing::RunRanks(2, [](testing::Rank& me) -> absl::Status {
    auto layers = Layers(4);
    std::vector<std::shared_ptr<PipelineStage>> stages;
    for (int st = me.rank; st < 4; st += 2) {
      EMBER_ASSIGN_OR_RETURN(
          auto stage, PipelineStage::create(Part(layers, st, st + 1), st, 4, {.group = me.group}));
      stages.push_back(stage);
    }
    const ScheduleOptions options{
        .loss_fn = [](const Tensor& a, const Tensor& b) { return nn::functional::mse_loss(a, b); }};
    EMBER_ASSIGN_OR_RETURN(auto interleaved, ScheduleInterleaved1F1B::create(stages, 4, options));
    EMBER_ASSIGN_OR_RETURN(auto zero_bubble,
                           ScheduleInterleavedZeroBubble::create(stages, 4, options));
    const std::string want_interleaved[2] = {
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"};
    const std::string want_zero_bubble[2] = {
        "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 "
        "0W2 0I3 0W3",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 "
        "1I3 1W2 1W3"};
    if (Order(*interleaved) != want_interleaved[me.rank]) {
      return absl::InternalError(absl::StrCat("interleaved order ", Order(*interleaved), " is not ",
                                              want_interleaved[me.rank]));
    }
    if (Order(*zero_bubble) != want_zero_bubble[me.rank]) {
      return absl::InternalError(absl::StrCat("zero bubble order ", Order(*zero_bubble), " is not ",
                                              want_zero_bubble[me.rank]));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(PipeliningTest, InterleavedWithoutLossRunsTheForwardsOfTorchsOrder) {
  // Without a loss_fn only forwards run: the Fs of the order above, each
  // local stage over a round of 2 microbatches.
  absl::Status s = testing::RunRanks(2, [](testing::Rank& me) -> absl::Status {
    if (me.rank != 0) return absl::OkStatus();
    auto layers = Layers(4);
    std::vector<std::shared_ptr<PipelineStage>> stages;
    for (int st : {0, 2}) {
      EMBER_ASSIGN_OR_RETURN(
          auto stage, PipelineStage::create(Part(layers, st, st + 1), st, 4, {.group = me.group}));
      stages.push_back(stage);
    }
    EMBER_ASSIGN_OR_RETURN(auto schedule, ScheduleInterleaved1F1B::create(stages, 4, {}));
    const std::string want = "0F0 0F1 2F0 2F1 0F2 0F3 2F2 2F3";
    if (Order(*schedule) != want) {
      return absl::InternalError(absl::StrCat("order ", Order(*schedule), " is not ", want));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(PipeliningTest, WithoutALossFunctionAStepRunsForwardsAndReturnsTheOutput) {
  ExpectAllSucceeded(testing::RunRankProcesses(2, [](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto layers = Layers(4);
      auto whole = Part(Layers(4), 0, 4);
      EMBER_ASSIGN_OR_RETURN(
          auto stage, PipelineStage::create(Part(layers, 2 * me.rank, 2 * me.rank + 2), me.rank, 2,
                                            {.group = me.group}));
      EMBER_ASSIGN_OR_RETURN(auto schedule, Schedule1F1B::create(stage, 4));
      const Batch b = StepBatch(0, 10);
      EMBER_ASSIGN_OR_RETURN(Tensor out, schedule->step(me.rank == 0 ? b.x : Tensor()));
      if (schedule->last_step_stats().peak_in_flight != 0) {
        return absl::InternalError("a forward-only step held activations for a backward");
      }
      if (me.rank == 0) {
        return out.defined() ? absl::InternalError("rank 0 got an output") : absl::OkStatus();
      }
      for (const Tensor& p : stage->submod()->parameters()) {
        if (p.grad().defined()) return absl::InternalError("a forward-only step made gradients");
      }
      return MaxRelative(out, (*whole)(b.x).detach(), "the forward-only output");
    });
  }));
}

// --- Bad input -------------------------------------------------------------------

PipelineLossFn Mse() {
  return [](const Tensor& a, const Tensor& b) { return nn::functional::mse_loss(a, b); };
}

TEST(PipeliningTest, OneFOneBRefusesFewerMicrobatchesThanStages) {
  std::vector<absl::Status> each = testing::RunRanksEach(2, [](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto layers = Layers(2);
      EMBER_ASSIGN_OR_RETURN(auto stage, PipelineStage::create(Part(layers, me.rank, me.rank + 1),
                                                               me.rank, 2, {.group = me.group}));
      return Schedule1F1B::create(stage, 1, {.loss_fn = Mse()}).status();
    });
  });
  for (const absl::Status& s : each) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("Number of microbatches (1) must be greater than or "
                                       "equal to the number of stages (2)"));
  }
}

TEST(PipeliningTest, StagesOnTheWrongRankAndBadIndicesAreRefused) {
  std::vector<absl::Status> each = testing::RunRanksEach(2, [](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto layers = Layers(2);
      const int other = 1 - me.rank;
      absl::Status wrong =
          PipelineStage::create(Part(layers, 0, 1), other, 2, {.group = me.group}).status();
      if (!absl::IsInvalidArgument(wrong) ||
          !absl::StrContains(wrong.message(),
                             absl::StrCat("stage ", other, " runs on rank ", other)) ||
          !absl::StrContains(wrong.message(), absl::StrCat("this is rank ", me.rank))) {
        return absl::InternalError(absl::StrCat("wrong rank: ", wrong.ToString()));
      }
      absl::Status outside =
          PipelineStage::create(Part(layers, 0, 1), 5, 2, {.group = me.group}).status();
      if (!absl::StrContains(outside.message(), "stage_index 5 is outside [0, 2)")) {
        return absl::InternalError(absl::StrCat("outside: ", outside.ToString()));
      }
      EMBER_ASSIGN_OR_RETURN(auto stage, PipelineStage::create(Part(layers, me.rank, me.rank + 1),
                                                               me.rank, 2, {.group = me.group}));
      absl::Status interleaved = ScheduleInterleaved1F1B::create({stage, stage}, 4, {}).status();
      if (!absl::StrContains(interleaved.message(),
                             "num_stages (2) must be the group size (2) times the stages on "
                             "each rank (2 here)")) {
        return absl::InternalError(absl::StrCat("interleaved: ", interleaved.ToString()));
      }
      return absl::OkStatus();
    });
  });
  for (const absl::Status& s : each) EXPECT_TRUE(s.ok()) << s;
}

TEST(PipeliningTest, InterleavedRefusesMicrobatchesThatAreNotWholeRounds) {
  std::vector<absl::Status> each = testing::RunRanksEach(2, [](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto layers = Layers(4);
      std::vector<std::shared_ptr<PipelineStage>> stages;
      for (int st = me.rank; st < 4; st += 2) {
        EMBER_ASSIGN_OR_RETURN(auto stage, PipelineStage::create(Part(layers, st, st + 1), st, 4,
                                                                 {.group = me.group}));
        stages.push_back(stage);
      }
      return ScheduleInterleaved1F1B::create(stages, 5, {.loss_fn = Mse()}).status();
    });
  });
  for (const absl::Status& s : each) {
    EXPECT_THAT(s.message(), HasSubstr("multiple of the number of rounds (2), but got 5"));
  }
}

TEST(PipeliningTest, ABatchThatDoesNotSplitIsRefusedOnBothEnds) {
  testing::RunRanksOptions options;
  options.timeout = absl::Seconds(2);
  std::vector<absl::Status> each = testing::RunRanksEach(
      2,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto layers = Layers(2);
          EMBER_ASSIGN_OR_RETURN(
              auto stage, PipelineStage::create(Part(layers, me.rank, me.rank + 1), me.rank, 2,
                                                {.group = me.group}));
          EMBER_ASSIGN_OR_RETURN(auto schedule,
                                 ScheduleGPipe::create(stage, 4, {.loss_fn = Mse()}));
          const Batch b = StepBatch(0, 3);
          return schedule->step(me.rank == 0 ? b.x : Tensor(), me.rank == 1 ? b.y : Tensor())
              .status();
        });
      },
      options);
  ASSERT_EQ(each.size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(each[0])) << each[0];
  EXPECT_THAT(each[0].message(), HasSubstr("input's size 3 on dim 0 is smaller than "
                                           "n_microbatches (4)"));
  // Rank 1's target does not split either; it says so before any receive.
  EXPECT_THAT(each[1].message(), HasSubstr("target's size 3 on dim 0"));
}

TEST(PipeliningTest, AMissingInputOnTheFirstStageIsRefusedAndItsPeerFails) {
  testing::RunRanksOptions options;
  options.timeout = absl::Seconds(2);
  std::vector<absl::Status> each = testing::RunRanksEach(
      2,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto layers = Layers(2);
          EMBER_ASSIGN_OR_RETURN(
              auto stage, PipelineStage::create(Part(layers, me.rank, me.rank + 1), me.rank, 2,
                                                {.group = me.group}));
          EMBER_ASSIGN_OR_RETURN(auto schedule, Schedule1F1B::create(stage, 2, {.loss_fn = Mse()}));
          const Batch b = StepBatch(0, 4);
          return schedule->step(Tensor(), me.rank == 1 ? b.y : Tensor()).status();
        });
      },
      options);
  ASSERT_EQ(each.size(), 2u);
  EXPECT_THAT(each[0].message(), HasSubstr("holds stage 0, the first stage: pass the batch"));
  // Its peer's receive fails (rank 0 has left the group) instead of hanging.
  EXPECT_FALSE(each[1].ok());
  EXPECT_THAT(each[1].message(), HasSubstr("pipeline receive of an activation header (stage 1, "
                                           "microbatch 0, from stage 0 on rank 0)"));
}

TEST(PipeliningTest, AReceiveFromAPeerThatNeverSendsEndsAtTheGroupTimeout) {
  // Rank 0 stays in the group (in a barrier) without stepping; rank 1's
  // step must give up at the group's timeout, then join the barrier.
  testing::RunRanksOptions options;
  options.timeout = absl::Seconds(1);
  std::vector<absl::Status> each = testing::RunRanksEach(
      2,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto layers = Layers(2);
          EMBER_ASSIGN_OR_RETURN(
              auto stage, PipelineStage::create(Part(layers, me.rank, me.rank + 1), me.rank, 2,
                                                {.group = me.group}));
          EMBER_ASSIGN_OR_RETURN(auto schedule, Schedule1F1B::create(stage, 2, {.loss_fn = Mse()}));
          absl::Status stepped;
          if (me.rank == 1) stepped = schedule->step(Tensor(), StepBatch(0, 4).y).status();
          EMBER_RETURN_IF_ERROR(testing::Finish(me.group->barrier({.timeout = absl::Seconds(20)})));
          return stepped;
        });
      },
      options);
  ASSERT_EQ(each.size(), 2u);
  EXPECT_TRUE(each[0].ok()) << each[0];
  EXPECT_TRUE(absl::IsDeadlineExceeded(each[1])) << each[1];
  EXPECT_THAT(each[1].message(), HasSubstr("pipeline receive of an activation header (stage 1, "
                                           "microbatch 0, from stage 0 on rank 0)"));
}

TEST(PipeliningTest, AShapeMismatchBetweenStagesNamesBothShapes) {
  testing::RunRanksOptions options;
  options.timeout = absl::Seconds(2);
  std::vector<absl::Status> each = testing::RunRanksEach(
      2,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto layers = Layers(2);
          PipelineStageOptions stage_options{.group = me.group};
          if (me.rank == 1) stage_options.input_shape = std::vector<int64_t>{-1, 16};
          EMBER_ASSIGN_OR_RETURN(
              auto stage,
              PipelineStage::create(Part(layers, me.rank, me.rank + 1), me.rank, 2, stage_options));
          EMBER_ASSIGN_OR_RETURN(auto schedule,
                                 ScheduleGPipe::create(stage, 2, {.loss_fn = Mse()}));
          const Batch b = StepBatch(0, 4);
          return schedule->step(me.rank == 0 ? b.x : Tensor(), me.rank == 1 ? b.y : Tensor())
              .status();
        });
      },
      options);
  ASSERT_EQ(each.size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(each[1])) << each[1];
  EXPECT_THAT(each[1].message(),
              HasSubstr("pipeline stage 1 expects its input as any dtype [-1, 16] but stage 0 "
                        "sent float32 [2, 8] for microbatch 0"));
  EXPECT_FALSE(each[0].ok());  // its gradient never comes
  EXPECT_THAT(
      each[0].message(),
      HasSubstr("pipeline receive of a gradient (stage 0, microbatch 0, from stage 1 on rank 1)"));
}

}  // namespace
}  // namespace ember::parallel
