// DDP communication hooks (parallel/comm_hooks.h, Note [Communication
// hooks] in parallel/reducer.h) over real process groups, ranks as threads
// (distributed/testing/ranks.h):
// - against PyTorch 2.x: DDP with each built-in hook, 2 ranks over gloo, the
//   same MLP and batches (testdata/torch_comm_hooks.py writes the model,
//   the batches and its final parameters); Ember's final parameters must
//   equal torch's (float32 hooks within 1e-5; fp16 / bf16 within their
//   rounding, most elements within 1e-6);
// - properties that hold whatever torch does: allreduce_hook is bit for bit
//   DDP without a hook; PowerSGD reproduces a rank-1 gradient exactly and
//   feeds back what it lost; a user's hook sees the buckets and chains
//   collectives;
// - errors: a second hook, a hook that throws, returns a null future, a
//   failing future or a tensor of the wrong size, bad PowerSGD options.
#include "parallel/comm_hooks.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/rank_testing.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

using ::ember::parallel::rank_testing::Guard;
using ::ember::parallel::rank_testing::Get;

namespace testing = ::ember::distributed::testing;
namespace hooks = comm_hooks;
using ::testing::HasSubstr;

// torch_comm_hooks.py's model: Linear 16-32-32-32-4 with ReLUs.
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

// torch's run, once per test binary.
const rank_testing::TorchRun& Torch() {
  return rank_testing::RunTorchOnce("parallel/testdata/torch_comm_hooks.py", "torch_comm_hooks");
}

using HookFactory = std::function<absl::StatusOr<CommHook>()>;

// Trains torch's model on torch's batches at 2 ranks over gloo with the hook
// `make` builds (none when null), 6 SGD steps of lr 0.1; rank 0's final
// state in `final_state`.
absl::Status TrainLikeTorch(const HookFactory& make, StateDict& final_state) {
  const std::string dir = Torch().dir;
  EMBER_ASSIGN_OR_RETURN(const StateDict init, load(dir + "/init.pt"));
  EMBER_ASSIGN_OR_RETURN(const StateDict data, load(dir + "/data.pt"));
  const Tensor xs = Get(data, "x");
  const Tensor ys = Get(data, "y");
  if (!xs.defined() || !ys.defined()) return absl::InternalError("data.pt has no x or y");
  testing::RunRanksOptions options;
  options.backend = "gloo";
  return testing::RunRanks(
      2,
      [&](testing::Rank& me) {
        return Guard([&]() -> absl::Status {
          auto net = Mlp();
          EMBER_RETURN_IF_ERROR(net->load_state_dict(init));
          EMBER_ASSIGN_OR_RETURN(auto ddp,
                                 DistributedDataParallel::create(net, {.process_group = me.group}));
          if (make) {
            EMBER_ASSIGN_OR_RETURN(CommHook hook, make());
            EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(std::move(hook)));
          }
          nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
          const int64_t per = xs.size(1) / 2;
          for (int64_t step = 0; step < xs.size(0); ++step) {
            const Tensor x = xs[step].narrow(0, me.rank * per, per);
            const Tensor y = ys[step].narrow(0, me.rank * per, per);
            opt.zero_grad();
            nn::functional::cross_entropy((*ddp)(x), y).backward();
            opt.step();
          }
          if (me.rank == 0) final_state = net->state_dict();
          return absl::OkStatus();
        });
      },
      options);
}

struct Agreement {
  double max_diff = 0;          // largest |ember - torch| over every parameter
  double close_fraction = 0;    // elements within 1e-6 (relative, floor 1e-3)
  bool differs_from_plain = false;
};

Agreement Compare(const StateDict& ours, const StateDict& theirs, const StateDict& plain) {
  Agreement a;
  int64_t total = 0, close = 0;
  for (const auto& [name, t] : theirs) {
    const Tensor o = Get(ours, name).to(kFloat64), w = t.to(kFloat64);
    const Tensor diff = (o - w).abs();
    a.max_diff = std::max(a.max_diff, diff.max().item<double>());
    const Tensor near = diff.le(w.abs().clamp(1e-3, std::nullopt).mul(1e-6));
    close += near.sum().item<int64_t>();
    total += w.numel();
    if (!Get(plain, name).equal(Get(ours, name))) a.differs_from_plain = true;
  }
  a.close_fraction = total > 0 ? static_cast<double>(close) / static_cast<double>(total) : 0;
  return a;
}

class TorchHooksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const rank_testing::TorchRun& run = Torch();
    if (absl::IsNotFound(run.status)) GTEST_SKIP() << run.status.message();
    ASSERT_TRUE(run.status.ok()) << run.status;
  }
  // Trains with `make`, and checks against torch's `name` run.
  void ExpectTorchs(const std::string& name, const HookFactory& make, double tolerance,
                    double min_close_fraction) {
    StateDict ours, plain;
    ASSERT_TRUE(TrainLikeTorch(make, ours).ok());
    ASSERT_TRUE(TrainLikeTorch(nullptr, plain).ok());
    absl::StatusOr<StateDict> theirs = load(Torch().dir + "/final_" + name + ".pt");
    ASSERT_TRUE(theirs.ok()) << theirs.status();
    const Agreement a = Compare(ours, *theirs, plain);
    std::printf("%s: max |ember - torch| %.3g, %.4f of the elements within 1e-6\n", name.c_str(),
                a.max_diff, a.close_fraction);
    EXPECT_LE(a.max_diff, tolerance) << name;
    EXPECT_GE(a.close_fraction, min_close_fraction) << name;
    if (name != "none" && name != "allreduce") {
      EXPECT_TRUE(a.differs_from_plain) << name << " trained exactly as DDP without a hook";
    }
  }
};

TEST_F(TorchHooksTest, NoHookAndAllreduceHookAreTorchs) {
  ExpectTorchs("none", nullptr, 1e-6, 0.99);
  ExpectTorchs("allreduce", [] { return absl::StatusOr<CommHook>(hooks::allreduce_hook()); },
               1e-6, 0.99);
}

TEST_F(TorchHooksTest, Fp16AndBf16CompressionAreTorchs) {
  // A gradient element on the edge of a half-precision rounding may land on
  // the other side (torch's float32 products are MKL's, Ember's OpenBLAS's):
  // that element then differs by the rounding step times the learning rate.
  ExpectTorchs("fp16", [] { return absl::StatusOr<CommHook>(hooks::fp16_compress_hook()); },
               1e-5, 0.99);
  ExpectTorchs("bf16", [] { return absl::StatusOr<CommHook>(hooks::bf16_compress_hook()); },
               1e-5, 0.99);
}

HookFactory PowerSgd(hooks::PowerSGDOptions options) {
  return [options]() -> absl::StatusOr<CommHook> {
    EMBER_ASSIGN_OR_RETURN(auto state, hooks::PowerSGDState::create(nullptr, options));
    return hooks::powerSGD_hook(state);
  };
}

TEST_F(TorchHooksTest, PowerSgdIsTorchsAtRanksOneTwoAndFour) {
  ExpectTorchs("psgd1", PowerSgd({.matrix_approximation_rank = 1, .start_powerSGD_iter = 2}),
               1e-6, 0.99);
  // Rank 4: Householder QR (LAPACK) in place of Gram-Schmidt.
  ExpectTorchs("psgd4", PowerSgd({.matrix_approximation_rank = 4, .start_powerSGD_iter = 2}),
               1e-6, 0.99);
  // Fresh random Qs every iteration, no error feedback: the seeds torch
  // draws from numpy's generator, and torch's normal draws.
  ExpectTorchs("psgd2_cold",
               PowerSgd({.matrix_approximation_rank = 2,
                         .start_powerSGD_iter = 1,
                         .use_error_feedback = false,
                         .warm_start = false,
                         .random_seed = 7}),
               1e-6, 0.99);
  ExpectTorchs("psgd1_batched",
               PowerSgd({.matrix_approximation_rank = 1,
                         .start_powerSGD_iter = 3,
                         .batch_tensors_with_same_shape = true}),
               1e-6, 0.99);
}

// --- Properties --------------------------------------------------------------

// allreduce_hook does what DDP does without a hook: bit for bit at 2 ranks
// (a + b in any order); at 3, within float32 rounding (without a hook the
// control values ride in the bucket, so the ring cuts it elsewhere).
class AllreduceHookTest : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, AllreduceHookTest, ::testing::Values(2, 3));

TEST_P(AllreduceHookTest, IsTheBuiltInReduction) {
  const int world = GetParam();
  std::vector<StateDict> with(world), without(world);
  for (bool use_hook : {false, true}) {
    absl::Status s = testing::RunRanks(world, [&](testing::Rank& me) {
      return Guard([&]() -> absl::Status {
        manual_seed(5);
        auto net = Mlp();
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(net, {.process_group = me.group}));
        if (use_hook) EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(hooks::allreduce_hook()));
        nn::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
        Generator gen(40 + me.rank);
        for (int step = 0; step < 3; ++step) {
          opt.zero_grad();
          nn::functional::cross_entropy((*ddp)(randn({5, 16}, {}, &gen)),
                                        randint(0, 4, {5}, {}, &gen))
              .backward();
          opt.step();
        }
        (use_hook ? with : without)[me.rank] = net->state_dict();
        return absl::OkStatus();
      });
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const auto& [name, t] : without[0]) {
    if (world == 2) {
      EXPECT_TRUE(t.equal(Get(with[0], name))) << name;
    } else {
      EXPECT_LT((t - Get(with[0], name)).abs().max().item<double>(), 1e-6) << name;
    }
    EXPECT_TRUE(Get(with[1], name).equal(Get(with[0], name))) << name;
  }
}

// A model of one bias-free Linear whose gradient on every rank is the same
// rank-1 matrix u v^T: PowerSGD of rank 1 reproduces it exactly (P Q^T is the
// best rank-1 approximation), so the error feedback is zero.
TEST(CommHooksTest, PowerSgdOfRankOneIsExactOnARankOneGradient) {
  absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto fc = std::make_shared<nn::Linear>(24, 16, /*bias=*/false);
      EMBER_ASSIGN_OR_RETURN(auto ddp,
                             DistributedDataParallel::create(fc, {.process_group = me.group}));
      EMBER_ASSIGN_OR_RETURN(auto state, hooks::PowerSGDState::create(
                                             nullptr, {.start_powerSGD_iter = 2}));
      EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(hooks::powerSGD_hook(state)));
      // loss = sum(W x) with one input row x: dL/dW = 1 x^T, rank 1.
      const Tensor x = arange(24, TensorOptions().dtype(kFloat32)).add(1).div(24).unsqueeze(0);
      for (int step = 0; step < 4; ++step) {
        fc->zero_grad();
        (*ddp)(x).sum().backward();
        const Tensor want = ones({16, 1}).mm(x);
        const double diff = (fc->weight().grad() - want).abs().max().item<double>();
        if (!(diff < 1e-5)) {
          return absl::InternalError(absl::StrCat("step ", step, ": gradient off by ", diff));
        }
      }
      if (state->iter() != 4) return absl::InternalError(absl::StrCat("iter ", state->iter()));
      const auto stats = state->compression_stats();
      // 16 x 24 = 384 elements sent as (16 + 24) = 40, twice (iterations 2, 3).
      if (stats.numel_before_compression != 768 || stats.numel_after_compression != 80) {
        return absl::InternalError(absl::StrCat("stats ", stats.numel_before_compression, " / ",
                                                stats.numel_after_compression));
      }
      return absl::OkStatus();
    });
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A rank-2 gradient compressed at rank 1 loses its second component. With
// error feedback, what is lost is added to the next iteration's gradient,
// so over many iterations the average delivered gradient converges to the
// true one (sum of deliveries = T g - the last error); without it, the
// average stays off by the lost component.
TEST(CommHooksTest, PowerSgdErrorFeedbackMakesTheAverageGradientTheTrueOne) {
  // The largest difference between the true gradient and the average of
  // what 60 PowerSGD iterations delivered, over the true gradient's size.
  auto average_error = [](bool error_feedback) {
    std::vector<double> result(2, -1);
    absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
      return Guard([&]() -> absl::Status {
        auto fc = std::make_shared<nn::Linear>(12, 10, /*bias=*/false);
        EMBER_ASSIGN_OR_RETURN(auto ddp,
                               DistributedDataParallel::create(fc, {.process_group = me.group}));
        EMBER_ASSIGN_OR_RETURN(
            auto state, hooks::PowerSGDState::create(
                            nullptr, {.start_powerSGD_iter = 2, .use_error_feedback = error_feedback}));
        EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(hooks::powerSGD_hook(state)));
        Generator gen(3);
        // loss = sum(c * (x W^T)): dL/dW = c^T x, of rank 2.
        const Tensor x = randn({2, 12}, {}, &gen), c = randn({2, 10}, {}, &gen);
        const Tensor truth = c.t().mm(x);
        Tensor delivered = zeros({10, 12});
        constexpr int kPlain = 2, kCompressed = 60;
        for (int step = 0; step < kPlain + kCompressed; ++step) {
          fc->zero_grad();
          (*ddp)(x).mul(c).sum().backward();
          const Tensor g = fc->weight().grad();
          if (step < kPlain) {
            if (!(g - truth).abs().max().le(1e-5).item<bool>()) {
              return absl::InternalError("the plain iterations are not the average gradient");
            }
            continue;
          }
          if (step == kPlain && (g - truth).abs().max().item<double>() < 1e-3) {
            return absl::InternalError("a rank-1 approximation reproduced a rank-2 gradient");
          }
          delivered = delivered.add(g);
        }
        result[me.rank] = (delivered.div(kCompressed) - truth).abs().max().item<double>() /
                          truth.abs().max().item<double>();
        return absl::OkStatus();
      });
    });
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(result[0], result[1]);
    return result[0];
  };
  const double with = average_error(true), without = average_error(false);
  EXPECT_LT(with, 0.05);
  EXPECT_GT(without, 0.2);
}

// A user hook: it sees every bucket once per iteration in index order, with
// gradients that are views of the buffer, and may chain collectives.
TEST(CommHooksTest, AUserHookChainsCollectivesAndSeesTheBuckets) {
  absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      manual_seed(1);
      auto net = Mlp();
      EMBER_ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::create(
                                           net, {.process_group = me.group, .bucket_cap_mb = 0.002}));
      std::vector<size_t> seen;
      distributed::ProcessGroup* group = me.group.get();
      EMBER_RETURN_IF_ERROR(ddp->register_comm_hook([&seen, group](GradBucket& bucket)
                                                        -> std::shared_ptr<distributed::Future> {
        seen.push_back(bucket.index());
        EMBER_CHECK(!bucket.gradients().empty(), "no gradients");
        EMBER_CHECK(bucket.gradients()[0].raw_data() == bucket.buffer().raw_data(),
                    "the first gradient is not a view of the buffer's start");
        const Tensor buffer = bucket.buffer();
        // Sum, then (a second collective) multiply by 0.5 = average.
        auto work = group->allreduce(buffer);
        EMBER_CHECK(work.ok(), work.status().ToString());
        return (*work)->get_future()->then_async(
            [group](const distributed::Future& f)
                -> absl::StatusOr<std::shared_ptr<distributed::Future>> {
              Tensor half = f.value()[0].mul(0.5);
              EMBER_ASSIGN_OR_RETURN(auto w, group->broadcast(half, {.root = 0}));
              return w->get_future();
            });
      }));
      const size_t buckets = ddp->get_ddp_logging_data().bucket_bytes.size();
      if (buckets < 3) return absl::InternalError(absl::StrCat(buckets, " buckets"));
      auto reference = Mlp();
      EMBER_RETURN_IF_ERROR(reference->load_state_dict(net->state_dict()));
      Generator gen(9);
      const Tensor x = randn({4, 16}, {}, &gen), y = randint(0, 4, {4}, {}, &gen);
      nn::functional::cross_entropy((*ddp)(x.narrow(0, 2 * me.rank, 2)),
                                    y.narrow(0, 2 * me.rank, 2))
          .backward();
      nn::functional::cross_entropy((*reference)(x), y).backward();
      for (size_t b = 0; b < buckets; ++b) {
        if (seen.size() != buckets || seen[b] != b) return absl::InternalError("bucket order");
      }
      const auto ours = net->named_parameters(), theirs = reference->named_parameters();
      for (size_t i = 0; i < ours.size(); ++i) {
        const double d = (ours[i].second.grad() - theirs[i].second.grad()).abs().max().item<double>();
        if (!(d < 1e-5)) return absl::InternalError(absl::StrCat(ours[i].first, " off by ", d));
      }
      return absl::OkStatus();
    });
  });
  EXPECT_TRUE(s.ok()) << s;
}

// --- Errors --------------------------------------------------------------------

// Runs one backward at 2 ranks with `hook`; each rank's error.
std::vector<absl::Status> BackwardWith(CommHook hook) {
  return testing::RunRanksEach(2, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      manual_seed(1);
      auto net = Mlp();
      EMBER_ASSIGN_OR_RETURN(auto ddp,
                             DistributedDataParallel::create(net, {.process_group = me.group}));
      EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(hook));
      (*ddp)(ones({2, 16})).sum().backward();
      return absl::OkStatus();
    });
  });
}

TEST(CommHooksTest, AHookThatFailsFailsBackwardNamingTheBucket) {
  auto expect_all = [](const std::vector<absl::Status>& results, const std::string& text) {
    for (const absl::Status& s : results) {
      EXPECT_THAT(std::string(s.message()), HasSubstr(text));
      EXPECT_THAT(std::string(s.message()), HasSubstr("communication hook of bucket 0"));
    }
  };
  expect_all(BackwardWith([](GradBucket&) -> std::shared_ptr<distributed::Future> {
               EMBER_FAIL("no network today");
             }),
             "no network today");
  expect_all(BackwardWith([](GradBucket&) { return std::shared_ptr<distributed::Future>(); }),
             "returned a null future");
  expect_all(BackwardWith([](GradBucket&) {
               return distributed::Future::Failed(absl::UnavailableError("peer gone"));
             }),
             "peer gone");
  expect_all(BackwardWith([](GradBucket& b) {
               return distributed::Future::Completed({b.buffer().narrow(0, 0, 3)});
             }),
             "must complete with one tensor of the bucket's size");
}

TEST(CommHooksTest, OneHookPerModule) {
  absl::Status s = testing::RunRanks(2, [&](testing::Rank& me) {
    return Guard([&]() -> absl::Status {
      auto net = Mlp();
      EMBER_ASSIGN_OR_RETURN(auto ddp,
                             DistributedDataParallel::create(net, {.process_group = me.group}));
      EMBER_RETURN_IF_ERROR(ddp->register_comm_hook(hooks::allreduce_hook()));
      const absl::Status again = ddp->register_comm_hook(hooks::fp16_compress_hook());
      if (!absl::IsFailedPrecondition(again) ||
          std::string(again.message()).find("only be called once") == std::string::npos) {
        return absl::InternalError(absl::StrCat("second hook: ", again.ToString()));
      }
      if (!absl::IsInvalidArgument(ddp->register_comm_hook(CommHook()))) {
        return absl::InternalError("an empty hook was accepted");
      }
      return absl::OkStatus();
    });
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CommHooksTest, BadPowerSgdOptionsAreRefusedNamingThem) {
  auto message = [](hooks::PowerSGDOptions o) {
    return std::string(hooks::PowerSGDState::create(nullptr, o).status().message());
  };
  EXPECT_THAT(message({.matrix_approximation_rank = 0}),
              HasSubstr("matrix_approximation_rank must be at least 1, got 0"));
  EXPECT_THAT(message({.start_powerSGD_iter = 1}),
              HasSubstr("expected start_powerSGD_iter > 1 when use_error_feedback or "
                        "warm_start is on, got 1"));
  EXPECT_THAT(message({.min_compression_rate = 0}), HasSubstr("min_compression_rate"));
  EXPECT_THAT(message({.orthogonalization_epsilon = -1}),
              HasSubstr("orthogonalization_epsilon"));
  EXPECT_TRUE(hooks::PowerSGDState::create(nullptr, {.start_powerSGD_iter = 1,
                                                     .use_error_feedback = false,
                                                     .warm_start = false})
                  .ok());
}

}  // namespace
}  // namespace ember::parallel
