// Join with DistributedDataParallel over real process groups: ranks are
// forked processes (distributed/testing/ranks.h) over tcp and gloo. Rank r
// trains on fewer or more batches than its peers; each rank checks itself
// against one process that trains, at every step, on the batches of the
// ranks that still had one.
#include "parallel/join.h"

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distributed/backend_registry.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/optim/sgd.h"
#include "parallel/comm_hooks.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/rank_testing.h"
#include "parallel/zero_redundancy_optimizer.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Describe;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Guard;

namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;

constexpr int64_t kInputs = 4;
constexpr int64_t kClasses = 3;
constexpr int64_t kPerRank = 4;  // rows of each rank's batch

// fc1 -> relu -> fc2 (-> + extra(h) when use_extra), times the buffer
// "scale".
class Net : public nn::Cloneable<Net> {
 public:
  Net() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kInputs, 8));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, kClasses));
    extra = register_module("extra", std::make_shared<nn::Linear>(8, kClasses));
    register_buffer("scale", ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*fc1)(x).relu();
    Tensor y = (*fc2)(h);
    if (use_extra) y = y + (*extra)(h);
    return y * buffer("scale");
  }
  bool use_extra = true;
  std::shared_ptr<nn::Linear> fc1, fc2, extra;
};

struct Batch {
  Tensor x, y;
};
// Rank `rank`'s batch at `step`, the same wherever it is made.
Batch RankBatch(int step, int rank) {
  Generator gen(5000 + 97 * step + rank);
  return {randn({kPerRank, kInputs}, {}, &gen), randint(0, kClasses, {kPerRank}, {}, &gen)};
}

absl::Status ExpectSameParameters(const nn::Module& a, const nn::Module& b, double tolerance) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const double diff = (pa[i].second - pb[i].second).abs().max().item<double>();
    if (!(diff <= tolerance)) {
      return absl::InternalError(absl::StrCat("parameter ", pa[i].first, " differs by ", diff,
                                              " from one process (tolerance ", tolerance, ")"));
    }
  }
  return absl::OkStatus();
}

struct Uneven {
  // Rank r trains on steps(r) batches.
  std::function<int(int rank, int world)> steps = [](int rank, int) { return 3 + rank; };
  JoinOptions join;
  DistributedDataParallelOptions ddp;
  // A communication hook for the DDP (none when null).
  std::function<CommHook()> hook;
  bool use_extra = true;
};

// Trains with Join on uneven inputs and checks the ranks against one
// process: at each step, the mean loss of each rank that still has a batch,
// summed and divided by the world size (or, without
// divide_by_initial_world_size, by the ranks still training); SGD lr 0.5.
// After join() every rank must hold the reference's parameters.
absl::Status TrainUneven(testing::Rank& me, const Uneven& config) {
  return Guard([&]() -> absl::Status {
    manual_seed(300 + me.rank);  // create() broadcasts rank 0's
    auto model = std::make_shared<Net>();
    model->use_extra = config.use_extra;
    DistributedDataParallelOptions options = config.ddp;
    options.process_group = me.group;
    EMBER_ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::create(model, options));
    if (config.hook) EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(config.hook()));
    auto reference = model->clone();
    nn::optim::SGD opt(ddp->parameters(), {.lr = 0.5});
    nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.5});
    const int mine = config.steps(me.rank, me.world_size);
    int longest = 0;
    for (int r = 0; r < me.world_size; ++r)
      longest = std::max(longest, config.steps(r, me.world_size));
    {
      EMBER_ASSIGN_OR_RETURN(auto join, Join::create({ddp}, config.join));
      for (int step = 0; step < mine; ++step) {
        const Batch local = RankBatch(step, me.rank);
        opt.zero_grad();
        nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
        opt.step();
      }
      EMBER_RETURN_IF_ERROR(join->join());
    }
    for (int step = 0; step < longest; ++step) {
      int active = 0;
      Tensor loss;
      for (int r = 0; r < me.world_size; ++r) {
        if (step >= config.steps(r, me.world_size)) continue;
        ++active;
        const Batch b = RankBatch(step, r);
        Tensor l = nn::functional::cross_entropy((*reference)(b.x), b.y);
        loss = loss.defined() ? loss + l : l;
      }
      const int divisor = config.join.divide_by_initial_world_size ? me.world_size : active;
      ref_opt.zero_grad();
      (loss / static_cast<double>(divisor)).backward();
      ref_opt.step();
    }
    return ExpectSameParameters(*model, *reference, 1e-5);
  });
}

class JoinTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  testing::RunRanksOptions RankOptions() const {
    testing::RunRanksOptions options;
    options.backend = backend();
    return options;
  }
  void ExpectUneven(const Uneven& config) {
    ExpectAllSucceeded(testing::RunRankProcesses(
        world(), [&](testing::Rank& me) { return TrainUneven(me, config); }, RankOptions()));
  }
};

TEST_P(JoinTest, UnevenInputsMatchOneProcessOnTheBatchesOfTheRanksStillTraining) {
  // Rank 0 stops first; several buckets, each shadowed by the joined ranks.
  ExpectUneven({.ddp = {.bucket_cap_mb = 0.0001}});
}

TEST_P(JoinTest, TheLastRankStopsFirstAndUnevenByMoreThanOneStep) {
  ExpectUneven({.steps = [](int rank, int world) { return 2 + 3 * (world - 1 - rank); }});
}

TEST_P(JoinTest, WithoutDivideByInitialWorldSizeGradientsAverageOverTheRanksStillTraining) {
  ExpectUneven({.join = {.divide_by_initial_world_size = false}});
}

TEST_P(JoinTest, EvenInputsNeedNoShadowing) {
  ExpectUneven({.steps = [](int, int) { return 3; }});
}

TEST_P(JoinTest, GradientAsBucketViewAndFindUnusedParameters) {
  // The joined ranks' buckets are their grad(), which the shadow fills with
  // the others' average; their zero "used" marks ride in the last bucket.
  ExpectUneven({.ddp = {.bucket_cap_mb = 0.0001,
                        .find_unused_parameters = true,
                        .gradient_as_bucket_view = true},
                .use_extra = false});
}

TEST_P(JoinTest, CommunicationHooksAreShadowedToo) {
  ExpectUneven(
      {.ddp = {.bucket_cap_mb = 0.0001}, .hook = [] { return comm_hooks::allreduce_hook(); }});
}

TEST_P(JoinTest, BuffersComeFromTheHighestRankStillTraining) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto model = std::make_shared<Net>();
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group}));
          const int steps = 2 + me.rank;
          EMBER_ASSIGN_OR_RETURN(auto join, ddp->join());
          for (int step = 0; step < steps; ++step) {
            // Every rank's own value; forward broadcasts the authority's.
            model->buffer("scale").fill_(10 * me.rank + step);
            const Batch local = RankBatch(step, me.rank);
            nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
            // Ranks 0..step-2 have joined: the highest rank is training.
            const double want = 10 * (me.world_size - 1) + step;
            const double got = model->buffer("scale").item<double>();
            if (got != want) {
              return absl::InternalError(absl::StrCat("step ", step, ": scale ", got, ", want ",
                                                      want, " (the highest rank's)"));
            }
          }
          EMBER_RETURN_IF_ERROR(join->join());
          // The post hook gives every rank the last joiner's buffers.
          const double last = 10 * (me.world_size - 1) + (2 + me.world_size - 1) - 1;
          const double got = model->buffer("scale").item<double>();
          if (got != last) {
            return absl::InternalError(
                absl::StrCat("after join: scale ", got, ", want the last joiner's ", last));
          }
          return absl::OkStatus();
        });
      },
      RankOptions()));
}

TEST_P(JoinTest, NoSyncIterationsAreNotShadowedAsBackwardPasses) {
  // Every other step under no_sync on every rank still training: the joined
  // ranks learn it from the forward's flag and issue no bucket reductions.
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto model = std::make_shared<Net>();
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group}));
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
          EMBER_ASSIGN_OR_RETURN(auto join, ddp->join());
          for (int step = 0; step < 2 * (1 + me.rank); ++step) {
            const Batch local = RankBatch(step, me.rank);
            if (step % 2 == 0) {
              auto guard = ddp->no_sync();
              nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
              continue;
            }
            nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
            opt.step();
            opt.zero_grad();
          }
          EMBER_RETURN_IF_ERROR(join->join());
          // Every rank holds the last joiner's parameters.
          std::vector<Tensor> flat;
          for (const Tensor& p : model->parameters()) flat.push_back(p.detach().flatten());
          Tensor mine = cat(flat), high = mine.clone(), low = mine.clone();
          EMBER_RETURN_IF_ERROR(
              testing::Finish(me.group->allreduce(high, {.op = distributed::ReduceOp::kMax})));
          EMBER_RETURN_IF_ERROR(
              testing::Finish(me.group->allreduce(low, {.op = distributed::ReduceOp::kMin})));
          const double spread = (high - low).abs().max().item<double>();
          if (spread != 0) return absl::InternalError(absl::StrCat("ranks differ by ", spread));
          return absl::OkStatus();
        });
      },
      RankOptions()));
}

TEST_P(JoinTest, ZeroRedundancyOptimizerStepsItsShareOnJoinedRanks) {
  // DDP and ZeRO (SGD with momentum) in one Join: a joined rank's share of
  // the parameters is still updated, with the others' averaged gradients,
  // so every rank ends as one process on the batches of the ranks training.
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          manual_seed(700 + me.rank);
          auto model = std::make_shared<Net>();
          EMBER_ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::create(
                                               model, {.process_group = me.group,
                                                       .bucket_cap_mb = 0.0001,
                                                       .find_unused_parameters = true}));
          model->use_extra = false;
          auto reference = model->clone();
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<ZeroRedundancyOptimizer> zero,
                                 ZeroRedundancyOptimizer::Create<nn::optim::SGD>(
                                     ddp->parameters(), {.lr = 0.5, .momentum = 0.9},
                                     {.process_group = me.group}));
          nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.5, .momentum = 0.9});
          const int mine = 2 + 2 * me.rank;
          {
            EMBER_ASSIGN_OR_RETURN(auto join, Join::create({ddp, zero}));
            for (int step = 0; step < mine; ++step) {
              const Batch local = RankBatch(step, me.rank);
              zero->zero_grad();
              nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
              EMBER_RETURN_IF_ERROR(zero->Step());
            }
            EMBER_RETURN_IF_ERROR(join->join());
          }
          for (int step = 0; step < 2 + 2 * (me.world_size - 1); ++step) {
            Tensor loss;
            for (int r = 0; r < me.world_size; ++r) {
              if (step >= 2 + 2 * r) continue;
              const Batch b = RankBatch(step, r);
              Tensor l = nn::functional::cross_entropy((*reference)(b.x), b.y);
              loss = loss.defined() ? loss + l : l;
            }
            ref_opt.zero_grad();
            (loss / static_cast<double>(me.world_size)).backward();
            ref_opt.step();
          }
          return ExpectSameParameters(*model, *reference, 1e-5);
        });
      },
      RankOptions()));
}

TEST_P(JoinTest, ThrowOnEarlyTerminationFailsEveryRank) {
  const std::vector<testing::ProcessResult> results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto model = std::make_shared<Net>();
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group}));
          EMBER_ASSIGN_OR_RETURN(auto join, ddp->join({.throw_on_early_termination = true}));
          const int steps = me.rank == 0 ? 2 : 5;
          for (int step = 0; step < steps; ++step) {
            const Batch local = RankBatch(step, me.rank);
            nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
          }
          return join->join();
        });
      },
      RankOptions());
  ASSERT_EQ(results.size(), static_cast<size_t>(world()));
  EXPECT_NE(results[0].exit_code, 0) << Describe(results);
  EXPECT_THAT(results[0].output, HasSubstr("Rank 0 exhausted all inputs.")) << Describe(results);
  for (int r = 1; r < world(); ++r) {
    EXPECT_NE(results[r].exit_code, 0) << Describe(results);
    EXPECT_THAT(results[r].output,
                HasSubstr("Detected at least one rank that exhausted inputs. Throwing across all "
                          "ranks."))
        << Describe(results);
    EXPECT_EQ(results[r].signal, 0) << Describe(results);
  }
}

TEST_P(JoinTest, DisabledJoinIssuesNothing) {
  // enable = false with even inputs: the ranks' collectives are DDP's own
  // (a stray all_reduce on one side would mismatch the next broadcast).
  ExpectUneven({.steps = [](int, int) { return 2; }, .join = {.enable = false}});
}

INSTANTIATE_TEST_SUITE_P(Backends, JoinTest,
                         ::testing::Combine(::testing::Values("tcp", "gloo"),
                                            ::testing::Values(2, 3)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_",
                                               std::get<1>(info.param), "ranks");
                         });

// A job of many ranks, each with its own number of steps.
TEST(JoinScaleTest, ThirtyTwoRanksWithFourDifferentLengths) {
  testing::RunRanksOptions options;
  options.backend = "tcp";
  options.timeout = absl::Seconds(120);
  ExpectAllSucceeded(testing::RunRankProcesses(
      32,
      [](testing::Rank& me) {
        return TrainUneven(me, {.steps = [](int rank, int) { return 1 + rank % 4; }});
      },
      options));
}

TEST(JoinErrorsTest, ArgumentsAreChecked) {
  absl::StatusOr<std::unique_ptr<Join>> empty = Join::create({});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("requires at least one joinable"));
  absl::StatusOr<std::unique_ptr<Join>> null = Join::create({nullptr});
  ASSERT_FALSE(null.ok());
  EXPECT_THAT(null.status().message(), HasSubstr("joinable 0 is null"));
}

TEST(JoinErrorsTest, JoinablesOfDifferentGroupsAreRefused) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      2,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          EMBER_ASSIGN_OR_RETURN(auto a, DistributedDataParallel::create(
                                             std::make_shared<Net>(), {.process_group = me.group}));
          // A second group over the same ranks.
          EMBER_ASSIGN_OR_RETURN(const distributed::BackendInfo* tcp,
                                 distributed::find_backend("tcp"));
          EMBER_ASSIGN_OR_RETURN(auto other, tcp->create({.store = me.store,
                                                          .store_prefix = "other/",
                                                          .rank = me.rank,
                                                          .size = me.world_size,
                                                          .timeout = absl::Seconds(20)}));
          EMBER_ASSIGN_OR_RETURN(auto b, DistributedDataParallel::create(std::make_shared<Net>(),
                                                                         {.process_group = other}));
          absl::StatusOr<std::unique_ptr<Join>> join = Join::create({a, b});
          if (join.ok() ||
              join.status().message().find("multiple process groups") == std::string::npos) {
            return absl::InternalError(absl::StrCat("got ", join.status().ToString()));
          }
          // The refused Join left the modules outside any join context.
          if (a->join_config().enable || b->join_config().enable) {
            return absl::InternalError("a refused Join enabled a joinable");
          }
          EMBER_ASSIGN_OR_RETURN(auto fine, a->join());
          if (!a->join_config().is_first_joinable) return absl::InternalError("not first");
          EMBER_RETURN_IF_ERROR(fine->join());
          const absl::Status twice = fine->join();
          if (twice.code() != absl::StatusCode::kFailedPrecondition) {
            return absl::InternalError(absl::StrCat("second join(): ", twice.ToString()));
          }
          fine.reset();
          if (a->join_config().enable) return absl::InternalError("config kept after ~Join");
          return absl::OkStatus();
        });
      },
      {}));
}

}  // namespace
}  // namespace ember::parallel
