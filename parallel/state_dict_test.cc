// One training run carried across kinds of parallelism and world sizes by
// distributed checkpoints: 3 steps fully sharded on 2 ranks, 3 steps of DDP on
// 3 ranks, 2 steps sharded (SHARD_GRAD_OP) on 4 ranks, then loaded into one
// plain module. The loss after every step and the final parameters must equal
// those of one process training the same 8 steps without stopping. Ranks are
// forked processes over tcp (distributed/testing/ranks.h); the reference is
// computed afterwards in the test process.
#include "parallel/state_dict.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/grad_mode.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "parallel/rank_testing.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Guard;

namespace fs = std::filesystem;
namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;

constexpr int64_t kInputs = 6;
constexpr int64_t kClasses = 3;
constexpr int64_t kGlobalBatch = 12;  // divisible by 2, 3 and 4 ranks
constexpr int kSteps = 8;
// Adam on float32 across world sizes: the collectives sum in another order
// than one process's matmul (Note [Tolerance against one process] in
// fully_sharded_data_parallel_test.cc).
constexpr double kTolerance = 1e-5;

// fc1 (35 parameters: uneven shards) -> batch norm (eval: running statistics,
// set to non-default values, so they must come through the checkpoint) ->
// relu -> fc2 -> relu -> head.
struct Net {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::BatchNorm1d> norm;
  std::shared_ptr<nn::Sequential> model;
};
Net MakeNet(bool first_phase) {
  manual_seed(first_phase ? 0 : 99);  // later phases start from other values
  Net n;
  n.fc1 = std::make_shared<nn::Linear>(kInputs, 5);
  n.norm = std::make_shared<nn::BatchNorm1d>(5);
  n.fc2 = std::make_shared<nn::Linear>(5, 7);
  std::vector<std::shared_ptr<nn::Module>> layers;
  layers.push_back(n.fc1);
  layers.push_back(n.norm);
  layers.push_back(std::make_shared<nn::ReLU>());
  layers.push_back(n.fc2);
  layers.push_back(std::make_shared<nn::ReLU>());
  layers.push_back(std::make_shared<nn::Linear>(7, kClasses));
  n.model = std::make_shared<nn::Sequential>(std::move(layers));
  if (first_phase) {
    for (auto& [name, b] : n.norm->named_buffers()) {
      if (name == "running_mean") b.copy_(arange(5, kFloat32).mul(0.1));
      if (name == "running_var") b.copy_(arange(5, kFloat32).add(1.0).mul(0.5));
    }
  }
  n.model->eval();
  return n;
}

std::unique_ptr<nn::optim::Adam> MakeAdam(std::vector<Tensor> params) {
  return std::make_unique<nn::optim::Adam>(std::move(params), nn::optim::AdamOptions{.lr = 0.02});
}

struct Batch {
  Tensor x, y;
};
Batch GlobalBatch(int step) {
  Generator gen(1000 + step);
  return {randn({kGlobalBatch, kInputs}, {}, &gen), randint(0, kClasses, {kGlobalBatch}, {}, &gen)};
}
Batch Shard(const Batch& b, int rank, int world) {
  const int64_t n = kGlobalBatch / world;
  return {b.x.narrow(0, rank * n, n), b.y.narrow(0, rank * n, n)};
}
const Batch& HeldOut() {
  static const Batch* batch = [] {
    Generator gen(7);
    return new Batch{randn({64, kInputs}, {}, &gen), randint(0, kClasses, {64}, {}, &gen)};
  }();
  return *batch;
}

// The held-out loss of `forward` (every rank runs it: a sharded forward is
// collective).
double HeldOutLoss(const std::function<Tensor(const Tensor&)>& forward) {
  autograd::NoGradGuard no_grad;
  return nn::functional::cross_entropy(forward(HeldOut().x), HeldOut().y).item<double>();
}

std::string Dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    fs::path d = fs::path(base ? base : "/tmp") / absl::StrCat("state_dict_", ::getpid());
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

void AppendLoss(int step, double loss) {
  std::ofstream out(fs::path(Dir()) / "losses", std::ios::app);
  out.precision(17);
  out << step << " " << loss << "\n";
}

enum class Kind { kFullShard, kShardGradOp, kDdp };

// Trains steps [first, last) as `kind` over the rank's group, loading the
// checkpoint `from` first (unless empty) and saving to `to` after.
absl::Status Phase(testing::Rank& me, Kind kind, int first, int last, const std::string& from,
                   const std::string& to) {
  return Guard([&]() -> absl::Status {
    Net net = MakeNet(from.empty());
    std::shared_ptr<nn::Module> wrapper;
    std::function<Tensor(const Tensor&)> forward;
    std::unique_ptr<nn::optim::Adam> adam;
    ModelStateDict state;
    if (kind == Kind::kDdp) {
      EMBER_ASSIGN_OR_RETURN(auto ddp,
                             DistributedDataParallel::create(net.model, {.process_group = me.group}));
      adam = MakeAdam(ddp->parameters());
      EMBER_ASSIGN_OR_RETURN(state, get_state_dict(*ddp, adam.get()));
      forward = [ddp](const Tensor& x) { return (*ddp)(x); };
      wrapper = ddp;
    } else {
      EMBER_ASSIGN_OR_RETURN(
          auto fsdp, fully_shard(net.model, {.process_group = me.group,
                                             .sharding_strategy = kind == Kind::kFullShard
                                                                      ? ShardingStrategy::kFullShard
                                                                      : ShardingStrategy::kShardGradOp,
                                             .units = {net.fc1, net.fc2}}));
      adam = MakeAdam(fsdp->parameters());
      EMBER_ASSIGN_OR_RETURN(state, get_state_dict(*fsdp, adam.get()));
      forward = [fsdp](const Tensor& x) { return (*fsdp)(x); };
      wrapper = fsdp;
    }
    if (!from.empty()) EMBER_RETURN_IF_ERROR(load_state_dict(state, adam.get(), {.path = from}));
    for (int step = first; step < last; ++step) {
      const Batch local = Shard(GlobalBatch(step), me.rank, me.world_size);
      adam->zero_grad();
      nn::functional::cross_entropy(forward(local.x), local.y).backward();
      adam->step();
      const double loss = HeldOutLoss(forward);
      if (me.rank == 0) AppendLoss(step, loss);
    }
    return save_state_dict(state, adam.get(), {.path = to, .process_group = me.group});
  });
}

void RunPhase(int world, Kind kind, int first, int last, const std::string& from,
              const std::string& to) {
  testing::RunRanksOptions options;
  options.timeout = absl::Seconds(60);
  const std::vector<testing::ProcessResult> results = testing::RunRankProcesses(
      world, [&](testing::Rank& me) { return Phase(me, kind, first, last, from, to); }, options,
      absl::Seconds(120));
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].exit_code, 0)
        << "rank " << r << " of the phase from step " << first << ": " << results[r].output;
  }
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

TEST(StateDictTest, OneRunAcrossShardedDdpAndPlainAtWorldSizes2And3And4) {
  const std::string a = Dir() + "/after_step_3", b = Dir() + "/after_step_6",
                    c = Dir() + "/after_step_8";
  RunPhase(2, Kind::kFullShard, 0, 3, "", a);
  RunPhase(3, Kind::kDdp, 3, 6, a, b);
  RunPhase(4, Kind::kShardGradOp, 6, kSteps, b, c);

  std::vector<double> resumed(kSteps, NAN);
  {
    std::ifstream in(fs::path(Dir()) / "losses");
    int step;
    double loss;
    while (in >> step >> loss) {
      ASSERT_TRUE(step >= 0 && step < kSteps) << step;
      resumed[step] = loss;
    }
  }
  // One process on the whole batch, without stopping.
  Net reference = MakeNet(/*first_phase=*/true);
  auto adam = MakeAdam(reference.model->parameters());
  std::vector<double> uninterrupted;
  for (int step = 0; step < kSteps; ++step) {
    const Batch global = GlobalBatch(step);
    adam->zero_grad();
    nn::functional::cross_entropy((*reference.model)(global.x), global.y).backward();
    adam->step();
    uninterrupted.push_back(HeldOutLoss([&](const Tensor& x) { return (*reference.model)(x); }));
  }
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_LE(Relative(resumed[step], uninterrupted[step]), kTolerance)
        << "step " << step << ": resumed " << resumed[step] << ", uninterrupted "
        << uninterrupted[step] << " (all: " << absl::StrJoin(resumed, ", ") << " vs "
        << absl::StrJoin(uninterrupted, ", ") << ")";
  }
  // The losses must actually move, or equality would say little.
  EXPECT_GT(Relative(uninterrupted.back(), uninterrupted.front()), 1e-3);

  // The last checkpoint into one plain module (other initial values) and a
  // fresh optimizer: parameters, buffers and Adam's state equal the
  // reference's, so one more step agrees too.
  Net plain = MakeNet(/*first_phase=*/false);
  auto plain_adam = MakeAdam(plain.model->parameters());
  absl::StatusOr<ModelStateDict> state = get_state_dict(*plain.model, plain_adam.get());
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(load_state_dict(*state, plain_adam.get(), {.path = c}).ok());
  const auto want = reference.model->named_parameters();
  const auto got = plain.model->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].first, want[i].first);
    const double scale = want[i].second.detach().abs().max().item<double>();
    const double diff = (got[i].second.detach() - want[i].second.detach()).abs().max().item<double>();
    EXPECT_LE(diff / scale, kTolerance) << got[i].first;
  }
  for (auto [model, opt] : {std::pair{plain.model.get(), plain_adam.get()},
                            std::pair{reference.model.get(), adam.get()}}) {
    const Batch extra = GlobalBatch(kSteps);
    opt->zero_grad();
    nn::functional::cross_entropy((*model)(extra.x), extra.y).backward();
    opt->step();
  }
  const double after_plain = HeldOutLoss([&](const Tensor& x) { return (*plain.model)(x); });
  const double after_reference =
      HeldOutLoss([&](const Tensor& x) { return (*reference.model)(x); });
  EXPECT_LE(Relative(after_plain, after_reference), kTolerance);
}

TEST(StateDictTest, AnOptimizerOverOtherTensorsIsRefusedNamingItsParameter) {
  Net net = MakeNet(/*first_phase=*/true);
  nn::optim::SGD sgd({net.fc1->parameters()[0], zeros({3}).requires_grad_()}, {.lr = 0.1});
  absl::StatusOr<ModelStateDict> state = get_state_dict(*net.model, &sgd);
  ASSERT_FALSE(state.ok());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(state.status().message(), HasSubstr("optimizer's parameter 1"));
}

TEST(StateDictTest, PlainModuleKeysAreItsParameterAndBufferNames) {
  Net net = MakeNet(/*first_phase=*/true);
  absl::StatusOr<ModelStateDict> state = get_state_dict(*net.model);
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<std::string> keys;
  for (const auto& [key, item] : state->model) keys.push_back(key);
  EXPECT_THAT(keys, ::testing::ElementsAre("0.weight", "0.bias", "1.weight", "1.bias", "3.weight",
                                           "3.bias", "5.weight", "5.bias", "1.running_mean",
                                           "1.running_var", "1.num_batches_tracked"));
  EXPECT_TRUE(state->optimizer.empty());
}

}  // namespace
}  // namespace ember::parallel
