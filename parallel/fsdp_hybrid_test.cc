// FullyShardedDataParallel's hybrid strategies (HYBRID_SHARD,
// _HYBRID_SHARD_ZERO2) and CPU offload over real process groups: ranks are
// forked processes (distributed/testing/ranks.h) that join one job with
// init_process_group, so that the shard and replicate groups are real
// new_group groups of its default group. Each rank trains the MLP sharded
// and, beside it, as one process on the whole batch; the parameters must
// agree. The last tests train PyTorch 2.x's FSDP HYBRID_SHARD on the same
// model and batches (testdata/torch_fsdp_hybrid.py) and compare.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/testing/peers.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/clip_grad.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/rank_testing.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Guard;
using ::ember::parallel::rank_testing::Describe;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Get;

namespace dist = ::ember::distributed;
namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kInputs = 6;
constexpr int64_t kClasses = 3;
constexpr int64_t kGlobalBatch = 12;  // divisible by 4 and 6 ranks
// Note [Tolerance against one process] in fully_sharded_data_parallel_test.cc.
constexpr double kVsOneProcess = 1e-6;

// fc1 (35 parameters) -> relu -> fc2 (42) -> relu -> fc3 (24, the root unit);
// torch_fsdp_hybrid.py's model.
class Mlp : public nn::Cloneable<Mlp> {
 public:
  Mlp() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kInputs, 5));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(5, 7));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(7, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    return (*fc3)((*fc2)((*fc1)(x).relu()).relu());
  }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
};

std::shared_ptr<Mlp> Make() {
  manual_seed(0);
  return std::make_shared<Mlp>();
}

struct Batch {
  Tensor x, y;
};
Batch GlobalBatch(int step) {
  Generator gen(2000 + step);
  return {randn({kGlobalBatch, kInputs}, {}, &gen), randint(0, kClasses, {kGlobalBatch}, {}, &gen)};
}
Batch Shard(const Batch& b, int rank, int world) {
  const int64_t n = kGlobalBatch / world;
  return {b.x.narrow(0, rank * n, n), b.y.narrow(0, rank * n, n)};
}

// The largest |a - b| relative to the largest |b|, over every parameter of
// `reference` found in `state`.
absl::StatusOr<double> RelativeDifference(const ember::StateDict& state,
                                          const nn::Module& reference) {
  std::unordered_map<std::string, Tensor> by_name(state.begin(), state.end());
  double worst = 0;
  for (const auto& [name, p] : reference.named_parameters()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return absl::InternalError(absl::StrCat("no '", name, "'"));
    const double scale = std::max(p.detach().abs().max().item<double>(), 1e-30);
    const double diff = (it->second.to(kFloat32) - p.detach()).abs().max().item<double>();
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// Runs `body` on `world` processes that have joined one job over `backend`
// (the default group), and destroys the job after.
std::vector<testing::ProcessResult> RunJob(int world, const std::string& backend,
                                           const std::function<absl::Status(testing::Rank&)>& body) {
  testing::RunRanksOptions options;
  options.make_group = false;
  return testing::RunRankProcesses(
      world,
      [&](testing::Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(dist::init_process_group(
            {.backend = backend,
             .init_method = absl::StrCat("file://", me.temp_dir, "/store"),
             .world_size = me.world_size,
             .rank = me.rank,
             .timeout = absl::Seconds(60)}));
        absl::Status status = Guard([&] { return body(me); });
        const absl::Status destroyed = dist::destroy_process_group();
        return status.ok() ? destroyed : status;
      },
      options, absl::Seconds(240));
}

// The flat shard sizes of the MLP's units (root fc3: 24, fc1: 35, fc2: 42)
// for a shard group of `shards` ranks, root first: ceil(numel / shards).
std::vector<int64_t> ExpectedShardSizes(int shards) {
  if (shards == 2) return {12, 18, 21};
  if (shards == 3) return {8, 12, 14};
  return {};
}

struct Layout {
  int world;
  int shards;  // ranks per shard group; world / shards replicas
  std::string backend;
  ShardingStrategy strategy;
};

std::string LayoutName(const Layout& l) {
  return absl::StrCat(l.backend, "_", l.world, "ranks_", l.shards, "shards_x_",
                      l.world / l.shards, "replicas_",
                      l.strategy == ShardingStrategy::kHybridShard ? "HybridShard"
                                                                   : "HybridShardZero2");
}

class FsdpHybridTest : public ::testing::TestWithParam<Layout> {};

// 4 SGD steps (momentum) with clip_grad_norm_ each step, sharded in the
// groups create() makes from the default group, against one process on the
// whole batch that clips the same way.
TEST_P(FsdpHybridTest, MatchesOneProcessWithClippingAndTheShardSizes) {
  const Layout layout = GetParam();
  const auto results = RunJob(layout.world, layout.backend, [&](testing::Rank& me) -> absl::Status {
    auto model = Make();
    auto reference = Make();
    EMBER_ASSIGN_OR_RETURN(auto fsdp, fully_shard(model, {.sharding_strategy = layout.strategy,
                                                          .units = {model->fc1, model->fc2},
                                                          .forward_prefetch = true,
                                                          .shard_group_size = layout.shards}));
    const int replicas = layout.world / layout.shards;
    // Shard groups are blocks of consecutive ranks; replicate groups stride.
    if (fsdp->process_group()->size() != layout.shards ||
        fsdp->process_group()->rank() != me.rank % layout.shards ||
        fsdp->replicate_group() == nullptr || fsdp->replicate_group()->size() != replicas ||
        fsdp->replicate_group()->rank() != me.rank / layout.shards) {
      return absl::InternalError(absl::StrCat(
          "rank ", me.rank, ": shard group rank ", fsdp->process_group()->rank(), " of ",
          fsdp->process_group()->size(), ", replicate group rank ",
          fsdp->replicate_group() ? fsdp->replicate_group()->rank() : -1));
    }
    const std::vector<int64_t> want = ExpectedShardSizes(layout.shards);
    std::vector<int64_t> got;
    for (const FlatParamInfo& info : fsdp->flat_param_infos()) {
      got.push_back(info.shard_numel);
      if (info.shard_offset != (me.rank % layout.shards) * info.shard_numel) {
        return absl::InternalError(absl::StrCat("unit '", info.module_name, "' shard offset ",
                                                info.shard_offset));
      }
    }
    if (got != want) {
      return absl::InternalError(absl::StrCat("shard sizes [", absl::StrJoin(got, ", "),
                                              "], expected [", absl::StrJoin(want, ", "), "]"));
    }
    nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
    nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 4; ++step) {
      const Batch global = GlobalBatch(step);
      const Batch local = Shard(global, me.rank, me.world_size);
      opt.zero_grad();
      nn::functional::cross_entropy((*fsdp)(local.x), local.y).backward();
      const double norm = fsdp->clip_grad_norm_(0.05).item<double>();
      opt.step();
      ref_opt.zero_grad();
      nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
      const double expected = nn::clip_grad_norm_(reference->parameters(), 0.05).item<double>();
      ref_opt.step();
      if (!(std::abs(norm - expected) <= 1e-6 * expected) || !(expected > 0.05)) {
        return absl::InternalError(absl::StrCat("step ", step, ": norm ", norm,
                                                ", one process's ", expected,
                                                " (must be above 0.05)"));
      }
    }
    EMBER_ASSIGN_OR_RETURN(ember::StateDict state, fsdp->full_state_dict());
    EMBER_ASSIGN_OR_RETURN(double diff, RelativeDifference(state, *reference));
    std::fprintf(stderr, "%s rank %d: relative difference vs one process %.3g\n",
                 LayoutName(layout).c_str(), me.rank, diff);
    if (!(diff <= kVsOneProcess)) {
      return absl::InternalError(absl::StrCat("after 4 steps the parameters differ from one "
                                              "process's by ",
                                              diff, " (relative)"));
    }
    return absl::OkStatus();
  });
  ExpectAllSucceeded(results);
  // The measured differences, for the record (parallel/README.md).
  for (const testing::ProcessResult& r : results) std::printf("%s", r.output.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, FsdpHybridTest,
    ::testing::Values(Layout{4, 2, "gloo", ShardingStrategy::kHybridShard},
                      Layout{4, 2, "tcp", ShardingStrategy::kHybridShard},
                      Layout{6, 3, "gloo", ShardingStrategy::kHybridShard},
                      Layout{6, 2, "tcp", ShardingStrategy::kHybridShard},
                      Layout{6, 3, "tcp", ShardingStrategy::kHybridShardZero2},
                      Layout{4, 2, "gloo", ShardingStrategy::kHybridShardZero2}),
    [](const auto& info) { return LayoutName(info.param); });

// Groups given as hybrid_process_groups (torch's process_group=(intra,
// inter)), here shard groups {0, 2}, {1, 3} and replicate groups {0, 1},
// {2, 3}: any 2-D layout, not only consecutive blocks.
TEST(FsdpHybridGroupsTest, GivenGroupsInAnyTwoDimensionalLayout) {
  ExpectAllSucceeded(RunJob(4, "gloo", [](testing::Rank& me) -> absl::Status {
    std::vector<dist::Group> shard_groups, replicate_groups;
    for (std::vector<int> ranks : {std::vector<int>{0, 2}, std::vector<int>{1, 3}}) {
      EMBER_ASSIGN_OR_RETURN(dist::Group g, dist::new_group(ranks));
      shard_groups.push_back(g);
    }
    for (std::vector<int> ranks : {std::vector<int>{0, 1}, std::vector<int>{2, 3}}) {
      EMBER_ASSIGN_OR_RETURN(dist::Group g, dist::new_group(ranks));
      replicate_groups.push_back(g);
    }
    auto model = Make();
    auto reference = Make();
    EMBER_ASSIGN_OR_RETURN(
        auto fsdp, fully_shard(model, {.sharding_strategy = ShardingStrategy::kHybridShard,
                                       .units = {model->fc1, model->fc2},
                                       .hybrid_process_groups = {
                                           .shard = shard_groups[me.rank % 2],
                                           .replicate = replicate_groups[me.rank / 2]}}));
    nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
    nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 3; ++step) {
      const Batch global = GlobalBatch(step);
      const Batch local = Shard(global, me.rank, me.world_size);
      opt.zero_grad();
      nn::functional::cross_entropy((*fsdp)(local.x), local.y).backward();
      opt.step();
      ref_opt.zero_grad();
      nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
      ref_opt.step();
    }
    EMBER_ASSIGN_OR_RETURN(ember::StateDict state, fsdp->full_state_dict());
    EMBER_ASSIGN_OR_RETURN(double diff, RelativeDifference(state, *reference));
    if (!(diff <= kVsOneProcess)) {
      return absl::InternalError(absl::StrCat("relative difference ", diff));
    }
    return absl::OkStatus();
  }));
}

// sync_module_states reaches every rank of the world, not only the shard
// group: each rank starts from its own values; all end with rank 0's.
TEST(FsdpHybridGroupsTest, SyncModuleStatesBroadcastsRankZerosValuesOverTheWorld) {
  ExpectAllSucceeded(RunJob(6, "tcp", [](testing::Rank& me) -> absl::Status {
    manual_seed(10 + me.rank);
    auto model = std::make_shared<Mlp>();
    EMBER_ASSIGN_OR_RETURN(
        auto fsdp, fully_shard(model, {.sharding_strategy = ShardingStrategy::kHybridShard,
                                       .units = {model->fc1},
                                       .shard_group_size = 3}));
    EMBER_ASSIGN_OR_RETURN(ember::StateDict state, fsdp->full_state_dict());
    manual_seed(10);
    Mlp rank0;
    EMBER_ASSIGN_OR_RETURN(double diff, RelativeDifference(state, rank0));
    if (diff != 0) return absl::InternalError(absl::StrCat("not rank 0's values: ", diff));
    return absl::OkStatus();
  }));
}

// The default layout from LOCAL_WORLD_SIZE (the launcher's), and
// device_mesh_shape {replicas, shards}.
TEST(FsdpHybridGroupsTest, LayoutFromLocalWorldSizeAndFromTheMeshShape) {
  ExpectAllSucceeded(RunJob(4, "tcp", [](testing::Rank& me) -> absl::Status {
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    auto model = Make();
    EMBER_ASSIGN_OR_RETURN(auto from_env,
                           fully_shard(model, {.sharding_strategy = ShardingStrategy::kHybridShard}));
    unsetenv("LOCAL_WORLD_SIZE");
    auto other = Make();
    EMBER_ASSIGN_OR_RETURN(auto from_mesh,
                           fully_shard(other, {.sharding_strategy = ShardingStrategy::kHybridShard,
                                               .device_mesh_shape = {4, 1}}));
    if (from_env->process_group()->size() != 2 || from_env->replicate_group()->size() != 2 ||
        from_mesh->process_group()->size() != 1 || from_mesh->replicate_group()->size() != 4) {
      return absl::InternalError(absl::StrCat(
          "rank ", me.rank, ": LOCAL_WORLD_SIZE=2 gave ", from_env->process_group()->size(), "x",
          from_env->replicate_group()->size(), ", mesh {4, 1} gave ",
          from_mesh->process_group()->size(), "x", from_mesh->replicate_group()->size()));
    }
    // One unit, all 101 parameters: 51 per rank in shard groups of 2, all of
    // them in shard groups of 1.
    if (from_env->flat_param_infos()[0].shard_numel != 51 ||
        from_mesh->flat_param_infos()[0].shard_numel != 101) {
      return absl::InternalError("shard sizes");
    }
    return absl::OkStatus();
  }));
}

// Every refusal, on every rank of one 4-rank job; each message names the
// values involved.
TEST(FsdpHybridGroupsTest, RefusesBadLayoutsNamingTheValues) {
  std::vector<testing::ProcessResult> results = RunJob(4, "tcp", [](testing::Rank& me) {
    unsetenv("LOCAL_WORLD_SIZE");
    std::vector<std::string> errors;
    auto record = [&](const absl::StatusOr<std::shared_ptr<FullyShardedDataParallel>>& made) {
      errors.push_back(made.ok() ? "accepted" : std::string(made.status().message()));
    };
    const ShardingStrategy hybrid = ShardingStrategy::kHybridShard;
    record(fully_shard(Make(), {.sharding_strategy = hybrid, .shard_group_size = 3}));
    record(fully_shard(Make(), {.sharding_strategy = hybrid}));
    record(fully_shard(Make(), {.sharding_strategy = hybrid, .device_mesh_shape = {4}}));
    record(fully_shard(Make(), {.sharding_strategy = hybrid, .device_mesh_shape = {2, 3}}));
    record(fully_shard(Make(), {.sharding_strategy = hybrid, .shard_group_size = 2,
                                .device_mesh_shape = {1, 4}}));
    record(fully_shard(Make(), {.sharding_strategy = ShardingStrategy::kFullShard,
                                .shard_group_size = 2}));
    absl::StatusOr<dist::Group> world = dist::get_default_group();
    if (!world.ok()) return world.status();
    record(fully_shard(Make(), {.process_group = *world, .sharding_strategy = hybrid}));
    // Shard groups {0, 1}, {2, 3} with groups of one rank as replicate
    // groups: 2 x 1 ranks do not cover the world of 4.
    std::vector<dist::Group> blocks, singles, crossed;
    for (std::vector<int> ranks : {std::vector<int>{0, 1}, std::vector<int>{2, 3}}) {
      blocks.push_back(*dist::new_group(ranks));
    }
    for (int r = 0; r < 4; ++r) singles.push_back(*dist::new_group({r}));
    record(fully_shard(Make(), {.sharding_strategy = hybrid,
                                .hybrid_process_groups = {.shard = blocks[me.rank / 2],
                                                          .replicate = singles[me.rank]}}));
    // Replicate groups {0, 3} and {1, 2}: rank 0 holds shard 0 of its shard
    // group, rank 3 shard 1, so they do not hold the same shard.
    for (std::vector<int> ranks : {std::vector<int>{0, 3}, std::vector<int>{1, 2}}) {
      crossed.push_back(*dist::new_group(ranks));
    }
    const int crossed_index = (me.rank == 0 || me.rank == 3) ? 0 : 1;
    record(fully_shard(Make(), {.sharding_strategy = hybrid,
                                .hybrid_process_groups = {.shard = blocks[me.rank / 2],
                                                          .replicate = crossed[crossed_index]}}));
    record(fully_shard(Make(), {.sharding_strategy = hybrid,
                                .hybrid_process_groups = {.shard = blocks[me.rank / 2]}}));
    return absl::InternalError(absl::StrJoin(errors, "\n"));
  });
  ASSERT_EQ(results.size(), 4u);
  for (const testing::ProcessResult& r : results) {
    const std::string& out = r.output;
    EXPECT_THAT(out, HasSubstr("the world size 4 is not divisible by the shard group size 3 "
                               "(shard_group_size)"));
    EXPECT_THAT(out, HasSubstr("HYBRID_SHARD needs its two groups: pass "
                               "options.hybrid_process_groups, shard_group_size or "
                               "device_mesh_shape, or run under the launcher (which sets "
                               "LOCAL_WORLD_SIZE)"));
    EXPECT_THAT(out, HasSubstr("device_mesh_shape must be 2-D {replicas, shards} for "
                               "HYBRID_SHARD, got 1 dimensions [4]"));
    EXPECT_THAT(out, HasSubstr("device_mesh_shape [2, 3] holds 6 ranks but the world size is 4"));
    EXPECT_THAT(out, HasSubstr("shard_group_size 2 disagrees with device_mesh_shape [1, 4]"));
    EXPECT_THAT(out, HasSubstr("are for HYBRID_SHARD and _HYBRID_SHARD_ZERO2, but the strategy "
                               "is FULL_SHARD"));
    EXPECT_THAT(out, HasSubstr("pass both as options.hybrid_process_groups {shard, replicate}"));
    EXPECT_THAT(out, HasSubstr("the shard group (2 ranks) times the replicate group (1 ranks) is "
                               "2 ranks, but the world size is 4"));
    EXPECT_THAT(out, HasSubstr("hybrid_process_groups has a shard group but no replicate group"));
    EXPECT_THAT(out, Not(HasSubstr("accepted"))) << out;
  }
  // The crossed replicate groups: each names the shard ranks its members hold.
  for (const testing::ProcessResult& r : {results[0], results[3]}) {
    EXPECT_THAT(r.output, HasSubstr("the members of this rank's replicate group hold shard group "
                                    "ranks [0, 1]; every member of a replicate group must hold "
                                    "the same shard"))
        << r.output;
  }
  for (const testing::ProcessResult& r : {results[1], results[2]}) {
    EXPECT_THAT(r.output, HasSubstr("replicate group hold shard group ranks [1, 0]")) << r.output;
  }
}

// CPU offload of a module on the CPU: accepted, a no-op in placement (the
// shards and gradients are on the CPU already, in ordinary memory: pinned
// memory is for copies to a device), and training is unchanged.
TEST(FsdpCpuOffloadTest, OnTheCpuIsAcceptedAndTrainsAsWithout) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard,
                                    ShardingStrategy::kHybridShard}) {
    ExpectAllSucceeded(RunJob(4, "gloo", [strategy](testing::Rank& me) -> absl::Status {
      auto model = Make();
      auto reference = Make();
      FullyShardOptions options{.sharding_strategy = strategy,
                                .units = {model->fc1, model->fc2},
                                .cpu_offload = {.offload_params = true}};
      if (is_hybrid_strategy(strategy)) options.shard_group_size = 2;
      EMBER_ASSIGN_OR_RETURN(auto fsdp, fully_shard(model, options));
      for (const Tensor& flat : fsdp->parameters()) {
        if (!flat.is_cpu() || flat.is_pinned()) {
          return absl::InternalError(absl::StrCat("a flat shard is on ", flat.device().str(),
                                                  flat.is_pinned() ? ", pinned" : ""));
        }
      }
      nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
      nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
      for (int step = 0; step < 3; ++step) {
        const Batch global = GlobalBatch(step);
        const Batch local = Shard(global, me.rank, me.world_size);
        opt.zero_grad();
        nn::functional::cross_entropy((*fsdp)(local.x), local.y).backward();
        for (const Tensor& flat : fsdp->parameters()) {
          if (!flat.grad().defined() || !flat.grad().is_cpu()) {
            return absl::InternalError("a flat gradient is missing or not on the CPU");
          }
        }
        opt.step();
        ref_opt.zero_grad();
        nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
        ref_opt.step();
      }
      EMBER_ASSIGN_OR_RETURN(ember::StateDict state, fsdp->full_state_dict());
      EMBER_ASSIGN_OR_RETURN(double diff, RelativeDifference(state, *reference));
      if (!(diff <= kVsOneProcess)) {
        return absl::InternalError(absl::StrCat(sharding_strategy_name(strategy),
                                                " with cpu_offload: relative difference ", diff));
      }
      return absl::OkStatus();
    }));
  }
}

// --- Against PyTorch 2.x's FSDP HYBRID_SHARD on the CPU over gloo ----------

// torch's run, once per test binary.
const rank_testing::TorchRun& Torch() {
  return rank_testing::RunTorchOnce("parallel/testdata/torch_fsdp_hybrid.py", "torch_fsdp_hybrid");
}

class TorchHybridTest : public ::testing::TestWithParam<ShardingStrategy> {
 protected:
  void SetUp() override {
    const rank_testing::TorchRun& run = Torch();
    if (absl::IsNotFound(run.status)) GTEST_SKIP() << run.status.message();
    ASSERT_TRUE(run.status.ok()) << run.status;
  }
};

// The same 2x2 layout, model, start and batches as torch: the final
// parameters and the shard sizes must equal torch's. The two sides' CPU
// matmuls (torch: MKL or its own kernels, Ember: OpenBLAS) round
// differently, so they agree to a few float32 ulps per step, not bit for bit.
TEST_P(TorchHybridTest, MatchesTorchHybridShard) {
  const ShardingStrategy strategy = GetParam();
  const std::string name = strategy == ShardingStrategy::kHybridShard ? "hybrid" : "hybrid_zero2";
  const std::string dir = Torch().dir;
  absl::StatusOr<StateDict> theirs = load(absl::StrCat(dir, "/final_", name, ".pt"));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  absl::StatusOr<StateDict> shards = load(absl::StrCat(dir, "/shards_", name, ".pt"));
  ASSERT_TRUE(shards.ok()) << shards.status();
  const Tensor sizes = Get(*shards, "sizes");
  ASSERT_TRUE(sizes.defined());
  std::vector<int64_t> torch_sizes;
  for (int64_t i = 0; i < sizes.numel(); ++i) torch_sizes.push_back(sizes[i].item<int64_t>());
  EXPECT_EQ(torch_sizes, (std::vector<int64_t>{12, 18, 21}));
  const std::string out_path = absl::StrCat(dir, "/ember_", name, ".pt");
  ExpectAllSucceeded(RunJob(4, "gloo", [&](testing::Rank& me) -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(const StateDict init, load(dir + "/init.pt"));
    EMBER_ASSIGN_OR_RETURN(const StateDict data, load(dir + "/data.pt"));
    const Tensor xs = Get(data, "x"), ys = Get(data, "y");
    if (!xs.defined() || !ys.defined()) return absl::InternalError("data.pt has no x or y");
    auto model = std::make_shared<Mlp>();
    EMBER_RETURN_IF_ERROR(model->load_state_dict(init));
    EMBER_ASSIGN_OR_RETURN(auto fsdp, fully_shard(model, {.sharding_strategy = strategy,
                                                          .units = {model->fc1, model->fc2},
                                                          .shard_group_size = 2}));
    std::vector<int64_t> ours;
    for (const FlatParamInfo& info : fsdp->flat_param_infos()) ours.push_back(info.shard_numel);
    if (ours != std::vector<int64_t>{12, 18, 21}) {
      return absl::InternalError(absl::StrCat("shard sizes ", absl::StrJoin(ours, ",")));
    }
    nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
    const int64_t per = xs.size(1) / me.world_size;
    for (int64_t step = 0; step < xs.size(0); ++step) {
      opt.zero_grad();
      nn::functional::cross_entropy((*fsdp)(xs[step].narrow(0, me.rank * per, per)),
                                    ys[step].narrow(0, me.rank * per, per))
          .backward();
      opt.step();
    }
    EMBER_ASSIGN_OR_RETURN(ember::StateDict state, fsdp->full_state_dict());
    if (me.rank == 0) EMBER_RETURN_IF_ERROR(save(state, out_path));
    return absl::OkStatus();
  }));
  absl::StatusOr<StateDict> ours = load(out_path);
  ASSERT_TRUE(ours.ok()) << ours.status();
  double worst = 0;
  for (const auto& [key, t] : *theirs) {
    const Tensor mine = Get(*ours, key);
    ASSERT_TRUE(mine.defined()) << key;
    const double scale = std::max(t.abs().max().item<double>(), 1e-30);
    worst = std::max(worst, (mine.to(kFloat64) - t.to(kFloat64)).abs().max().item<double>() / scale);
  }
  std::printf("%s: max relative |ember - torch| %.3g\n", sharding_strategy_name(strategy), worst);
  EXPECT_LE(worst, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Strategies, TorchHybridTest,
                         ::testing::Values(ShardingStrategy::kHybridShard,
                                           ShardingStrategy::kHybridShardZero2),
                         [](const auto& info) {
                           return info.param == ShardingStrategy::kHybridShard
                                      ? std::string("HybridShard")
                                      : std::string("HybridShardZero2");
                         });

}  // namespace
}  // namespace ember::parallel
