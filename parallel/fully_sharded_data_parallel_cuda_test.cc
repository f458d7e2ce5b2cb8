// FullyShardedDataParallel with its module on a GPU: ranks as threads of
// this process (distributed/testing/ranks.h), so that two gloo ranks can
// share cuda:0 (which NCCL refuses) and the process never forks after CUDA
// is initialised. Each rank trains its share of the batch, sharded; one module
// trains on the whole batch beside them on the same device; after three SGD
// steps with momentum every rank's full state dict must be within 1e-5
// relative of it (fp32); with CPU offload too, the flat shards and their
// gradients in pinned host memory. The CPU side runs the same scenarios on the CPU
// (gloo) everywhere; the GPU side skips without a usable GPU (or with too
// few), saying so.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "cuda/device.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/cuda_testing.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace testing = ::ember::distributed::testing;
using ::testing::HasSubstr;

constexpr int64_t kInputs = 6;
constexpr int64_t kClasses = 4;
constexpr int64_t kGlobalBatch = 12;
constexpr double kRelativeTolerance = 1e-5;

using cuda_testing::Cuda;
using cuda_testing::Guard;

// fc1 (35 parameters: uneven shards) -> relu -> fc2 -> relu -> head (root).
class Net : public nn::Cloneable<Net> {
 public:
  Net() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kInputs, 5));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(5, 9));
    head = register_module("head", std::make_shared<nn::Linear>(9, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    return (*head)((*fc2)((*fc1)(x).relu()).relu());
  }
  std::shared_ptr<nn::Linear> fc1, fc2, head;
};

struct Batch {
  Tensor x, y;
};
Batch GlobalBatch(int step, Device device) {
  Generator gen(700 + step);
  return {randn({kGlobalBatch, kInputs}, {}, &gen).to(device),
          randint(0, kClasses, {kGlobalBatch}, {}, &gen).to(device)};
}

// The module's own parameters, freed while their unit is sharded, still say
// `device`, and so does what their AccumulateGrad nodes expect (a gradient on
// another device than that is refused in backward).
absl::Status ModuleParametersAreOn(nn::Module& model, Device device, const std::string& when) {
  for (const auto& [name, p] : model.named_parameters()) {
    if (p.device() != device) {
      return absl::InternalError(absl::StrCat(when, ": parameter '", name, "' says ",
                                              p.device().str(), ", expected ", device.str()));
    }
    const Device expected = autograd::GradAccumulator(p)->input_metadata(0).device;
    if (expected != device) {
      return absl::InternalError(absl::StrCat(when, ": the AccumulateGrad of '", name,
                                              "' expects a gradient on ", expected.str(),
                                              ", the parameter is on ", device.str()));
    }
  }
  return absl::OkStatus();
}

// Trains 3 steps fully sharded with `strategy` on `world` ranks over
// `backend`, every module on `device`, against one module on the whole
// batch; fails unless every rank's full state dict is within tolerance.
// With `offload` (CPUOffload(offload_params=True)) and a GPU module, the flat
// shards and their gradients must be in pinned host memory; with a CPU
// module, in ordinary CPU memory (a no-op in placement).
absl::Status TrainAndCompare(const std::string& backend, int world, Device device,
                             ShardingStrategy strategy, bool offload = false) {
  const bool on_host = offload && !device.is_cpu();
  const Device flat_device = on_host ? Device(kCPU) : device;
  manual_seed(5);
  auto reference = std::make_shared<Net>();
  reference->to(device);
  std::vector<std::shared_ptr<Net>> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(std::static_pointer_cast<Net>(reference->clone(device)));
  }
  std::vector<ember::StateDict> trained(world);
  testing::RunRanksOptions rank_options;
  rank_options.backend = backend;
  EMBER_RETURN_IF_ERROR(testing::RunRanks(
      world,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto model = models[me.rank];
          EMBER_ASSIGN_OR_RETURN(auto fsdp,
                                 fully_shard(model, {.process_group = me.group,
                                                     .sharding_strategy = strategy,
                                                     .units = {model->fc1, model->fc2},
                                                     .forward_prefetch = true,
                                                     .cpu_offload = {.offload_params = offload}}));
          for (const Tensor& p : fsdp->parameters()) {
            if (p.device() != flat_device || (flat_device.is_cpu() && p.is_pinned() != on_host)) {
              return absl::InternalError(absl::StrCat(
                  "a flat shard is on ", p.device().str(), p.is_cpu() && p.is_pinned() ? " (pinned)" : "",
                  ", expected ", flat_device.str(), on_host ? " (pinned)" : ""));
            }
          }
          EMBER_RETURN_IF_ERROR(ModuleParametersAreOn(*model, device, "after fully_shard"));
          nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
          const int64_t n = kGlobalBatch / me.world_size;
          for (int step = 0; step < 3; ++step) {
            const Batch global = GlobalBatch(step, device);
            opt.zero_grad();
            Tensor out = (*fsdp)(global.x.narrow(0, me.rank * n, n));
            if (out.device() != device) {
              return absl::InternalError(absl::StrCat("the output is on ", out.device().str()));
            }
            nn::functional::cross_entropy(out, global.y.narrow(0, me.rank * n, n)).backward();
            for (const Tensor& p : fsdp->parameters()) {
              if (!p.grad().defined() || p.grad().device() != flat_device) {
                return absl::InternalError(absl::StrCat(
                    "a flat gradient is ", p.grad().defined() ? p.grad().device().str() : "missing",
                    ", expected on ", flat_device.str()));
              }
            }
            opt.step();
          }
          EMBER_RETURN_IF_ERROR(ModuleParametersAreOn(*model, device, "after 3 steps"));
          EMBER_ASSIGN_OR_RETURN(trained[me.rank], fsdp->full_state_dict());
          return absl::OkStatus();
        });
      },
      rank_options));

  nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    const Batch global = GlobalBatch(step, device);
    ref_opt.zero_grad();
    nn::functional::cross_entropy((*reference)(global.x), global.y).backward();
    ref_opt.step();
  }
  for (int r = 0; r < world; ++r) {
    std::unordered_map<std::string, Tensor> got(trained[r].begin(), trained[r].end());
    for (const auto& [name, p] : reference->named_parameters()) {
      auto it = got.find(name);
      if (it == got.end()) return absl::InternalError(absl::StrCat("rank ", r, ": no ", name));
      if (it->second.device() != device) {
        return absl::InternalError(absl::StrCat("rank ", r, ": ", name, " is on ",
                                                it->second.device().str()));
      }
      const Tensor want = p.detach().cpu();
      const double diff = (it->second.cpu() - want).abs().max().item<double>();
      const double scale = std::max(want.abs().max().item<double>(), 1e-6);
      if (!(diff <= kRelativeTolerance * scale)) {
        return absl::InternalError(absl::StrCat("rank ", r, " on ", device.str(), ": ", name,
                                                " differs from one process by ", diff,
                                                " (relative ", diff / scale, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void RunAll(const std::string& backend, int world, Device device) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kNoShard}) {
    const absl::Status s = TrainAndCompare(backend, world, device, strategy);
    EXPECT_TRUE(s.ok()) << backend << ", " << world << " ranks on " << device.str() << ", "
                        << sharding_strategy_name(strategy) << ": " << s;
  }
}

TEST(FsdpCudaTest, NcclWorldSizeOneOnCuda0MatchesOneProcess) {
  RunAll("gloo", 1, kCPU);  // the CPU side
  EMBER_SKIP_WITHOUT_GPUS(1);
  RunAll("nccl", 1, Cuda(0));
}

TEST(FsdpCudaTest, GlooTwoRanksSharingCuda0MatchOneProcess) {
  RunAll("gloo", 2, kCPU);
  EMBER_SKIP_WITHOUT_GPUS(1);
  RunAll("gloo", 2, Cuda(0));
}

// CPU offload: shards and gradients in pinned host memory, the optimizer
// stepping them there, each unshard copying the shard to the GPU (on a side
// stream) before its all_gather; the CPU side checks the CPU module's no-op.
void RunAllOffloaded(const std::string& backend, int world, Device device) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kNoShard}) {
    const absl::Status s = TrainAndCompare(backend, world, device, strategy, /*offload=*/true);
    EXPECT_TRUE(s.ok()) << backend << ", " << world << " ranks on " << device.str() << ", "
                        << sharding_strategy_name(strategy) << " with cpu_offload: " << s;
  }
}

TEST(FsdpCudaTest, CpuOffloadKeepsShardsInPinnedHostMemoryAndMatchesOneProcess) {
  RunAllOffloaded("gloo", 2, kCPU);
  EMBER_SKIP_WITHOUT_GPUS(1);
  RunAllOffloaded("nccl", 1, Cuda(0));
  RunAllOffloaded("gloo", 2, Cuda(0));
}

TEST(FsdpCudaTest, NcclOneRankPerGpuMatchesOneProcess) {
  EMBER_SKIP_WITHOUT_GPUS(2);
  // One device per rank: every rank's module on its own GPU.
  const int n = std::min(cuda::device_count(), 4);
  manual_seed(5);
  auto reference = std::make_shared<Net>();
  std::vector<std::shared_ptr<Net>> models;
  for (int r = 0; r < n; ++r) {
    models.push_back(std::static_pointer_cast<Net>(reference->clone(Cuda(r))));
  }
  testing::RunRanksOptions options;
  options.backend = "nccl";
  const absl::Status s = testing::RunRanks(
      n,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto model = models[me.rank];
          EMBER_ASSIGN_OR_RETURN(auto fsdp, fully_shard(model, {.process_group = me.group,
                                                                .units = {model->fc1}}));
          nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.1});
          const Batch global = GlobalBatch(0, Cuda(me.rank));
          const int64_t per = kGlobalBatch / me.world_size;
          nn::functional::cross_entropy((*fsdp)(global.x.narrow(0, me.rank * per, per)),
                                        global.y.narrow(0, me.rank * per, per))
              .backward();
          opt.step();
          EMBER_ASSIGN_OR_RETURN(ember::StateDict state, fsdp->full_state_dict());
          return state.empty() ? absl::InternalError("empty state dict") : absl::OkStatus();
        });
      },
      options);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FsdpCudaTest, AModuleOnTwoDevicesIsRefusedNamingBoth) {
  EMBER_SKIP_WITHOUT_GPUS(1);
  auto model = std::make_shared<Net>();
  model->fc1->to(Cuda(0));
  testing::RunRanksOptions options;
  options.backend = "gloo";
  std::string error;
  const absl::Status s = testing::RunRanks(
      1,
      [&](testing::Rank& me) -> absl::Status {
        auto made = fully_shard(model, {.process_group = me.group});
        error = made.ok() ? "ok" : std::string(made.status().message());
        return absl::OkStatus();
      },
      options);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(error, HasSubstr("cuda:0"));
  EXPECT_THAT(error, HasSubstr("cpu"));
  EXPECT_THAT(error, HasSubstr("one device"));
}

}  // namespace
}  // namespace ember::parallel
