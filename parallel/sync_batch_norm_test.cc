// SyncBatchNorm over real process groups: ranks are forked processes
// (distributed/testing/ranks.h) over the tcp and gloo backends. Each rank
// checks itself against one process running plain BatchNorm on the
// concatenated batch of every rank (computed locally from the same
// deterministic inputs), never against SyncBatchNorm itself. Also:
// convert_sync_batchnorm on nested models, and the errors.
#include "parallel/sync_batch_norm.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/models/resnet.h"
#include "nn/normalization.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/rank_testing.h"
#include "parallel/sync_batch_norm_testing.h"
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

constexpr int64_t kChannels = 3;

// One scenario: the layer's options, every rank's batch size and the
// trailing dims of the input ([N, C] + spatial).
struct Case {
  std::string name;
  nn::BatchNormOptions options;
  std::vector<int64_t> batch;  // per rank, for up to 3 ranks
  SizeVector spatial;
  Dtype dtype = kFloat64;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      // BatchNorm2d-shaped, uneven batches, float64 and float32.
      {"image_float64", {.num_features = kChannels}, {3, 5, 2}, {4, 5}, kFloat64},
      {"image_float32", {.num_features = kChannels}, {3, 5, 2}, {4, 5}, kFloat32},
      // [N, C] with a rank holding one row; cumulative average (momentum unset).
      {"rows_cumulative",
       {.num_features = kChannels, .momentum = std::nullopt},
       {1, 6, 3},
       {},
       kFloat64},
      // [N, C, L] with an empty rank; no affine parameters, no running stats.
      {"sequence_plain",
       {.num_features = kChannels, .affine = false, .track_running_stats = false},
       {4, 0, 2},
       {7},
       kFloat64},
  };
  return cases;
}

// OK when |a - b| <= atol + rtol |b| everywhere (and the shapes agree).
absl::Status ExpectClose(const Tensor& a, const Tensor& b, double rtol, double atol,
                         const std::string& what) {
  if (!a.defined() || !b.defined()) {
    return a.defined() == b.defined()
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(what, ": one side is undefined"));
  }
  if (a.sizes() != b.sizes()) {
    return absl::InternalError(absl::StrCat(what, ": shapes ", ShapeToString(a.sizes()), " and ",
                                            ShapeToString(b.sizes())));
  }
  if (a.numel() == 0) return absl::OkStatus();
  Tensor x = a.detach().to(kFloat64), y = b.detach().to(kFloat64);
  Tensor excess = (x - y).abs() - (y.abs() * rtol + atol);
  const double worst = excess.max().item<double>();
  if (worst > 0) {
    return absl::InternalError(absl::StrCat(what, ": differs by up to ",
                                            (x - y).abs().max().item<double>(), " (rtol ", rtol,
                                            ", atol ", atol, ")"));
  }
  return absl::OkStatus();
}

double Rtol(Dtype dtype) { return dtype == kFloat64 ? 1e-9 : 1e-6; }
double Atol(Dtype dtype) { return dtype == kFloat64 ? 1e-9 : 1e-5; }

SizeVector Shape(const Case& c, int rank) {
  SizeVector shape = {c.batch[rank], kChannels};
  shape.insert(shape.end(), c.spatial.begin(), c.spatial.end());
  return shape;
}

// Rank `rank`'s input at `step`: each rank's data centred and scaled
// differently, so that its own statistics are far from the group's.
Tensor RankInput(const Case& c, int rank, int step) {
  Generator gen(1000 + 10 * step + rank);
  Tensor x = randn(Shape(c, rank), TensorOptions(kFloat64), &gen);
  return (x * (1.0 + rank) + (2.0 * rank - 1.0)).to(c.dtype);
}
// The gradient of rank `rank`'s loss with respect to its output at `step`.
Tensor RankGrad(const Case& c, int rank, int step) {
  Generator gen(5000 + 10 * step + rank);
  return randn(Shape(c, rank), TensorOptions(kFloat64), &gen).to(c.dtype);
}

// BatchNorm1d or BatchNorm2d for the case's input rank.
std::shared_ptr<nn::BatchNormBase> PlainBatchNorm(const Case& c) {
  if (c.spatial.size() == 2) return std::make_shared<nn::BatchNorm2d>(c.options);
  return std::make_shared<nn::BatchNorm1d>(c.options);
}

// Gives `bn` a weight and bias other than 1 and 0, in the case's dtype.
void SetAffine(nn::Module& bn, Dtype dtype) {
  bn.to(dtype);
  autograd::NoGradGuard no_grad;
  if (!bn.parameter("weight").defined()) return;
  bn.parameter("weight").copy_(arange(kChannels, TensorOptions(kFloat64)).mul(0.25).add(1));
  bn.parameter("bias").copy_(arange(kChannels, TensorOptions(kFloat64)).mul(0.1).sub(0.1));
}

int64_t RowsBefore(const Case& c, int rank) {
  return std::accumulate(c.batch.begin(), c.batch.begin() + rank, int64_t{0});
}

// Trains `steps` steps of SyncBatchNorm on this rank's batches and, beside
// it, plain BatchNorm on the concatenation of every rank's; output, input
// gradient, this rank's weight and bias gradients and the running
// statistics must agree at every step.
absl::Status TrainAndCompare(testing::Rank& me, const Case& c, int steps) {
  return Guard([&]() -> absl::Status {
    const int world = me.world_size;
    auto sync = std::make_shared<SyncBatchNorm>(c.options, me.group);
    std::shared_ptr<nn::BatchNormBase> reference = PlainBatchNorm(c);
    SetAffine(*sync, c.dtype);
    SetAffine(*reference, c.dtype);
    const int64_t offset = RowsBefore(c, me.rank), rows = c.batch[me.rank];
    const double rtol = Rtol(c.dtype), atol = Atol(c.dtype);
    for (int step = 0; step < steps; ++step) {
      const std::string at = absl::StrCat(c.name, " step ", step, " rank ", me.rank);
      Tensor x = RankInput(c, me.rank, step).requires_grad_();
      Tensor gy = RankGrad(c, me.rank, step);
      Tensor y = (*sync)(x);
      (y * gy).sum().backward();

      std::vector<Tensor> xs, gys;
      for (int r = 0; r < world; ++r) {
        xs.push_back(RankInput(c, r, step));
        gys.push_back(RankGrad(c, r, step));
      }
      Tensor big_x = cat(xs).requires_grad_(), big_gy = cat(gys);
      Tensor big_y = (*reference)(big_x);
      (big_y * big_gy).sum().backward();
      EMBER_RETURN_IF_ERROR(
          ExpectClose(y, big_y.narrow(0, offset, rows), rtol, atol, at + ": output"));
      EMBER_RETURN_IF_ERROR(ExpectClose(x.grad(), big_x.grad().narrow(0, offset, rows), rtol, atol,
                                        at + ": input gradient"));
      // This rank's share of the weight and bias gradients: the reference's
      // with only this rank's rows of the output gradient.
      if (c.options.affine) {
        Tensor w = reference->weight().detach().clone().requires_grad_();
        Tensor b = reference->bias().detach().clone().requires_grad_();
        Tensor mine = zeros_like(big_gy);
        mine.narrow(0, offset, rows).copy_(gy);
        (nn::functional::batch_norm(big_x.detach(), Tensor(), Tensor(), w, b, true, 0.1,
                                    c.options.eps) *
         mine)
            .sum()
            .backward();
        EMBER_RETURN_IF_ERROR(
            ExpectClose(sync->weight().grad(), w.grad(), rtol, atol, at + ": weight gradient"));
        EMBER_RETURN_IF_ERROR(
            ExpectClose(sync->bias().grad(), b.grad(), rtol, atol, at + ": bias gradient"));
        // ... which is not the whole batch's (a test that could not fail otherwise).
        if ((reference->weight().grad() - w.grad()).abs().max().item<double>() < 1e-3) {
          return absl::InternalError(at + ": the local weight gradient equals the global one");
        }
      }
      if (c.options.track_running_stats) {
        EMBER_RETURN_IF_ERROR(ExpectClose(sync->running_mean(), reference->running_mean(), rtol,
                                          atol, at + ": running_mean"));
        EMBER_RETURN_IF_ERROR(ExpectClose(sync->running_var(), reference->running_var(), rtol, atol,
                                          at + ": running_var"));
        if (!sync->num_batches_tracked().equal(reference->num_batches_tracked())) {
          return absl::InternalError(at + ": num_batches_tracked differs");
        }
      }
      // The data tell the group's statistics from this rank's own (when
      // another rank has data too).
      if (step == 0 && rows > 1 && rows < big_x.size(0)) {
        Tensor local = nn::functional::batch_norm(x.detach(), Tensor(), Tensor(), sync->weight(),
                                                  sync->bias(), true);
        const double gap = (local - big_y.narrow(0, offset, rows)).abs().max().item<double>();
        if (gap < 0.1) {
          return absl::InternalError(
              absl::StrCat(at, ": local batch norm is within ", gap, " of the group's"));
        }
      }
      sync->zero_grad();
      reference->zero_grad();
    }
    return absl::OkStatus();
  });
}

class SyncBatchNormTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  testing::RunRanksOptions RankOptions(absl::Duration timeout = absl::Seconds(20)) const {
    testing::RunRanksOptions options;
    options.backend = backend();
    options.timeout = timeout;
    return options;
  }
};

TEST_P(SyncBatchNormTest, MatchesBatchNormOnTheConcatenatedBatch) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        for (const Case& c : Cases()) EMBER_RETURN_IF_ERROR(TrainAndCompare(me, c, 3));
        return absl::OkStatus();
      },
      RankOptions()));
}

// Eval mode normalises with the running statistics and talks to no one: only
// rank 0 runs it, so a collective would wait for the others until the
// group's timeout.
TEST_P(SyncBatchNormTest, EvalModeUsesRunningStatisticsWithoutCommunicating) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          const Case& c = Cases()[0];
          auto sync = std::make_shared<SyncBatchNorm>(c.options, me.group);
          SetAffine(*sync, c.dtype);
          (*sync)(RankInput(c, me.rank, 0));  // training: running stats of the group
          if (me.rank != 0) return absl::OkStatus();
          sync->eval();
          auto plain = PlainBatchNorm(c);
          SetAffine(*plain, c.dtype);
          EMBER_RETURN_IF_ERROR(plain->load_state_dict(sync->state_dict()));
          plain->eval();
          Tensor x = RankInput(c, 0, 1).requires_grad_();
          Tensor x2 = x.detach().clone().requires_grad_();
          Tensor y = (*sync)(x), y2 = (*plain)(x2);
          y.sum().backward();
          y2.sum().backward();
          EMBER_RETURN_IF_ERROR(ExpectClose(y, y2, 0, 0, "eval output"));
          EMBER_RETURN_IF_ERROR(ExpectClose(x.grad(), x2.grad(), 0, 0, "eval input gradient"));
          if (sync->num_batches_tracked().item<int64_t>() != 1) {
            return absl::InternalError("eval mode counted a batch");
          }
          return absl::OkStatus();
        });
      },
      RankOptions(absl::Seconds(5))));
}

// The layer as it is used: convert_sync_batchnorm, then DDP. Equal batches
// per rank, so DDP's average of the ranks' mean losses is the mean loss of
// the whole batch; every rank must end with the parameters and running
// statistics of one process training the plain model on that batch.
TEST_P(SyncBatchNormTest, ConvertedModelUnderDdpTrainsAsOneProcess) {
  ExpectAllSucceeded(testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          manual_seed(3);
          auto net = std::make_shared<nn::Sequential>();
          net->push_back(std::make_shared<nn::Linear>(4, 6));
          net->push_back(std::make_shared<nn::BatchNorm1d>(6));
          net->push_back(std::make_shared<nn::ReLU>());
          net->push_back(std::make_shared<nn::Linear>(6, 3));
          std::shared_ptr<nn::Module> reference = net->clone();
          std::shared_ptr<nn::Module> model = SyncBatchNorm::convert_sync_batchnorm(net, me.group);
          EMBER_ASSIGN_OR_RETURN(
              auto ddp, DistributedDataParallel::create(model, {.process_group = me.group}));
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.5});
          nn::optim::SGD ref_opt(reference->parameters(), {.lr = 0.5});
          constexpr int64_t kPerRank = 4;
          for (int step = 0; step < 3; ++step) {
            Generator gen(70 + step);
            // Rank-dependent offsets: local statistics differ from the group's.
            Tensor x = randn({kPerRank * me.world_size, 4}, {}, &gen) +
                       arange(kPerRank * me.world_size).div(kPerRank).floor().view({-1, 1});
            Tensor y = randint(0, 3, {kPerRank * me.world_size}, {}, &gen);
            opt.zero_grad();
            nn::functional::cross_entropy((*ddp)(x.narrow(0, me.rank * kPerRank, kPerRank)),
                                          y.narrow(0, me.rank * kPerRank, kPerRank))
                .backward();
            opt.step();
            ref_opt.zero_grad();
            nn::functional::cross_entropy((*reference)(x), y).backward();
            ref_opt.step();
          }
          const StateDict got = model->state_dict(), want = reference->state_dict();
          if (got.size() != want.size()) return absl::InternalError("state_dict sizes differ");
          for (size_t i = 0; i < got.size(); ++i) {
            if (got[i].first != want[i].first) return absl::InternalError("state_dict keys differ");
            EMBER_RETURN_IF_ERROR(
                ExpectClose(got[i].second, want[i].second, 1e-5, 1e-6, got[i].first));
          }
          return absl::OkStatus();
        });
      },
      RankOptions()));
}

// Input mistakes throw on every rank before any communication (no rank is
// left waiting); a backward with create_graph is refused.
TEST_P(SyncBatchNormTest, BadInputsFailBeforeCommunicating) {
  const auto results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        std::vector<std::string> errors;
        auto record = [&](const std::function<void()>& call) {
          try {
            call();
            errors.push_back("(no error)");
          } catch (const Error& e) {
            errors.push_back(e.what());
          }
        };
        auto sync = std::make_shared<SyncBatchNorm>(kChannels, me.group);
        record([&] { (*sync)(ones({4, 5, 2})); });
        record([&] { (*sync)(ones({kChannels})); });
        record([&] { (*sync)(ones({4, kChannels}, TensorOptions(kFloat64))); });
        record([&] {
          Tensor x = randn({4, kChannels}).requires_grad_();
          Tensor gx = autograd::grad({(*sync)(x).square().sum()}, {x}, {}, std::nullopt,
                                     /*create_graph=*/true)[0];
        });
        return absl::InternalError(absl::StrJoin(errors, "\n"));
      },
      RankOptions(absl::Seconds(10)));
  for (const testing::ProcessResult& r : results) {
    EXPECT_THAT(r.output,
                HasSubstr("SyncBatchNorm: expected 3 channels (dim 1), got input of shape [4, 5, "
                          "2]"));
    EXPECT_THAT(r.output, HasSubstr("SyncBatchNorm: expected at least 2D input (got 1D input)"));
    EXPECT_THAT(r.output,
                HasSubstr("SyncBatchNorm: the input is float64 but its weight is float32"));
    EXPECT_THAT(r.output, HasSubstr("create_graph = true (double backward) is not supported"));
  }
}

// A peer that is gone: the forward's all_gather fails with the group's
// error, within the group's timeout.
TEST_P(SyncBatchNormTest, AFailedCollectiveThrowsWithTheGroupsMessage) {
  const auto results = testing::RunRankProcesses(
      world(),
      [](testing::Rank& me) -> absl::Status {
        if (me.rank != 0) return absl::OkStatus();  // exits without joining the all_gather
        return Guard([&]() -> absl::Status {
          auto sync = std::make_shared<SyncBatchNorm>(kChannels, me.group);
          (*sync)(randn({4, kChannels}));
          return absl::InternalError("the forward succeeded without its peers");
        });
      },
      RankOptions(absl::Seconds(5)));
  ASSERT_FALSE(results.empty());
  EXPECT_EQ(results[0].exit_code, 1) << Describe(results);
  EXPECT_THAT(results[0].output,
              HasSubstr("SyncBatchNorm: the all_gather of the batch statistics over the process "
                        "group failed: "));
}

INSTANTIATE_TEST_SUITE_P(Backends, SyncBatchNormTest,
                         ::testing::Combine(::testing::Values("tcp", "gloo"),
                                            ::testing::Values(2, 3)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_",
                                               std::get<1>(info.param), "ranks");
                         });

// --- Without a group: BatchNorm, as torch falls back ------------------------------

TEST(SyncBatchNormNoGroupTest, TrainingWithoutAProcessGroupIsBatchNorm) {
  ASSERT_FALSE(distributed::is_initialized());
  for (const Case& c : Cases()) {
    if (c.batch[0] < 2) continue;
    auto sync = std::make_shared<SyncBatchNorm>(c.options);
    std::shared_ptr<nn::BatchNormBase> plain = PlainBatchNorm(c);
    SetAffine(*sync, c.dtype);
    SetAffine(*plain, c.dtype);
    for (int step = 0; step < 2; ++step) {
      Tensor x = RankInput(c, 0, step).requires_grad_();
      Tensor x2 = x.detach().clone().requires_grad_();
      Tensor gy = RankGrad(c, 0, step);
      ((*sync)(x)*gy).sum().backward();
      ((*plain)(x2)*gy).sum().backward();
      EXPECT_TRUE(x.grad().equal(x2.grad())) << c.name;
      if (c.options.affine) {
        EXPECT_TRUE(sync->weight().grad().equal(plain->weight().grad())) << c.name;
      }
      if (c.options.track_running_stats) {
        EXPECT_TRUE(sync->running_var().equal(plain->running_var())) << c.name;
        EXPECT_TRUE(sync->num_batches_tracked().equal(plain->num_batches_tracked()));
      }
    }
  }
}

TEST(SyncBatchNormNoGroupTest, InputErrorsNameTheValues) {
  auto sync = std::make_shared<SyncBatchNorm>(kChannels);
  EXPECT_THAT([&] { (*sync)(ones({kChannels})); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("SyncBatchNorm: expected at least 2D input (got 1D input)")));
  EXPECT_THAT(
      [&] {
        (*sync)(ones({4, 5, 2}));
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("SyncBatchNorm: expected 3 channels (dim 1), got input of shape [4, 5, 2]")));
  EXPECT_THAT(
      [&] {
        (*sync)(ones({4, 0}));
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("the number of input channels should be non-zero, got input of "
                    "shape [4, 0]")));
}

TEST(SyncBatchNormNoGroupTest, DefaultsAndPrintingAreTorchs) {
  SyncBatchNorm bn(4);
  EXPECT_EQ(bn.options().eps, 1e-5);
  EXPECT_EQ(bn.options().momentum, 0.1);
  EXPECT_TRUE(bn.options().affine);
  EXPECT_TRUE(bn.options().track_running_stats);
  EXPECT_EQ(bn.process_group(), nullptr);
  EXPECT_EQ(bn.str(),
            "SyncBatchNorm(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  std::vector<std::string> keys;
  for (const auto& [key, t] : bn.state_dict()) keys.push_back(key);
  EXPECT_THAT(keys, ::testing::ElementsAre("weight", "bias", "running_mean", "running_var",
                                           "num_batches_tracked"));
  auto copy = std::dynamic_pointer_cast<SyncBatchNorm>(bn.clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->options().num_features, 4);
}

// --- convert_sync_batchnorm ------------------------------------------------------

using sync_batch_norm_testing::ConvertibleResNet18;

struct Snapshot {
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> modules;
  StateDict state;
  std::vector<Tensor> parameters;
};
Snapshot Take(nn::Module& m) { return {m.named_modules(), m.state_dict(), m.parameters()}; }

// What convert_sync_batchnorm must do to `before`'s modules in `after`:
// batch norms become SyncBatchNorms over `group` with the same options,
// flag and tensors; Sequentials holding one are rebuilt; every other module
// is the same object; state_dict keys, tensors and parameters unchanged.
void ExpectConverted(const Snapshot& before, nn::Module& after,
                     const std::shared_ptr<distributed::ProcessGroup>& group) {
  const Snapshot now = Take(after);
  ASSERT_EQ(now.modules.size(), before.modules.size());
  for (size_t i = 0; i < now.modules.size(); ++i) {
    const auto& [name, old_module] = before.modules[i];
    const auto& [new_name, new_module] = now.modules[i];
    EXPECT_EQ(new_name, name);
    if (const auto* bn = dynamic_cast<const nn::BatchNormBase*>(old_module.get())) {
      const auto* sync = dynamic_cast<const SyncBatchNorm*>(new_module.get());
      ASSERT_NE(sync, nullptr) << name << " is a " << new_module->name();
      EXPECT_NE(static_cast<const nn::Module*>(sync), old_module.get()) << name;
      EXPECT_EQ(sync->process_group(), group) << name;
      EXPECT_EQ(sync->options().num_features, bn->options().num_features) << name;
      EXPECT_EQ(sync->options().eps, bn->options().eps) << name;
      EXPECT_EQ(sync->options().momentum, bn->options().momentum) << name;
      EXPECT_EQ(sync->options().affine, bn->options().affine) << name;
      EXPECT_EQ(sync->options().track_running_stats, bn->options().track_running_stats);
      EXPECT_EQ(sync->is_training(), bn->is_training()) << name;
    } else if (typeid(*old_module) == typeid(nn::Sequential) && new_module != old_module) {
      EXPECT_EQ(new_module->name(), "Sequential") << name;
      EXPECT_EQ(new_module->is_training(), old_module->is_training()) << name;
    } else {
      EXPECT_EQ(new_module, old_module) << name << " (" << old_module->name() << ") was replaced";
    }
  }
  ASSERT_EQ(now.state.size(), before.state.size());
  for (size_t i = 0; i < now.state.size(); ++i) {
    EXPECT_EQ(now.state[i].first, before.state[i].first);
    EXPECT_EQ(now.state[i].second.storage().data(), before.state[i].second.storage().data())
        << now.state[i].first << " is not the same tensor";
  }
  ASSERT_EQ(now.parameters.size(), before.parameters.size());
  for (size_t i = 0; i < now.parameters.size(); ++i) {
    EXPECT_TRUE(now.parameters[i].is_same(before.parameters[i])) << "parameter " << i;
  }
}

TEST(ConvertSyncBatchnormTest, ReplacesEveryBatchNormOfAResNetAndKeepsItsState) {
  manual_seed(0);
  auto net = ConvertibleResNet18({.num_classes = 5, .width = 4});
  // Running statistics away from their initial values; one layer in eval mode.
  (*net)(randn({4, 3, 16, 16}));
  net->child("layer2")->children()[0]->child("bn1")->eval();
  net->eval();
  net->child("layer3")->train();
  Tensor x = randn({2, 3, 16, 16});
  Tensor before_output = (*net)(x);  // layer3 in training mode: batch statistics
  const Snapshot before = Take(*net);

  std::shared_ptr<nn::Module> converted = SyncBatchNorm::convert_sync_batchnorm(net);
  EXPECT_EQ(converted, net) << "a ResNet18 takes its converted children in place";
  ExpectConverted(before, *converted, nullptr);
  int sync_layers = 0;
  for (const auto& m : converted->modules())
    sync_layers += dynamic_cast<SyncBatchNorm*>(m.get()) != nullptr;
  EXPECT_EQ(sync_layers, 20);  // bn1, 2 per block, 3 downsamples
  // Without a process group every SyncBatchNorm is BatchNorm: the same output.
  EXPECT_TRUE((*converted)(x).equal(before_output));
  // The structure of nn::models::ResNet18 (torchvision's keys).
  nn::models::ResNet18 plain({.num_classes = 5, .width = 4});
  std::vector<std::string> keys, plain_keys;
  for (const auto& [k, t] : converted->state_dict()) keys.push_back(k);
  for (const auto& [k, t] : plain.state_dict()) plain_keys.push_back(k);
  EXPECT_EQ(keys, plain_keys);
}

TEST(ConvertSyncBatchnormTest, RebuildsSequentialsAndLeavesTheOriginalAlone) {
  auto inner = std::make_shared<nn::Sequential>();
  inner->push_back(std::make_shared<nn::Linear>(6, 6));
  inner->push_back(std::make_shared<nn::BatchNorm1d>(
      nn::BatchNormOptions{.num_features = 6, .eps = 1e-3, .momentum = std::nullopt}));
  auto outer = std::make_shared<nn::Sequential>();
  outer->push_back(std::make_shared<nn::Linear>(4, 6));
  outer->push_back(std::make_shared<nn::BatchNorm1d>(6));
  outer->push_back(std::make_shared<nn::ReLU>());
  outer->push_back(inner);
  int hook_calls = 0;
  outer->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
    ++hook_calls;
    return std::optional<Tensor>();
  });
  const Snapshot before = Take(*outer);

  std::shared_ptr<nn::Module> converted = SyncBatchNorm::convert_sync_batchnorm(outer);
  ASSERT_NE(converted, outer);
  ExpectConverted(before, *converted, nullptr);
  EXPECT_NE(converted->child("3"), inner);
  EXPECT_NE(dynamic_cast<SyncBatchNorm*>(converted->child("3")->child("1").get()), nullptr);
  // The original still holds its batch norms.
  EXPECT_NE(dynamic_cast<nn::BatchNorm1d*>(outer->child("1").get()), nullptr);
  EXPECT_NE(dynamic_cast<nn::BatchNorm1d*>(inner->child("1").get()), nullptr);
  // The hooks came along.
  (*converted)(randn({5, 4}));
  EXPECT_EQ(hook_calls, 1);
  auto copy = converted->clone();
  EXPECT_NE(dynamic_cast<SyncBatchNorm*>(copy->child("1").get()), nullptr);
}

TEST(ConvertSyncBatchnormTest, ConvertsALayerItselfAndASyncBatchNormAgain) {
  auto bn = std::make_shared<nn::BatchNorm2d>(
      nn::BatchNormOptions{.num_features = 5, .affine = false, .track_running_stats = false});
  bn->eval();
  auto converted =
      std::dynamic_pointer_cast<SyncBatchNorm>(SyncBatchNorm::convert_sync_batchnorm(bn));
  ASSERT_NE(converted, nullptr);
  EXPECT_FALSE(converted->is_training());
  EXPECT_FALSE(converted->weight().defined());
  EXPECT_FALSE(converted->running_mean().defined());
  EXPECT_FALSE(converted->options().track_running_stats);
  // A SyncBatchNorm is a batch norm layer too: converted anew, as torch.
  auto again = SyncBatchNorm::convert_sync_batchnorm(converted);
  EXPECT_NE(again, converted);
  EXPECT_NE(dynamic_cast<SyncBatchNorm*>(again.get()), nullptr);
  // Nothing to convert: the module itself.
  auto linear = std::make_shared<nn::Linear>(2, 2);
  EXPECT_EQ(SyncBatchNorm::convert_sync_batchnorm(linear), linear);
  EXPECT_THAT([] { SyncBatchNorm::convert_sync_batchnorm(nullptr); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the module is null")));
}

// A parent whose forward reads its children through the registry.
class Pair : public nn::Cloneable<Pair> {
 public:
  Pair(std::shared_ptr<nn::Module> a, std::shared_ptr<nn::Module> b) : a_(a), b_(b) { reset(); }
  void reset() override {
    register_module("a", a_);
    register_module("b", b_);
  }
  Tensor forward(const Tensor& x) override { return (*child("b"))((*child("a"))(x)); }

 protected:
  bool children_replaceable() const override { return true; }

 private:
  std::shared_ptr<nn::Module> a_, b_;
};

TEST(ConvertSyncBatchnormTest, AParentThatRefusesIsNamedAndNothingChanges) {
  // "a" converts fine (and is put in place first); nn::models' BasicBlock
  // in "b" refuses, so "a" must be put back.
  auto first = std::make_shared<Pair>(std::make_shared<nn::Conv2d>(3, 4, 3, 1, 1),
                                      std::make_shared<nn::BatchNorm2d>(4));
  auto model = std::make_shared<Pair>(first, std::make_shared<nn::models::BasicBlock>(4, 4, 1));
  const Snapshot before = Take(*model);
  EXPECT_THAT([&] { SyncBatchNorm::convert_sync_batchnorm(model); },
              ::testing::ThrowsMessage<Error>(::testing::AllOf(
                  HasSubstr("can't put the converted 'b.bn1' (BatchNorm2d) into its parent 'b' "
                            "(BasicBlock); nothing was converted"),
                  HasSubstr("BasicBlock does not allow replacing its children"))));
  const Snapshot after = Take(*model);
  ASSERT_EQ(after.modules.size(), before.modules.size());
  for (size_t i = 0; i < after.modules.size(); ++i) {
    EXPECT_EQ(after.modules[i].second, before.modules[i].second) << after.modules[i].first;
  }
  // nn::models::ResNet18 itself, for the same reason.
  auto resnet = std::make_shared<nn::models::ResNet18>(nn::models::ResNetOptions{.width = 4});
  EXPECT_THAT([&] { SyncBatchNorm::convert_sync_batchnorm(resnet); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'layer1.0.bn1'")));
  EXPECT_NE(dynamic_cast<nn::BatchNorm2d*>(resnet->child("bn1").get()), nullptr);
}

}  // namespace
}  // namespace ember::parallel
