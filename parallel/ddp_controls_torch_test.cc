// DistributedDataParallel's 2.x controls against PyTorch 2.x: Join on uneven
// inputs (both divisions) and static_graph, 3 ranks over gloo, on the model,
// starting weights and batches testdata/torch_ddp_controls.py writes, which
// also trains PyTorch's DDP the same way (the PyTorch 2.x peer that
// tools/install_peers.sh installs; skipped without it). Every final
// parameter tensor must equal torch's within 1e-6 relative to its largest
// element (float32 products differ in their last bits between the two), and
// differ from the starting one unless it is never used.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/join.h"
#include "parallel/rank_testing.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Get;
using ::ember::parallel::rank_testing::Guard;

namespace testing = ::ember::distributed::testing;

constexpr int kWorld = 3;
constexpr int64_t kPer = 4;

// torch_ddp_controls.py's Net: fc1 -> relu -> fc2; `extra` never used.
class Net : public nn::Module {
 public:
  Net() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(16, 32));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 4));
    extra = register_module("extra", std::make_shared<nn::Linear>(32, 4));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*fc1)(x).relu()); }
  std::shared_ptr<nn::Linear> fc1, fc2, extra;
};

// torch's run, once per test binary.
const rank_testing::TorchRun& Torch() {
  return rank_testing::RunTorchOnce("parallel/testdata/torch_ddp_controls.py",
                                    "torch_ddp_controls");
}

struct Config {
  std::function<int(int rank)> steps;
  bool join = false;
  JoinOptions join_options;
  DistributedDataParallelOptions ddp;
};

// Trains torch's Net on torch's batches at 3 ranks over gloo as `config`
// says; rank 0's final state.
absl::StatusOr<StateDict> TrainLikeTorch(const Config& config) {
  const std::string dir = Torch().dir;
  EMBER_ASSIGN_OR_RETURN(const StateDict init, load(dir + "/init.pt"));
  EMBER_ASSIGN_OR_RETURN(const StateDict data, load(dir + "/data.pt"));
  const Tensor xs = Get(data, "x");
  const Tensor ys = Get(data, "y");
  if (!xs.defined() || !ys.defined()) return absl::InternalError("data.pt has no x or y");
  StateDict final_state;
  testing::RunRanksOptions options;
  options.backend = "gloo";
  EMBER_RETURN_IF_ERROR(testing::RunRanks(
      kWorld,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto net = std::make_shared<Net>();
          EMBER_RETURN_IF_ERROR(net->load_state_dict(init));
          DistributedDataParallelOptions ddp_options = config.ddp;
          ddp_options.process_group = me.group;
          EMBER_ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::create(net, ddp_options));
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
          std::unique_ptr<Join> join;
          if (config.join) {
            EMBER_ASSIGN_OR_RETURN(join, ddp->join(config.join_options));
          }
          for (int step = 0; step < config.steps(me.rank); ++step) {
            const Tensor x = xs[step].narrow(0, me.rank * kPer, kPer);
            const Tensor y = ys[step].narrow(0, me.rank * kPer, kPer);
            opt.zero_grad();
            nn::functional::cross_entropy((*ddp)(x), y).backward();
            opt.step();
          }
          if (join != nullptr) EMBER_RETURN_IF_ERROR(join->join());
          if (me.rank == 0) final_state = net->state_dict();
          return absl::OkStatus();
        });
      },
      options));
  return final_state;
}

class DdpControlsTorchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const rank_testing::TorchRun& run = Torch();
    if (absl::IsNotFound(run.status)) GTEST_SKIP() << run.status.message();
    ASSERT_TRUE(run.status.ok()) << run.status;
  }

  void ExpectTorchs(const std::string& name, const Config& config) {
    absl::StatusOr<StateDict> ours = TrainLikeTorch(config);
    ASSERT_TRUE(ours.ok()) << ours.status();
    absl::StatusOr<StateDict> theirs = load(Torch().dir + "/final_" + name + ".pt");
    ASSERT_TRUE(theirs.ok()) << theirs.status();
    absl::StatusOr<StateDict> init = load(Torch().dir + "/init.pt");
    ASSERT_TRUE(init.ok()) << init.status();
    double max_diff = 0;
    bool trained = false;
    for (const auto& [key, want] : *theirs) {
      const Tensor got = Get(*ours, key);
      ASSERT_TRUE(got.defined()) << key;
      const Tensor w = want.to(kFloat64), g = got.to(kFloat64);
      const Tensor diff = (g - w).abs();
      max_diff = std::max(max_diff, diff.max().item<double>());
      const double bound = 1e-6 * w.abs().max().item<double>();
      EXPECT_LE(diff.max().item<double>(), bound)
          << name << ": " << key << " differs from torch's by up to " << diff.max().item<double>();
      if (!Get(*init, key).equal(got)) trained = true;
      if (key.rfind("extra.", 0) == 0) {
        EXPECT_TRUE(Get(*init, key).equal(got)) << key << " was never used, yet changed";
      }
    }
    EXPECT_TRUE(trained) << name << ": nothing changed from the starting state";
    std::printf("%s: max |ember - torch| %.3g\n", name.c_str(), max_diff);
  }
};

TEST_F(DdpControlsTorchTest, JoinOnUnevenInputsIsTorchs) {
  ExpectTorchs("join", {.steps = [](int rank) { return 3 + 2 * rank; },
                        .join = true,
                        .ddp = {.find_unused_parameters = true}});
}

TEST_F(DdpControlsTorchTest, JoinWithoutDivideByInitialWorldSizeIsTorchs) {
  ExpectTorchs("join_nodiv", {.steps = [](int rank) { return 3 + 2 * rank; },
                              .join = true,
                              .join_options = {.divide_by_initial_world_size = false},
                              .ddp = {.find_unused_parameters = true}});
}

TEST_F(DdpControlsTorchTest, StaticGraphIsTorchs) {
  ExpectTorchs("static", {.steps = [](int) { return 5; }, .ddp = {.static_graph = true}});
}

}  // namespace
}  // namespace ember::parallel
