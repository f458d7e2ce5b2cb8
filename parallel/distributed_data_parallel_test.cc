// DistributedDataParallel over a real process group: ranks are forked
// processes (distributed/testing/ranks.h) over the backends listed in
// kBackends. Each rank checks itself against one process training on the
// concatenated batch, computed locally from a clone of the broadcast model.
#include "parallel/distributed_data_parallel.h"

#include <signal.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distributed/mpi/mpirun.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/rank_testing.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Guard;
using ::ember::parallel::rank_testing::Describe;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;

namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;

// The backends DDP is tested on; a backend that registers itself joins by
// name (and by its target in BUILD.bazel).
// mpi's ranks are the processes of an mpirun job: DdpOverMpi starts one.
const std::vector<std::string> kBackends = {"tcp", "gloo", "mpi"};

constexpr int64_t kInputs = 4;
constexpr int64_t kClasses = 3;
constexpr int64_t kGlobalBatch = 12;  // divisible by 2 and 3 ranks

// fc1 -> relu -> fc2, plus a head that forward uses only when `use_extra`.
class Net : public nn::Cloneable<Net> {
 public:
  explicit Net(int64_t hidden = 8, bool with_extra = false)
      : hidden_(hidden), with_extra_(with_extra) {
    reset();
  }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kInputs, hidden_));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden_, kClasses));
    if (with_extra_)
      extra = register_module("extra", std::make_shared<nn::Linear>(hidden_, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*fc1)(x).relu();
    Tensor y = (*fc2)(h);
    return use_extra ? y + (*extra)(h) : y;
  }
  bool use_extra = false;
  std::shared_ptr<nn::Linear> fc1, fc2, extra;

 private:
  int64_t hidden_;
  bool with_extra_;
};

// A module with a buffer that forward reads.
class Scaled : public nn::Cloneable<Scaled> {
 public:
  Scaled() { reset(); }
  void reset() override {
    fc = register_module("fc", std::make_shared<nn::Linear>(kInputs, kClasses));
    register_buffer("scale", ones({1}));
  }
  Tensor forward(const Tensor& x) override { return (*fc)(x)*buffer("scale"); }
  std::shared_ptr<nn::Linear> fc;
};

struct Batch {
  Tensor x, y;
};
// The global batch of `step`, the same on every rank.
Batch GlobalBatch(int step) {
  Generator gen(1000 + step);
  return {randn({kGlobalBatch, kInputs}, {}, &gen), randint(0, kClasses, {kGlobalBatch}, {}, &gen)};
}
Batch Shard(const Batch& b, int rank, int world) {
  const int64_t n = kGlobalBatch / world;
  return {b.x.narrow(0, rank * n, n), b.y.narrow(0, rank * n, n)};
}

// OK when `a` and `b` hold the same parameter values within `tolerance`.
absl::Status ExpectSameParameters(const nn::Module& a, const nn::Module& b, double tolerance,
                                  const std::string& what) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  if (pa.size() != pb.size()) return absl::InternalError("parameter counts differ");
  for (size_t i = 0; i < pa.size(); ++i) {
    const double diff = (pa[i].second - pb[i].second).abs().max().item<double>();
    if (!(diff <= tolerance)) {
      return absl::InternalError(absl::StrCat(what, ": parameter ", pa[i].first, " differs by ",
                                              diff, " (tolerance ", tolerance, ")"));
    }
  }
  return absl::OkStatus();
}

// OK when `a` and `b` hold the same gradients within 1e-5.
absl::Status ExpectSameGradients(const nn::Module& a, const nn::Module& b,
                                 const std::string& what) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const double diff = (pa[i].second.grad() - pb[i].second.grad()).abs().max().item<double>();
    if (!(diff < 1e-5)) {
      return absl::InternalError(
          absl::StrCat(what, ": the gradient of ", pa[i].first, " differs by ", diff));
    }
  }
  return absl::OkStatus();
}

// OK when every rank holds exactly the same parameters.
absl::Status ExpectEqualAcrossRanks(distributed::ProcessGroup& group, const nn::Module& m) {
  std::vector<Tensor> pieces;
  for (const Tensor& p : m.parameters()) pieces.push_back(p.detach().flatten());
  Tensor mine = cat(pieces);
  Tensor high = mine.clone(), low = mine.clone();
  EMBER_RETURN_IF_ERROR(
      testing::Finish(group.allreduce(high, {.op = distributed::ReduceOp::kMax})));
  EMBER_RETURN_IF_ERROR(testing::Finish(group.allreduce(low, {.op = distributed::ReduceOp::kMin})));
  const double spread = (high - low).abs().max().item<double>();
  if (spread != 0) return absl::InternalError(absl::StrCat("ranks differ by ", spread));
  return absl::OkStatus();
}

class DdpTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    if (backend() == "mpi" && !testing::launched_job()) {
      GTEST_SKIP() << "runs inside the mpirun job that DdpOverMpi starts";
    }
  }
  std::string backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  testing::RunRanksOptions RankOptions() const {
    testing::RunRanksOptions options;
    options.backend = backend();
    return options;
  }
};

// Trains `steps` steps with DDP and, beside it, one process on the whole
// batch; both must end with the same parameters, and all ranks equal.
absl::Status TrainAndCompare(testing::Rank& me, DistributedDataParallelOptions options, int steps) {
  return Guard([&]() -> absl::Status {
    manual_seed(100 + me.rank);  // different on every rank: create() broadcasts rank 0's
    auto model = std::make_shared<Net>();
    options.process_group = me.group;
    EMBER_ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::create(model, options));
    auto reference = model->clone();
    nn::optim::SGD opt(ddp->parameters(), {.lr = 0.5});
    nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.5});
    for (int step = 0; step < steps; ++step) {
      const Batch global = GlobalBatch(step);
      const Batch local = Shard(global, me.rank, me.world_size);
      opt.zero_grad();
      nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
      opt.step();
      ref_opt.zero_grad();
      nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
      ref_opt.step();
    }
    EMBER_RETURN_IF_ERROR(ExpectSameParameters(*model, *reference, 1e-5, "DDP vs one process"));
    return ExpectEqualAcrossRanks(*me.group, *model);
  });
}

TEST_P(DdpTest, MatchesOneProcessOnTheConcatenatedBatch) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        // A tiny cap: several buckets, each launched during backward.
        return TrainAndCompare(me, {.bucket_cap_mb = 0.0001}, 4);
      },
      RankOptions()));
}

TEST_P(DdpTest, MatchesWithDefaultBucketsAndGradientAsBucketView) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(TrainAndCompare(me, {}, 3));
        return TrainAndCompare(me, {.bucket_cap_mb = 0.0001, .gradient_as_bucket_view = true}, 3);
      },
      RankOptions()));
}

TEST_P(DdpTest, NoSyncAccumulatesUntilTheNextSynchronisedBackward) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          manual_seed(7 + me.rank);
          auto model = std::make_shared<Net>();
          EMBER_ASSIGN_OR_RETURN(auto ddp,
                                 DistributedDataParallel::create(
                                     model, {.process_group = me.group, .bucket_cap_mb = 0.0001}));
          auto reference = model->clone();
          auto local_reference = model->clone();
          const Batch first = GlobalBatch(0), second = GlobalBatch(1);
          const Batch first_local = Shard(first, me.rank, me.world_size);
          {
            auto guard = ddp->no_sync();
            nn::functional::cross_entropy((*ddp)(first_local.x), first_local.y).backward();
          }
          // Under no_sync the gradient stays this rank's own.
          nn::functional::cross_entropy((*local_reference)(first_local.x), first_local.y)
              .backward();
          EMBER_RETURN_IF_ERROR(ExpectSameGradients(*model, *local_reference, "after no_sync"));
          const Batch second_local = Shard(second, me.rank, me.world_size);
          nn::functional::cross_entropy((*ddp)(second_local.x), second_local.y).backward();
          for (const Batch& b : {first, second}) {
            nn::functional::cross_entropy((*reference)(b.x), b.y).backward();
          }
          return ExpectSameGradients(*model, *reference, "after the synchronised backward");
        });
      },
      RankOptions()));
}

// One step of `model` wrapped in DDP with `options` on shard `rank`.
absl::Status Step(DistributedDataParallel& ddp, testing::Rank& me) {
  return Guard([&]() -> absl::Status {
    const Batch local = Shard(GlobalBatch(0), me.rank, me.world_size);
    nn::functional::cross_entropy(ddp(local.x), local.y).backward();
    return absl::OkStatus();
  });
}

TEST_P(DdpTest, UnusedParametersAreNamedWithoutFindUnusedParameters) {
  const auto results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        auto model = std::make_shared<Net>(8, /*with_extra=*/true);
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(model, {.process_group = me.group}));
        EMBER_RETURN_IF_ERROR(Step(*ddp, me));
        return absl::InternalError("backward succeeded with unused parameters");
      },
      RankOptions());
  for (int r = 0; r < world(); ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << Describe(results);
    EXPECT_THAT(results[r].output,
                HasSubstr(absl::StrCat("no gradient in this backward pass on rank ", r,
                                       ": extra.weight, extra.bias")));
    EXPECT_THAT(results[r].output, HasSubstr("find_unused_parameters = true"));
  }
}

TEST_P(DdpTest, FindUnusedParametersHandlesParametersSomeRanksDoNotUse) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          manual_seed(3);
          auto model = std::make_shared<Net>(8, /*with_extra=*/true);
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group,
                                                                .bucket_cap_mb = 0.0001,
                                                                .find_unused_parameters = true}));
          // Step 0: no rank uses `extra`; step 1: only rank 0 does.
          auto reference = model->clone();
          auto* ref = static_cast<Net*>(reference.get());
          for (int step = 0; step < 2; ++step) {
            model->use_extra = step == 1 && me.rank == 0;
            model->zero_grad();
            reference->zero_grad();
            const Batch global = GlobalBatch(step);
            const Batch local = Shard(global, me.rank, me.world_size);
            nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
            if (step == 0) {
              if (model->extra->parameter("weight").grad().defined()) {
                return absl::InternalError("a parameter no rank used got a gradient");
              }
              ref->use_extra = false;
              nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
              EMBER_RETURN_IF_ERROR(ExpectSameGradients(*model->fc1, *ref->fc1, "fc1"));
              EMBER_RETURN_IF_ERROR(ExpectSameGradients(*model->fc2, *ref->fc2, "fc2"));
            } else {
              // Only rank 0's shard used `extra`: its averaged gradient is
              // rank 0's gradient divided by the world size.
              ref->use_extra = true;
              const Batch shard0 = Shard(global, 0, me.world_size);
              nn::functional::cross_entropy((*reference)(shard0.x), shard0.y).backward();
              Tensor expected = ref->extra->parameter("weight").grad() / me.world_size;
              const double diff =
                  (model->extra->parameter("weight").grad() - expected).abs().max().item<double>();
              if (!(diff < 1e-5)) {
                return absl::InternalError(absl::StrCat("extra.weight grad differs by ", diff));
              }
            }
          }
          return absl::OkStatus();
        });
      },
      RankOptions()));
}

TEST_P(DdpTest, StaticGraphMatchesOneProcess) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(
            TrainAndCompare(me, {.bucket_cap_mb = 0.0001, .static_graph = true}, 4));
        return TrainAndCompare(
            me, {.bucket_cap_mb = 0.0001, .gradient_as_bucket_view = true, .static_graph = true},
            3);
      },
      RankOptions()));
}

TEST_P(DdpTest, StaticGraphFindsTheUnusedParametersInItsFirstIteration) {
  // No rank ever uses `extra`: without find_unused_parameters and with no
  // graph walk, static_graph learns it from the first iteration's counts.
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          manual_seed(4);
          auto model = std::make_shared<Net>(8, /*with_extra=*/true);
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group,
                                                                .bucket_cap_mb = 0.0001,
                                                                .static_graph = true}));
          auto reference = model->clone();
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.5});
          nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.5});
          for (int step = 0; step < 4; ++step) {
            const Batch global = GlobalBatch(step);
            const Batch local = Shard(global, me.rank, me.world_size);
            opt.zero_grad();
            nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
            if (model->extra->weight().grad().defined()) {
              return absl::InternalError(
                  absl::StrCat("step ", step, ": the unused extra.weight got a gradient"));
            }
            opt.step();
            ref_opt.zero_grad();
            nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
            ref_opt.step();
          }
          EMBER_RETURN_IF_ERROR(
              ExpectSameParameters(*model, *reference, 1e-5, "static graph vs one process"));
          return ExpectEqualAcrossRanks(*me.group, *model);
        });
      },
      RankOptions()));
}

TEST_P(DdpTest, StaticGraphRefusesAGraphThatChanges) {
  for (bool first_uses_extra : {false, true}) {
    const auto results = testing::RunRankProcesses(
        world(),
        [&](testing::Rank& me) {
          return Guard([&]() -> absl::Status {
            auto model = std::make_shared<Net>(8, /*with_extra=*/true);
            EMBER_ASSIGN_OR_RETURN(
                auto ddp, DistributedDataParallel::create(
                              model, {.process_group = me.group, .static_graph = true}));
            model->use_extra = first_uses_extra;
            EMBER_RETURN_IF_ERROR(Step(*ddp, me));
            model->use_extra = !first_uses_extra;
            EMBER_RETURN_IF_ERROR(Step(*ddp, me));
            return absl::InternalError("a changed graph was accepted");
          });
        },
        RankOptions());
    for (int r = 0; r < world(); ++r) {
      EXPECT_EQ(results[r].exit_code, 1) << Describe(results);
      EXPECT_THAT(results[r].output, HasSubstr("static_graph = true")) << Describe(results);
      EXPECT_THAT(results[r].output, HasSubstr("the graph is not static")) << Describe(results);
      EXPECT_THAT(results[r].output,
                  HasSubstr(first_uses_extra
                                ? "than in the first iteration: extra.weight (0 of 1), "
                                  "extra.bias (0 of 1)"
                                : "parameter 'extra."))
          << Describe(results);
    }
  }
}

TEST_P(DdpTest, RanksThatDisagreeOnUsedParametersFailInsteadOfHanging) {
  const auto results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        auto model = std::make_shared<Net>(8, /*with_extra=*/true);
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(
                                   model, {.process_group = me.group, .bucket_cap_mb = 0.0001}));
        model->use_extra = me.rank != 0;  // rank 0 leaves `extra` out
        EMBER_RETURN_IF_ERROR(Step(*ddp, me));
        return absl::InternalError("backward succeeded");
      },
      RankOptions());
  EXPECT_EQ(results[0].exit_code, 1) << Describe(results);
  EXPECT_THAT(results[0].output,
              HasSubstr("no gradient in this backward pass on rank 0: extra.weight, extra.bias"));
  for (int r = 1; r < world(); ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << Describe(results);
    EXPECT_THAT(
        results[r].output,
        HasSubstr(absl::StrCat("1 of ", world(), " ranks got no gradient for some parameters")));
  }
}

TEST_P(DdpTest, MismatchedModelsFailNamingTheFirstDifference) {
  const auto results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        auto model = std::make_shared<Net>(me.rank == 1 ? 6 : 5);
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(model, {.process_group = me.group}));
        return absl::InternalError("create succeeded");
      },
      RankOptions());
  for (int r = 0; r < world(); ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << Describe(results);
    EXPECT_THAT(results[r].output,
                HasSubstr("INVALID_ARGUMENT: DistributedDataParallel: the model differs across "
                          "ranks: parameter 'fc1.weight' (parameter 0) is float32 [6, 4] on rank "
                          "1 but float32 [5, 4] on rank 0"));
  }
}

TEST_P(DdpTest, AKilledRankMakesTheOthersFailWithinTheTimeout) {
  if (backend() == "mpi") GTEST_SKIP() << "mpirun ends the whole job when a rank dies";
  testing::RunRanksOptions options = RankOptions();
  options.timeout = absl::Seconds(10);
  const auto results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        auto model = std::make_shared<Net>();
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(
                                   model, {.process_group = me.group, .bucket_cap_mb = 0.0001}));
        EMBER_RETURN_IF_ERROR(Step(*ddp, me));
        const Batch local = Shard(GlobalBatch(1), me.rank, me.world_size);
        return Guard([&]() -> absl::Status {
          Tensor loss = nn::functional::cross_entropy((*ddp)(local.x), local.y);
          if (me.rank == 1) raise(SIGKILL);  // mid-step: after forward
          loss.backward();
          return absl::InternalError("backward succeeded without rank 1");
        });
      },
      options, /*wait=*/absl::Seconds(60));
  EXPECT_EQ(results[1].signal, SIGKILL) << Describe(results);
  for (int r = 0; r < world(); ++r) {
    if (r == 1) continue;
    // Failed by itself (exit 1), not killed by the harness after the wait.
    EXPECT_EQ(results[r].exit_code, 1) << Describe(results);
    EXPECT_EQ(results[r].signal, 0) << Describe(results);
    EXPECT_THAT(results[r].output, HasSubstr("DistributedDataParallel: the gradient all_reduce"));
    EXPECT_THAT(results[r].output, HasSubstr("rank 1"));
  }
}

TEST_P(DdpTest, BuffersAreBroadcastFromRankZeroAtEveryForward) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          for (bool broadcast : {true, false}) {
            auto model = std::make_shared<Scaled>();
            EMBER_ASSIGN_OR_RETURN(
                auto ddp, DistributedDataParallel::create(
                              model, {.process_group = me.group, .broadcast_buffers = broadcast}));
            model->buffer("scale").fill_(me.rank + 2);
            const Batch local = Shard(GlobalBatch(0), me.rank, me.world_size);
            nn::functional::cross_entropy((*ddp)(local.x), local.y).backward();
            const double scale = model->buffer("scale").item<double>();
            const double expected = broadcast ? 2 : me.rank + 2;
            if (scale != expected) {
              return absl::InternalError(absl::StrCat(
                  "broadcast_buffers=", broadcast, ": scale is ", scale, ", expected ", expected));
            }
          }
          return absl::OkStatus();
        });
      },
      RankOptions()));
}

TEST_P(DdpTest, BucketsFollowReverseParameterOrderAndTheCap) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        // fc1.weight 128 bytes, fc1.bias 32, fc2.weight 96, fc2.bias 12; a
        // 104-byte cap closes a bucket at fc2.weight and one at fc1.weight.
        EMBER_ASSIGN_OR_RETURN(
            auto small, DistributedDataParallel::create(
                            std::make_shared<Net>(),
                            {.process_group = me.group, .bucket_cap_mb = 104.0 / (1 << 20)}));
        EMBER_ASSIGN_OR_RETURN(auto big, DistributedDataParallel::create(
                                             std::make_shared<Net>(), {.process_group = me.group}));
        const std::vector<int64_t> small_buckets = small->get_ddp_logging_data().bucket_bytes;
        const std::vector<int64_t> big_buckets = big->get_ddp_logging_data().bucket_bytes;
        if (small_buckets != std::vector<int64_t>{108, 160} ||
            big_buckets != std::vector<int64_t>{268}) {
          return absl::InternalError(absl::StrCat("buckets: ", absl::StrJoin(small_buckets, ","),
                                                  " and ", absl::StrJoin(big_buckets, ",")));
        }
        return absl::OkStatus();
      },
      RankOptions()));
}

TEST_P(DdpTest, CheckpointIsThePlainModulesStateDict) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        manual_seed(me.rank);
        auto model = std::make_shared<Net>();
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(model, {.process_group = me.group}));
        std::vector<std::string> plain, wrapped;
        for (const auto& [key, value] : ddp->module()->state_dict()) plain.push_back(key);
        for (const auto& [key, value] : ddp->state_dict()) wrapped.push_back(key);
        if (absl::StrJoin(plain, ",") != "fc1.weight,fc1.bias,fc2.weight,fc2.bias" ||
            absl::StrJoin(wrapped, ",") !=
                "module.fc1.weight,module.fc1.bias,module.fc2.weight,module.fc2.bias") {
          return absl::InternalError(absl::StrCat("keys: ", absl::StrJoin(plain, ","), " and ",
                                                  absl::StrJoin(wrapped, ",")));
        }
        Net fresh;
        EMBER_RETURN_IF_ERROR(fresh.load_state_dict(ddp->module()->state_dict()));
        return ExpectSameParameters(fresh, *model, 0, "loaded checkpoint");
      },
      RankOptions()));
}

TEST(DdpCreateTest, RefusesBadArguments) {
  const auto results = testing::RunRankProcesses(
      1,
      [](testing::Rank& me) -> absl::Status {
        std::vector<std::string> errors;
        auto record = [&](const auto& result) {
          errors.push_back(std::string(result.status().message()));
        };
        record(DistributedDataParallel::create(nullptr, {.process_group = me.group}));
        record(DistributedDataParallel::create(std::make_shared<Net>(),
                                               {.process_group = me.group, .bucket_cap_mb = 0}));
        auto frozen = std::make_shared<Net>();
        for (const Tensor& p : frozen->parameters()) p.requires_grad_(false);
        record(DistributedDataParallel::create(frozen, {.process_group = me.group}));
        record(DistributedDataParallel::create(std::make_shared<Net>()));
        record(DistributedDataParallel::create(
            std::make_shared<Net>(),
            {.device_ids = {Device(DeviceType::kCUDA, 1)}, .process_group = me.group}));
        return absl::InternalError(absl::StrJoin(errors, "\n"));
      },
      {});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_THAT(results[0].output, HasSubstr("DistributedDataParallel: the module is null"));
  EXPECT_THAT(results[0].output, HasSubstr("bucket_cap_mb must be positive, got 0"));
  EXPECT_THAT(results[0].output,
              HasSubstr("DistributedDataParallel is not needed when a module doesn't have any "
                        "parameter that requires a gradient (Net has 4 parameters"));
  EXPECT_THAT(results[0].output,
              HasSubstr("call init_process_group first or pass options.process_group"));
  EXPECT_THAT(results[0].output,
              HasSubstr("device_ids and output_device only work with a module on one GPU, but "
                        "got device_ids [cuda:1], output_device unset for a module on cpu"));
}

// Runs the mpi cases of DdpTest as the 3 processes of an mpirun job (the
// 2-rank cases over its first two).
TEST(DdpOverMpi, PassesUnderMpirun) {
  if (testing::launched_job()) GTEST_SKIP() << "already inside the mpirun job";
  distributed::mpi::MpirunResult job =
      distributed::mpi::RunThisTestUnderMpirun(3, "Backends/DdpTest.*/mpi_*");
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_FALSE(job.timed_out) << job.output;
  EXPECT_THAT(job.output, HasSubstr("[  PASSED  ]")) << job.output;
}

INSTANTIATE_TEST_SUITE_P(
    Backends, DdpTest, ::testing::Combine(::testing::ValuesIn(kBackends), ::testing::Values(2, 3)),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param), "ranks");
    });

}  // namespace
}  // namespace ember::parallel
