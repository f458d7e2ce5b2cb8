// ZeroRedundancyOptimizer over real process groups (tcp and gloo, 2 and 3
// ranks as threads; distributed/testing/ranks.h):
// - the partition is torch's sorted-greedy assignment (literal expected
//   shares, one group and two, and after add_param_group);
// - DDP + ZeRO (SGD with momentum, Adam; with and without
//   parameters_as_bucket_view; a StepLR scheduler on it) ends with the
//   parameters of DDP + the plain optimizer, on every rank;
// - each rank's local optimizer holds state for its own share only;
// - consolidate_state_dict / state_dict give the plain optimizer's whole
//   state, which a plain optimizer and a fresh ZeRO load and train on;
// - errors: torch's messages, naming the values.
#include "parallel/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/activation.h"
#include "nn/optim/adam.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace testing = ::ember::distributed::testing;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using nn::optim::OptimizerStateDict;

constexpr int64_t kSteps = 5;
constexpr int64_t kPerRank = 4;

// Linear 16-32-32-32-4 with ReLUs: parameter numels 512, 32, 1024, 32,
// 1024, 32, 128, 4 (positions 0..7).
std::shared_ptr<nn::Sequential> Mlp() {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(16, 32));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(32, 32));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(32, 32));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(32, 4));
  return m;
}

absl::Status Guard(const std::function<absl::Status()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    return absl::InternalError(e.what());
  }
}

// One model's start and the batches of every step, made once on the test's
// thread (the ranks only read them).
struct Problem {
  StateDict init;
  Tensor xs, ys;  // [steps, world * kPerRank, ...]
};
Problem MakeProblem(int world) {
  manual_seed(7);
  Problem p;
  p.init = Mlp()->state_dict();
  p.xs = randn({kSteps, world * kPerRank, 16});
  p.ys = randint(0, 4, {kSteps, world * kPerRank});
  return p;
}

enum class Kind { kSgdMomentum, kAdam };

struct Config {
  std::string backend;
  int world;
  Kind kind;
  bool bucket_view;
};
std::string Name(const Config& c) {
  return absl::StrCat(c.backend, "_", c.world, "ranks_",
                      c.kind == Kind::kAdam ? "adam" : "sgd_momentum",
                      c.bucket_view ? "_bucket_view" : "");
}

void PrintTo(const Config& c, std::ostream* os) { *os << Name(c); }

constexpr nn::optim::SGDOptions kSgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};
constexpr nn::optim::AdamOptions kAdam{.lr = 0.01, .weight_decay = 1e-3};

// Trains steps [from, to) of `p` on rank `me` with `opt` stepping `ddp`'s
// parameters, a StepLR(2, 0.5) driving it.
absl::Status Train(const Problem& p, testing::Rank& me, DistributedDataParallel& ddp,
                   nn::optim::Optimizer& opt, const std::function<absl::Status()>& step,
                   int64_t from = 0, int64_t to = kSteps) {
  nn::optim::StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.5);
  for (int64_t s = from; s < to; ++s) {
    const Tensor x = p.xs[s].narrow(0, me.rank * kPerRank, kPerRank);
    const Tensor y = p.ys[s].narrow(0, me.rank * kPerRank, kPerRank);
    opt.zero_grad();
    nn::functional::cross_entropy(ddp(x), y).backward();
    EMBER_RETURN_IF_ERROR(step());
    sched.step();
  }
  return absl::OkStatus();
}

// What every rank of one run ends with.
struct RankResult {
  StateDict params;
  OptimizerStateDict local_state;  // the ZeRO run: its local optimizer's
  std::vector<std::vector<std::vector<int64_t>>> partition;
};

absl::StatusOr<std::unique_ptr<ZeroRedundancyOptimizer>> MakeZero(
    const Config& c, const std::vector<Tensor>& params, testing::Rank& me) {
  ZeroRedundancyOptimizerOptions options{.process_group = me.group,
                                         .parameters_as_bucket_view = c.bucket_view};
  if (c.kind == Kind::kAdam) {
    return ZeroRedundancyOptimizer::Create<nn::optim::Adam>(params, kAdam, options);
  }
  return ZeroRedundancyOptimizer::Create<nn::optim::SGD>(params, kSgd, options);
}

std::unique_ptr<nn::optim::Optimizer> MakePlain(const Config& c, const std::vector<Tensor>& params) {
  if (c.kind == Kind::kAdam) return std::make_unique<nn::optim::Adam>(params, kAdam);
  return std::make_unique<nn::optim::SGD>(params, kSgd);
}

testing::RunRanksOptions Backend(const std::string& backend) {
  testing::RunRanksOptions options;
  options.backend = backend;
  return options;
}

// DDP + the plain optimizer.
absl::Status RunPlain(const Config& c, const Problem& p, std::vector<RankResult>& out) {
  out.assign(c.world, {});
  return testing::RunRanks(
      c.world,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto net = Mlp();
          EMBER_RETURN_IF_ERROR(net->load_state_dict(p.init));
          EMBER_ASSIGN_OR_RETURN(auto ddp,
                                 DistributedDataParallel::create(net, {.process_group = me.group}));
          auto opt = MakePlain(c, ddp->parameters());
          EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, *opt, [&] {
            opt->step();
            return absl::OkStatus();
          }));
          out[me.rank].params = net->state_dict();
          out[me.rank].local_state = opt->state_dict();
          return absl::OkStatus();
        });
      },
      Backend(c.backend));
}

// DDP + ZeRO.
absl::Status RunZero(const Config& c, const Problem& p, std::vector<RankResult>& out) {
  out.assign(c.world, {});
  return testing::RunRanks(
      c.world,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto net = Mlp();
          EMBER_RETURN_IF_ERROR(net->load_state_dict(p.init));
          EMBER_ASSIGN_OR_RETURN(auto ddp,
                                 DistributedDataParallel::create(net, {.process_group = me.group}));
          EMBER_ASSIGN_OR_RETURN(auto zero, MakeZero(c, ddp->parameters(), me));
          EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, *zero, [&] { return zero->Step(); }));
          out[me.rank].params = net->state_dict();
          out[me.rank].local_state = zero->local_optimizer().state_dict();
          out[me.rank].partition = zero->partition();
          return absl::OkStatus();
        });
      },
      Backend(c.backend));
}

// Largest |a - b| / max(|b|, 1e-3) over every element of every tensor.
double MaxRelDiff(const std::vector<std::pair<std::string, Tensor>>& a,
                  const std::vector<std::pair<std::string, Tensor>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const Tensor x = a[i].second.to(kFloat64), y = b[i].second.to(kFloat64);
    EXPECT_EQ(x.sizes(), y.sizes()) << a[i].first;
    if (x.sizes() != y.sizes()) return INFINITY;
    const Tensor rel = (x - y).abs() / y.abs().clamp(1e-3, std::nullopt);
    worst = std::max(worst, rel.numel() == 0 ? 0.0 : rel.max().item<double>());
  }
  return worst;
}

int64_t CountStateTensors(const OptimizerStateDict& sd) {
  int64_t n = 0;
  for (const auto& ps : sd.state) n += static_cast<int64_t>(ps.values.size());
  return n;
}

// torch's assignment for Mlp()'s parameters in one group (Note [ZeRO
// partition]): sorted 1024 (2), 1024 (4), 512 (0), 128 (6), 32 (1, 3, 5), 4 (7).
std::vector<std::vector<int64_t>> ExpectedShares(int world) {
  if (world == 2) return {{2, 0}, {4, 6, 1, 3, 5, 7}};
  return {{2}, {4}, {0, 6, 1, 3, 5, 7}};
}

class ZeroMatchesPlainTest : public ::testing::TestWithParam<Config> {};

TEST_P(ZeroMatchesPlainTest, FinalParametersAndStateShares) {
  const Config c = GetParam();
  const Problem p = MakeProblem(c.world);
  std::vector<RankResult> plain, zero;
  absl::Status s = RunPlain(c, p, plain);
  ASSERT_TRUE(s.ok()) << s;
  s = RunZero(c, p, zero);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<std::vector<int64_t>> shares = ExpectedShares(c.world);
  for (int r = 0; r < c.world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const double diff = MaxRelDiff(zero[r].params, plain[0].params);
    EXPECT_LE(diff, 1e-6);
    // The training moved the parameters.
    EXPECT_GT(MaxRelDiff(zero[r].params, p.init), 1e-3);
    // The partition, as torch assigns it.
    ASSERT_EQ(zero[r].partition.size(), static_cast<size_t>(c.world));
    for (int q = 0; q < c.world; ++q) {
      ASSERT_EQ(zero[r].partition[q].size(), 1u);
      EXPECT_EQ(zero[r].partition[q][0], shares[q]) << "rank " << q << "'s share";
    }
    // State only for this rank's share: one momentum buffer per parameter
    // (SGD), step + exp_avg + exp_avg_sq (Adam).
    const int64_t per_param = c.kind == Kind::kAdam ? 3 : 1;
    EXPECT_EQ(zero[r].local_state.state.size(), shares[r].size());
    EXPECT_EQ(CountStateTensors(zero[r].local_state),
              per_param * static_cast<int64_t>(shares[r].size()));
  }
  EXPECT_EQ(CountStateTensors(plain[0].local_state), (c.kind == Kind::kAdam ? 3 : 1) * 8);
}

std::vector<Config> AllConfigs() {
  std::vector<Config> out;
  for (const char* backend : {"tcp", "gloo"}) {
    for (int world : {2, 3}) {
      for (Kind kind : {Kind::kSgdMomentum, Kind::kAdam}) {
        for (bool view : {false, true}) out.push_back({backend, world, kind, view});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, ZeroMatchesPlainTest, ::testing::ValuesIn(AllConfigs()),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return Name(info.param);
                         });

TEST(ZeroPartitionTest, TwoGroupsCarryTheSizesOver) {
  // Group 0: positions 0 (512), 1 (32); group 1: 2 (1024), 3 (32), 4 (1024),
  // 5 (32), 6 (128), 7 (4). Group 0: 0 -> rank 0, 1 -> rank 1; group 1 in
  // order 2, 4, 6, 3, 5, 7: 2 -> rank 1 (32 < 512), 4 -> rank 0, the rest
  // -> rank 1.
  std::vector<std::vector<std::vector<int64_t>>> got(2);
  absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto net = Mlp();
      const std::vector<Tensor> ps = net->parameters();
      std::vector<nn::optim::SGD::ParamGroup> groups;
      groups.push_back({{ps[0], ps[1]}, {.lr = 0.1}});
      groups.push_back({{ps[2], ps[3], ps[4], ps[5], ps[6], ps[7]}, {.lr = 0.01}});
      EMBER_ASSIGN_OR_RETURN(auto zero, ZeroRedundancyOptimizer::Create<nn::optim::SGD>(
                                            std::move(groups), {.process_group = me.group}));
      got[me.rank] = zero->partition()[me.rank];
      if (zero->owner(4) != 0 || zero->owner(2) != 1) {
        return absl::InternalError("owner() disagrees with partition()");
      }
      if (zero->local_optimizer().num_param_groups() != 2 || zero->num_param_groups() != 2 ||
          zero->params(1).size() != 6 || zero->lr(0) != 0.1 || zero->lr(1) != 0.01) {
        return absl::InternalError("the groups are not the whole optimizer's");
      }
      return absl::OkStatus();
    });
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(got[0], ElementsAre(ElementsAre(0), ElementsAre(4)));
  EXPECT_THAT(got[1], ElementsAre(ElementsAre(1), ElementsAre(2, 6, 3, 5, 7)));
}

TEST(ZeroAddParamGroupTest, RepartitionsAndTrainsAsPlainSgd) {
  // Created with group 0, then group 1 added: the partition of the two-group
  // case above, and training as a plain SGD with both groups.
  const Problem p = MakeProblem(2);
  std::vector<StateDict> zero_params(2), plain_params(2);
  std::vector<std::vector<std::vector<int64_t>>> got(2);
  for (bool use_zero : {false, true}) {
    for (bool view : {false, true}) {
      if (!use_zero && view) continue;
      absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto net = Mlp();
          EMBER_RETURN_IF_ERROR(net->load_state_dict(p.init));
          EMBER_ASSIGN_OR_RETURN(auto ddp,
                                 DistributedDataParallel::create(net, {.process_group = me.group}));
          const std::vector<Tensor> ps = ddp->parameters();
          const std::vector<Tensor> first = {ps[0], ps[1]};
          const std::vector<Tensor> rest = {ps[2], ps[3], ps[4], ps[5], ps[6], ps[7]};
          if (!use_zero) {
            nn::optim::SGD opt(first, {.lr = 0.1, .momentum = 0.9});
            opt.add_param_group(rest, {.lr = 0.02, .momentum = 0.5});
            EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, opt, [&] {
              opt.step();
              return absl::OkStatus();
            }));
            plain_params[me.rank] = net->state_dict();
            return absl::OkStatus();
          }
          EMBER_ASSIGN_OR_RETURN(
              auto zero, ZeroRedundancyOptimizer::Create<nn::optim::SGD>(
                             first, {.lr = 0.1, .momentum = 0.9},
                             {.process_group = me.group, .parameters_as_bucket_view = view}));
          EMBER_RETURN_IF_ERROR(
              zero->add_param_group<nn::optim::SGD>(rest, {.lr = 0.02, .momentum = 0.5}));
          got[me.rank] = zero->partition()[me.rank];
          EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, *zero, [&] { return zero->Step(); }));
          zero_params[me.rank] = net->state_dict();
          return absl::OkStatus();
        });
      });
      ASSERT_TRUE(s.ok()) << s;
      if (use_zero) {
        EXPECT_THAT(got[0], ElementsAre(ElementsAre(0), ElementsAre(4)));
        EXPECT_THAT(got[1], ElementsAre(ElementsAre(1), ElementsAre(2, 6, 3, 5, 7)));
        for (int r = 0; r < 2; ++r) EXPECT_LE(MaxRelDiff(zero_params[r], plain_params[0]), 1e-6);
      }
    }
  }
}

TEST(ZeroBucketViewTest, ParametersAreViewsOfTheirRanksBucket) {
  absl::Status s = testing::RunRanks(3, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto net = Mlp();
      const std::vector<Tensor> ps = net->parameters();
      EMBER_ASSIGN_OR_RETURN(auto zero,
                             ZeroRedundancyOptimizer::Create<nn::optim::SGD>(
                                 ps, {.lr = 0.1},
                                 {.process_group = me.group, .parameters_as_bucket_view = true}));
      const auto& buckets = zero->buckets();
      if (buckets.size() != 1 || buckets[0].size() != 3) {
        return absl::InternalError(absl::StrCat("expected 1x3 buckets, got ", buckets.size()));
      }
      // Shares at 3 ranks: {2}, {4}, {0, 6, 1, 3, 5, 7}.
      const int64_t expected[3] = {1024, 1024, 512 + 128 + 32 * 3 + 4};
      for (int r = 0; r < 3; ++r) {
        if (buckets[0][r].numel() != expected[r]) {
          return absl::InternalError(absl::StrCat("bucket of rank ", r, " has ",
                                                  buckets[0][r].numel(), " elements"));
        }
      }
      // Rank 2's bucket starts with parameter 0 then 6: writing the bucket
      // writes the parameters.
      buckets[0][2].fill_(3.0);
      if (ps[0].sum().item<double>() != 3.0 * 512 || ps[7].sum().item<double>() != 3.0 * 4) {
        return absl::InternalError("the parameters are not views of their bucket");
      }
      // A parameter that stops requiring grad leaves its bucket at the next step.
      ps[6].requires_grad_(false);
      for (size_t i = 0; i < ps.size(); ++i) {
        if (i != 6) ps[i].set_grad(zeros_like(ps[i]));
      }
      EMBER_RETURN_IF_ERROR(zero->Step());
      if (zero->buckets()[0][2].numel() != 512 + 32 * 3 + 4) {
        return absl::InternalError(absl::StrCat("rebuilt bucket of rank 2 has ",
                                                zero->buckets()[0][2].numel(), " elements"));
      }
      zero->buckets()[0][2].fill_(5.0);
      if (ps[6].sum().item<double>() != 3.0 * 128 || ps[0].sum().item<double>() != 5.0 * 512) {
        return absl::InternalError("parameter 6 still shares its old bucket");
      }
      return absl::OkStatus();
    });
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Adam at 3 ranks: consolidate on rank 1, compare with the plain optimizer's
// state, load into a plain Adam and into a fresh ZeRO, train both 3 more steps.
TEST(ZeroStateDictTest, ConsolidateLoadAndContinue) {
  const Config c{"gloo", 3, Kind::kAdam, false};
  const Problem p = MakeProblem(3);
  std::vector<RankResult> plain;
  absl::Status s = RunPlain(c, p, plain);
  ASSERT_TRUE(s.ok()) << s;
  // The reference: plain Adam, trained kSteps, then 3 more on the first batches.
  std::vector<StateDict> resumed_plain(3), resumed_zero(3);
  OptimizerStateDict whole;
  std::string unconsolidated_error;
  s = testing::RunRanks(
      3,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto net = Mlp();
          EMBER_RETURN_IF_ERROR(net->load_state_dict(p.init));
          EMBER_ASSIGN_OR_RETURN(auto ddp,
                                 DistributedDataParallel::create(net, {.process_group = me.group}));
          EMBER_ASSIGN_OR_RETURN(auto zero, MakeZero(c, ddp->parameters(), me));
          EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, *zero, [&] { return zero->Step(); }));
          EMBER_RETURN_IF_ERROR(zero->consolidate_state_dict(/*to=*/1));
          if (me.rank == 1) {
            whole = zero->state_dict();
          } else {
            try {
              (void)zero->state_dict();
              return absl::InternalError("state_dict() off the target rank did not throw");
            } catch (const Error& e) {
              if (me.rank == 2) unconsolidated_error = e.what();
            }
          }
          return absl::OkStatus();
        });
      },
      Backend("gloo"));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(unconsolidated_error,
              HasSubstr("Optimizer state has not been consolidated on this rank. Please call "
                        "`consolidate_state_dict(to=2)` on all ranks beforehand"));
  // The plain optimizer's whole state: same entries, same values.
  const OptimizerStateDict& want = plain[0].local_state;
  ASSERT_EQ(whole.state.size(), want.state.size());
  for (size_t i = 0; i < want.state.size(); ++i) {
    EXPECT_EQ(whole.state[i].index, want.state[i].index);
    EXPECT_LE(MaxRelDiff(whole.state[i].values, want.state[i].values), 1e-6) << i;
  }
  ASSERT_EQ(whole.param_groups.size(), 1u);
  EXPECT_THAT(whole.param_groups[0].params, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(whole.param_groups[0].options, want.param_groups[0].options);  // lr after StepLR too

  // Resume from the end state: a plain Adam loading ZeRO's dict, a ZeRO
  // loading the plain optimizer's dict; both train steps 0..2 again.
  s = testing::RunRanks(
      3,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          for (bool use_zero : {false, true}) {
            auto net = Mlp();
            EMBER_RETURN_IF_ERROR(net->load_state_dict(plain[0].params));
            EMBER_ASSIGN_OR_RETURN(
                auto ddp, DistributedDataParallel::create(net, {.process_group = me.group}));
            if (use_zero) {
              EMBER_ASSIGN_OR_RETURN(auto zero, MakeZero(c, ddp->parameters(), me));
              EMBER_RETURN_IF_ERROR(zero->load_state_dict(want));
              if (CountStateTensors(zero->local_optimizer().state_dict()) !=
                  3 * static_cast<int64_t>(ExpectedShares(3)[me.rank].size())) {
                return absl::InternalError("load_state_dict took more than this rank's share");
              }
              EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, *zero, [&] { return zero->Step(); }, 0, 3));
              resumed_zero[me.rank] = net->state_dict();
            } else {
              nn::optim::Adam opt(ddp->parameters(), kAdam);
              EMBER_RETURN_IF_ERROR(opt.load_state_dict(whole));
              EMBER_RETURN_IF_ERROR(Train(p, me, *ddp, opt, [&] {
                opt.step();
                return absl::OkStatus();
              }, 0, 3));
              resumed_plain[me.rank] = net->state_dict();
            }
          }
          return absl::OkStatus();
        });
      },
      Backend("gloo"));
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_LE(MaxRelDiff(resumed_zero[r], resumed_plain[0]), 1e-6) << "rank " << r;
  }
  EXPECT_GT(MaxRelDiff(resumed_plain[0], plain[0].params), 1e-4);
}

TEST(ZeroErrorsTest, RefusesBadArgumentsWithTorchsMessages) {
  absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      const ZeroRedundancyOptimizerOptions options{.process_group = me.group};
      auto expect = [](const absl::Status& got, absl::StatusCode code,
                       const std::string& text) -> absl::Status {
        if (got.code() != code || got.message().find(text) == std::string::npos) {
          return absl::InternalError(absl::StrCat("expected \"", text, "\", got ", got.ToString()));
        }
        return absl::OkStatus();
      };
      auto empty_params =
          ZeroRedundancyOptimizer::Create<nn::optim::SGD>(std::vector<Tensor>{}, {}, options);
      EMBER_RETURN_IF_ERROR(expect(empty_params.status(), absl::StatusCode::kInvalidArgument,
                                   "ZeroRedundancyOptimizer got an empty parameter list"));
      Tensor a = zeros({4}, TensorOptions().requires_grad(true));
      Tensor b = zeros({4}, TensorOptions().dtype(kFloat64).requires_grad(true));
      auto mixed = ZeroRedundancyOptimizer::Create<nn::optim::SGD>({a, b}, {}, options);
      EMBER_RETURN_IF_ERROR(
          expect(mixed.status(), absl::StatusCode::kInvalidArgument,
                 "ZeroRedundancyOptimizer only supports using the same dense type for all "
                 "parameters but got both torch.FloatTensor and torch.DoubleTensor"));
      auto twice = ZeroRedundancyOptimizer::Create<nn::optim::SGD>({a, a}, {}, options);
      EMBER_RETURN_IF_ERROR(
          expect(twice.status(), absl::StatusCode::kInvalidArgument, "positions 0 and 1"));
      auto overlap = ZeroRedundancyOptimizer::Create<nn::optim::SGD>(
          {a}, {}, {.process_group = me.group, .overlap_with_ddp = true});
      EMBER_RETURN_IF_ERROR(
          expect(overlap.status(), absl::StatusCode::kUnimplemented, "overlap_with_ddp"));
      auto bad_lr = ZeroRedundancyOptimizer::Create<nn::optim::SGD>({a}, {.lr = -0.1}, options);
      EMBER_RETURN_IF_ERROR(expect(bad_lr.status(), absl::StatusCode::kInvalidArgument,
                                   "Invalid learning rate: -0.1"));

      Tensor c = zeros({8}, TensorOptions().requires_grad(true));
      EMBER_ASSIGN_OR_RETURN(auto zero,
                             ZeroRedundancyOptimizer::Create<nn::optim::SGD>({a, c}, {}, options));
      try {
        (void)zero->state_dict();
        return absl::InternalError("state_dict() before consolidate_state_dict did not throw");
      } catch (const Error& e) {
        EMBER_RETURN_IF_ERROR(expect(absl::InternalError(e.what()), absl::StatusCode::kInternal,
                                     absl::StrCat("Please call `consolidate_state_dict(to=",
                                                  me.rank, ")` on all ranks beforehand")));
      }
      EMBER_RETURN_IF_ERROR(expect(zero->consolidate_state_dict(2),
                                   absl::StatusCode::kInvalidArgument, "to=2"));
      EMBER_RETURN_IF_ERROR(expect(zero->add_param_group<nn::optim::Adam>({b}, {}),
                                   absl::StatusCode::kInvalidArgument, "another optimizer type"));
      EMBER_RETURN_IF_ERROR(expect(zero->add_param_group<nn::optim::SGD>({c}, {}),
                                   absl::StatusCode::kInvalidArgument,
                                   "some parameters appear in more than one parameter group"));
      EMBER_RETURN_IF_ERROR(expect(zero->add_param_group<nn::optim::SGD>({b}, {}),
                                   absl::StatusCode::kInvalidArgument,
                                   "torch.FloatTensor and torch.DoubleTensor"));
      OptimizerStateDict two_groups;
      two_groups.param_groups.resize(2);
      EMBER_RETURN_IF_ERROR(expect(zero->load_state_dict(two_groups),
                                   absl::StatusCode::kInvalidArgument,
                                   "different number of parameter groups (2 vs 1)"));
      // The group still works after the refusals.
      a.set_grad(ones({4}));
      c.set_grad(ones({8}));
      return zero->Step();
    });
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ember::parallel
