// GradScaler with data parallelism, over forked ranks (tcp and gloo):
// - fully_shard with ShardedGradScaler: an inf in one rank's shard of the
//   gradients makes every rank skip that step, and after the run the model
//   equals one process running GradScaler on the whole batch with the same
//   step skipped (within 1e-5 relative); a plain GradScaler in the same run
//   steps on the ranks without the inf, so their replicas would drift (the
//   reason ShardedGradScaler exists);
// - DDP with a plain GradScaler: the gradients are averaged before they are
//   unscaled, so an inf in one rank's input reaches every rank and all skip.
#include "parallel/sharded_grad_scaler.h"

#include <cmath>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/fully_sharded_data_parallel.h"
#include "parallel/rank_testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Guard;
namespace testing = ::ember::distributed::testing;

constexpr int kWorld = 2;
constexpr int kSteps = 4;
constexpr int kInfStep = 1;  // rank 1 (or the reference) puts an inf into a gradient here

std::shared_ptr<nn::Sequential> MakeMlp() {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(6, 16));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(16, 3));
  return model;
}

struct Batch {
  Tensor x, y;
};
Batch GlobalBatch(int step) {
  manual_seed(100 + step);
  return {randn({8, 6}), randint(0, 3, {8})};
}
Batch Local(const Batch& b, int rank) {
  const int64_t per = b.x.size(0) / kWorld;
  return {b.x.slice(0, rank * per, (rank + 1) * per), b.y.slice(0, rank * per, (rank + 1) * per)};
}

// One process on the whole batch, the inf step skipped.
std::shared_ptr<nn::Sequential> Reference(std::vector<double>* scales) {
  auto model = MakeMlp();
  nn::optim::SGD opt(model->parameters(), {.lr = 0.2, .momentum = 0.9});
  nn::optim::GradScaler scaler(DeviceType::kCPU, {.init_scale = 64.0, .growth_interval = 2});
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    const Batch b = GlobalBatch(step);
    scaler.scale(nn::functional::cross_entropy((*model)(b.x), b.y)).backward();
    if (step == kInfStep) model->parameters()[0].grad().view({-1}).select(0, 0).fill_(INFINITY);
    scaler.step(opt);
    scaler.update();
    scales->push_back(scaler.get_scale());
  }
  return model;
}

absl::Status CheckEqual(const StateDict& got, nn::Module& want, double tolerance) {
  double diff = 0, norm = 0;
  for (const auto& [name, p] : want.named_parameters()) {
    const Tensor* mine = nullptr;
    for (const auto& [n, t] : got) {
      if (n == name) mine = &t;
    }
    if (mine == nullptr) return absl::InternalError(absl::StrCat("no '", name, "' in the state"));
    diff += (*mine - p.detach()).pow(2.0).sum().item<double>();
    norm += p.detach().pow(2.0).sum().item<double>();
  }
  const double relative = std::sqrt(diff / norm);
  if (!(relative <= tolerance)) {
    return absl::InternalError(absl::StrCat("relative difference ", relative, " from one process"));
  }
  return absl::OkStatus();
}

class ShardedGradScalerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedGradScalerTest, EveryRankSkipsAStepWhoseInfIsInOneShard) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      kWorld,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          std::vector<double> ref_scales;
          auto reference = Reference(&ref_scales);
          auto model = MakeMlp();
          EMBER_ASSIGN_OR_RETURN(auto fsdp, fully_shard(model, {.process_group = me.group}));
          nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.2, .momentum = 0.9});
          ShardedGradScaler scaler(me.group, DeviceType::kCPU,
                                   {.init_scale = 64.0, .growth_interval = 2});
          for (int step = 0; step < kSteps; ++step) {
            opt.zero_grad();
            const Batch b = Local(GlobalBatch(step), me.rank);
            scaler.scale(nn::functional::cross_entropy((*fsdp)(b.x), b.y)).backward();
            if (step == kInfStep && me.rank == 1) {
              fsdp->parameters()[0].grad().view({-1}).select(0, 0).fill_(INFINITY);
            }
            const bool stepped = scaler.step(opt);
            if (stepped == (step == kInfStep)) {
              return absl::InternalError(absl::StrCat("rank ", me.rank, " step ", step,
                                                      stepped ? " stepped" : " skipped"));
            }
            scaler.update();
            if (scaler.get_scale() != ref_scales[step]) {
              return absl::InternalError(absl::StrCat("scale ", scaler.get_scale(), " at step ",
                                                      step, ", one process's ",
                                                      ref_scales[step]));
            }
          }
          EMBER_ASSIGN_OR_RETURN(StateDict state, fsdp->full_state_dict());
          return CheckEqual(state, *reference, 1e-5);
        });
      },
      {.backend = GetParam()}));
}

TEST_P(ShardedGradScalerTest, APlainScalerWouldStepOnTheRanksWithoutTheInf) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      kWorld,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto model = MakeMlp();
          EMBER_ASSIGN_OR_RETURN(auto fsdp, fully_shard(model, {.process_group = me.group}));
          nn::optim::SGD opt(fsdp->parameters(), {.lr = 0.2});
          nn::optim::GradScaler scaler(DeviceType::kCPU);
          const Batch b = Local(GlobalBatch(0), me.rank);
          scaler.scale(nn::functional::cross_entropy((*fsdp)(b.x), b.y)).backward();
          if (me.rank == 1) fsdp->parameters()[0].grad().view({-1}).select(0, 0).fill_(NAN);
          const bool stepped = scaler.step(opt);
          if (stepped != (me.rank == 0)) {
            return absl::InternalError(absl::StrCat("rank ", me.rank,
                                                    stepped ? " stepped" : " skipped"));
          }
          return absl::OkStatus();
        });
      },
      {.backend = GetParam()}));
}

TEST_P(ShardedGradScalerTest, DdpAveragesAnInfIntoEveryRanksGradients) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      kWorld,
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          std::vector<double> ref_scales;
          auto reference = Reference(&ref_scales);
          auto model = MakeMlp();
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group}));
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.2, .momentum = 0.9});
          nn::optim::GradScaler scaler(DeviceType::kCPU, {.init_scale = 64.0, .growth_interval = 2});
          for (int step = 0; step < kSteps; ++step) {
            opt.zero_grad();
            Batch b = Local(GlobalBatch(step), me.rank);
            if (step == kInfStep && me.rank == 1) b.x = b.x.clone().fill_(INFINITY);
            scaler.scale(nn::functional::cross_entropy((*ddp)(b.x), b.y)).backward();
            const bool stepped = scaler.step(opt);
            if (stepped == (step == kInfStep)) {
              return absl::InternalError(absl::StrCat("rank ", me.rank, " step ", step,
                                                      stepped ? " stepped" : " skipped"));
            }
            scaler.update();
          }
          if (scaler.get_scale() != ref_scales.back()) {
            return absl::InternalError(absl::StrCat("scale ", scaler.get_scale()));
          }
          StateDict state;
          for (const auto& [name, p] : model->named_parameters()) state.emplace_back(name, p);
          return CheckEqual(state, *reference, 1e-5);
        });
      },
      {.backend = GetParam()}));
}

INSTANTIATE_TEST_SUITE_P(Backends, ShardedGradScalerTest, ::testing::Values("tcp", "gloo"));

}  // namespace
}  // namespace ember::parallel
