// Optimizers and schedulers: updates against the documented formulas
// computed here in double precision, state_dict round trips, errors, and a
// regression problem that each optimizer solves.
#include <cmath>
#include <functional>
#include <vector>

#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/adam.h"
#include "nn/optim/fused_kernels.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn::optim {
namespace {

using ::testing::HasSubstr;

std::vector<double> Values(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Runs `steps` steps with fixed gradients g_k = grads[k] on a parameter
// starting at p0, in float64, through opt.
template <typename Opt, typename Options>
std::vector<double> RunSteps(const std::vector<double>& p0,
                             const std::vector<std::vector<double>>& grads, Options options,
                             bool transposed = false) {
  Tensor p = tensor(p0);
  if (transposed) p = p.view({1, -1}).t();  // non-contiguous: the tensor-op path
  p.requires_grad_();
  Opt opt({p}, options);
  for (const auto& g : grads) {
    Tensor gt = tensor(g);
    p.set_grad(transposed ? gt.view({-1, 1}) : gt);
    opt.step();
  }
  return Values(p.flatten());
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "at " << i;
}

const std::vector<double> kP0 = {1.0, -2.0, 0.5};
const std::vector<std::vector<double>> kGrads = {
    {0.1, 0.2, -0.3}, {-0.4, 0.5, 0.6}, {0.7, -0.8, 0.9}};

// SGD by its documented rule.
std::vector<double> SgdReference(const SGDOptions& o,
                                 const std::vector<std::vector<double>>& grads = kGrads) {
  std::vector<double> p = kP0, buf(3);
  for (size_t k = 0; k < grads.size(); ++k) {
    for (int i = 0; i < 3; ++i) {
      double d = (o.maximize ? -1 : 1) * grads[k][i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = k == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
  return p;
}

TEST(SgdTest, FollowsTheDocumentedRule) {
  for (const SGDOptions& o :
       {SGDOptions{.lr = 0.1}, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1},
        SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
        SGDOptions{.lr = 0.1, .weight_decay = 0.1, .maximize = true}}) {
    SCOPED_TRACE(testing::Message() << "momentum " << o.momentum << " nesterov " << o.nesterov);
    ExpectNear(RunSteps<SGD>(kP0, kGrads, o), SgdReference(o));
    ExpectNear(RunSteps<SGD>(kP0, kGrads, o, /*transposed=*/true), SgdReference(o));
  }
}

// A parameter large enough that the fused loop splits across threads: every
// part follows the rule.
TEST(SgdTest, LargeParametersSplitAcrossThreadsFollowTheRule) {
  const int threads = get_num_threads();
  set_num_threads(3);
  const int64_t n = 100003;
  std::vector<double> p0(n);
  std::vector<std::vector<double>> grads(3, std::vector<double>(n));
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = std::sin(0.001 * i);
    for (int k = 0; k < 3; ++k) grads[k][i] = std::cos(0.002 * i + k);
  }
  const SGDOptions o{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  std::vector<double> want = p0, buf(n);
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double d = grads[k][i] + o.weight_decay * want[i];
      buf[i] = k == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
      want[i] -= o.lr * (d + o.momentum * buf[i]);
    }
  }
  ExpectNear(RunSteps<SGD>(p0, grads, o), want);
  set_num_threads(threads);
}

// Adam / AdamW by the documented rule.
std::vector<double> AdamReference(const AdamOptions& o, bool decoupled,
                                  const std::vector<std::vector<double>>& grads = kGrads) {
  std::vector<double> p = kP0, m(3), v(3), vmax(3);
  for (size_t k = 0; k < grads.size(); ++k) {
    const double t = k + 1;
    for (int i = 0; i < 3; ++i) {
      double g = grads[k][i];
      if (decoupled) {
        p[i] *= 1 - o.lr * o.weight_decay;
      } else {
        g += o.weight_decay * p[i];
      }
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      const double second = o.amsgrad ? vmax[i] : v[i];
      const double denom = std::sqrt(second) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      p[i] -= o.lr / (1 - std::pow(o.beta1, t)) * m[i] / denom;
    }
  }
  return p;
}

TEST(AdamTest, FollowsTheDocumentedRule) {
  for (const AdamOptions& o : {AdamOptions{.lr = 0.1}, AdamOptions{.lr = 0.01, .weight_decay = 0.1},
                               AdamOptions{.lr = 0.1, .beta1 = 0.5, .amsgrad = true}}) {
    ExpectNear(RunSteps<Adam>(kP0, kGrads, o), AdamReference(o, false));
  }
  AdamWOptions w{.lr = 0.1};
  EXPECT_EQ(w.weight_decay, 0.01);
  AdamOptions same{.lr = 0.1, .weight_decay = 0.01};
  ExpectNear(RunSteps<AdamW>(kP0, kGrads, w), AdamReference(same, true));
}

// One step() hands the device kernel lists of parameters that share every
// scalar of the update (Note [Fused optimizer steps]): a parameter that
// missed a step keeps its own step count and momentum history, and groups
// keep their own options.
TEST(OptimizerTest, ParametersThatMissedAStepKeepTheirOwnState) {
  const std::vector<std::vector<double>> late(kGrads.begin() + 1, kGrads.end());
  auto run = [&](auto& opt, Tensor& a, Tensor& b) {
    for (size_t k = 0; k < kGrads.size(); ++k) {
      a.set_grad(tensor(kGrads[k]));
      b.set_grad(k == 0 ? Tensor() : tensor(kGrads[k]));
      opt.step();
    }
  };
  {
    Tensor a = tensor(kP0).requires_grad_(), b = tensor(kP0).requires_grad_();
    const AdamOptions o{.lr = 0.1, .weight_decay = 0.01, .amsgrad = true};
    Adam adam({a, b}, o);
    run(adam, a, b);
    ExpectNear(Values(a), AdamReference(o, false));
    ExpectNear(Values(b), AdamReference(o, false, late));
  }
  {
    Tensor a = tensor(kP0).requires_grad_(), b = tensor(kP0).requires_grad_();
    const SGDOptions oa{.lr = 0.1, .momentum = 0.9, .dampening = 0.2};
    const SGDOptions ob{.lr = 0.05, .momentum = 0.5, .weight_decay = 0.1};
    SGD sgd({{{a}, oa}, {{b}, ob}});
    run(sgd, a, b);
    ExpectNear(Values(a), SgdReference(oa));
    ExpectNear(Values(b), SgdReference(ob, late));
  }
}

// Note [16-bit optimizer math]: in float16 a gradient of 1e-3 gives a second
// moment of 1e-9 (0 in float16) and eps 1e-8 is 0 too, so the update would
// be 1e-4 / 0 (inf) and, for a zero gradient, 0 / 0 (NaN). Stepped in float32
// Adam's first step moves each element by lr against its gradient's sign
// (m_hat / sqrt(v_hat) = g / |g|) and leaves an element without gradient.
TEST(OptimizerTest, SixteenBitAdamSurvivesAnUnderflowingSecondMoment) {
  for (Dtype dtype : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor p = tensor({1.0, -1.0, 0.5}).to(dtype).requires_grad_();
    Adam adam({p}, AdamOptions{.lr = 0.01});
    p.set_grad(tensor({1e-3, -1e-3, 0.0}).to(dtype));
    adam.step();
    EXPECT_EQ(p.dtype(), dtype);
    const std::vector<double> got = Values(p), want = {0.99, -0.99, 0.5};
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], want[i], 4e-3) << "at " << i;
  }
}

// 16-bit parameters (not fused on the CPU) step in float32 through tensor ops
// (Note [16-bit optimizer math]): the documented rule to within the dtype's
// rounding.
TEST(OptimizerTest, SixteenBitParametersFollowTheRule) {
  for (Dtype dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor a = tensor(kP0).to(dtype).requires_grad_(), b = tensor(kP0).to(dtype).requires_grad_();
    const AdamOptions ao{.lr = 0.1, .weight_decay = 0.01, .amsgrad = true};
    const SGDOptions so{.lr = 0.1, .momentum = 0.9};
    Adam adam({a}, ao);
    SGD sgd({b}, so);
    for (const auto& g : kGrads) {
      a.set_grad(tensor(g).to(dtype));
      b.set_grad(tensor(g).to(dtype));
      adam.step();
      sgd.step();
    }
    EXPECT_EQ(a.dtype(), dtype);
    const std::vector<double> want_a = AdamReference(ao, false), want_b = SgdReference(so);
    const std::vector<double> got_a = Values(a), got_b = Values(b);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(got_a[i], want_a[i], 0.05) << "Adam, at " << i;
      EXPECT_NEAR(got_b[i], want_b[i], 0.05) << "SGD, at " << i;
    }
  }
}

TEST(OptimizerTest, StepKernelsRejectListsThatDoNotPair) {
  Tensor p = zeros({2}), g = zeros({2});
  const internal::SgdStepArgs args{.lr = 0.1, .momentum = 0.9};
  EXPECT_THAT(ErrorOf([&] { internal::sgd_step(kCPU)({p, p}, {g}, {g, g}, args); }),
              HasSubstr("SGD step: a list of 1 state tensors for 2 parameters"));
  EXPECT_THAT(ErrorOf([&] { internal::sgd_step(kCPU)({p}, {g}, {}, args); }),
              HasSubstr("momentum needs a buffer per parameter"));
  EXPECT_THAT(ErrorOf([&] { internal::sgd_step(kCPU)({p}, {Tensor()}, {g}, args); }),
              HasSubstr("the state or gradient of parameter 0 is undefined"));
}

TEST(OptimizerTest, RejectsInvalidHyperparameters) {
  Tensor p = zeros({1}).requires_grad_();
  EXPECT_THAT(ErrorOf([&] { SGD({p}, {.lr = -0.1}); }), HasSubstr("Invalid learning rate: -0.1"));
  EXPECT_THAT(ErrorOf([&] { SGD({p}, {.lr = 0.1, .nesterov = true}); }),
              HasSubstr("Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_THAT(ErrorOf([&] { Adam({p}, {.beta2 = 1.0}); }),
              HasSubstr("Invalid beta parameter at index 1: 1"));
  EXPECT_THAT(ErrorOf([&] {
                SGD({{{p}, {}}, {{p}, {}}});
              }),
              HasSubstr("some parameters appear in more than one parameter group"));
  EXPECT_THAT(ErrorOf([&] {
                SGD({p, p}, {.lr = 0.1});
              }),
              HasSubstr("a parameter group with duplicate parameters"));
  Tensor non_leaf = p * 2;
  EXPECT_THAT(ErrorOf([&] { SGD({non_leaf}, {}); }), HasSubstr("can't optimize a non-leaf Tensor"));
}

TEST(OptimizerTest, ZeroGradAndParametersWithoutGradients) {
  Tensor a = ones({2}).requires_grad_(), b = ones({2}).requires_grad_();
  SGD opt({a, b}, {.lr = 1.0});
  a.set_grad(ones({2}));
  opt.step();  // b has no gradient: untouched
  EXPECT_EQ(Values(a), (std::vector<double>{0, 0}));
  EXPECT_EQ(Values(b), (std::vector<double>{1, 1}));
  opt.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{0, 0}));
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(OptimizerTest, StateDictRoundTripContinuesIdentically) {
  auto make = [] { return tensor(kP0).requires_grad_(); };
  Tensor p1 = make(), p2 = make();
  Adam a1({p1}, {.lr = 0.1, .amsgrad = true});
  p1.set_grad(tensor(kGrads[0]));
  a1.step();
  {
    autograd::NoGradGuard no_grad;
    p2.copy_(p1);
  }
  Adam a2({p2}, {.lr = 0.5});
  ASSERT_TRUE(a2.load_state_dict(a1.state_dict()).ok());
  EXPECT_EQ(a2.lr(0), 0.1);
  for (int k = 1; k < 3; ++k) {
    p1.set_grad(tensor(kGrads[k]));
    p2.set_grad(tensor(kGrads[k]));
    a1.step();
    a2.step();
  }
  EXPECT_EQ(Values(p1), Values(p2));

  OptimizerStateDict sd = a1.state_dict();
  ASSERT_EQ(sd.state.size(), 1u);
  EXPECT_EQ(sd.state[0].values[0].first, "step");
  EXPECT_EQ(sd.state[0].values[0].second.item<double>(), 3.0);
  Tensor q = zeros({3}).requires_grad_();
  Adam two_groups({{{p1}, {}}, {{q}, {}}});
  EXPECT_THAT(std::string(two_groups.load_state_dict(sd).message()),
              HasSubstr("different number of parameter groups"));
  SGD sgd({p1}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_THAT(std::string(sgd.load_state_dict(sd).message()), HasSubstr("unknown SGD option"));
}

TEST(SchedulerTest, StepLrAndCosine) {
  Tensor p = zeros({1}).requires_grad_();
  SGD opt({p}, {.lr = 1.0});
  StepLR step(opt, /*step_size=*/2, /*gamma=*/0.5);
  std::vector<double> lrs;
  for (int e = 0; e < 5; ++e) {
    lrs.push_back(opt.lr(0));
    step.step();
  }
  EXPECT_EQ(lrs, (std::vector<double>{1, 1, 0.5, 0.5, 0.25}));
  EXPECT_EQ(step.get_last_lr(), std::vector<double>{0.25});  // epoch 5

  SGD opt2({p}, {.lr = 0.1});
  CosineAnnealingLR cos(opt2, /*t_max=*/4, /*eta_min=*/0.02);
  EXPECT_DOUBLE_EQ(opt2.lr(0), 0.1);
  cos.step();
  cos.step();
  EXPECT_NEAR(opt2.lr(0), 0.06, 1e-12);  // halfway: the mean of 0.1 and 0.02
  cos.step();
  cos.step();
  EXPECT_NEAR(opt2.lr(0), 0.02, 1e-12);
  EXPECT_THAT(ErrorOf([&] { StepLR(opt, 0); }), HasSubstr("step_size must be positive"));
}

TEST(OptimizerTest, EachOptimizerFitsALinearRegression) {
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    manual_seed(5);
    Linear fc(3, 1);
    Tensor x = randn({64, 3});
    Tensor y = x.matmul(tensor({1.0f, -2.0f, 0.5f}).view({3, 1})) + 0.3;
    std::unique_ptr<Optimizer> opt;
    if (which == 0)
      opt = std::make_unique<SGD>(fc.parameters(), SGDOptions{.lr = 0.1, .momentum = 0.9});
    if (which == 1) opt = std::make_unique<Adam>(fc.parameters(), AdamOptions{.lr = 0.05});
    if (which == 2)
      opt = std::make_unique<AdamW>(fc.parameters(), AdamWOptions{.lr = 0.05, .weight_decay = 0});
    double loss = 0;
    for (int step = 0; step < 300; ++step) {
      opt->zero_grad();
      Tensor l = functional::mse_loss(fc(x), y);
      l.backward();
      opt->step();
      loss = l.item<double>();
    }
    EXPECT_LT(loss, 1e-4);
  }
}

// Note [Capturable steps]: capturable optimizers read the learning rate and
// Adam's step count from tensors; on the CPU their steps equal the plain
// ones (to float32's rounding of the learning rate), a scheduler included,
// and Adam's state_dict counts the device's steps.
template <typename Opt, typename Options>
std::vector<Tensor> TrainWith(Options options, int steps) {
  manual_seed(21);
  Tensor w = randn({6, 5}).requires_grad_(), b = randn({6}).requires_grad_();
  Tensor x = randn({12, 5}), y = randn({12, 6});
  Opt opt({w, b}, options);
  StepLR schedule(opt, /*step_size=*/2, /*gamma=*/0.5);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    functional::mse_loss(functional::linear(x, w, b), y).backward();
    opt.step();
    schedule.step();
  }
  return {w.detach(), b.detach()};
}

TEST(CapturableTest, CapturableStepsEqualThePlainOnes) {
  const auto expect_equal = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].allclose(b[i], 1e-6, 1e-7)) << i;
  };
  expect_equal(TrainWith<Adam>(AdamOptions{.lr = 0.1, .capturable = true}, 7),
               TrainWith<Adam>(AdamOptions{.lr = 0.1}, 7));
  expect_equal(TrainWith<AdamW>(AdamWOptions{.lr = 0.1, .amsgrad = true, .capturable = true}, 7),
               TrainWith<AdamW>(AdamWOptions{.lr = 0.1, .amsgrad = true}, 7));
  expect_equal(TrainWith<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .capturable = true}, 7),
               TrainWith<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9}, 7));
  // And the learning rate really is the tensor's: a plain run at another
  // rate differs.
  EXPECT_FALSE(TrainWith<Adam>(AdamOptions{.lr = 0.1, .capturable = true}, 7)[0].allclose(
      TrainWith<Adam>(AdamOptions{.lr = 0.05}, 7)[0], 1e-3, 1e-4));
}

TEST(CapturableTest, AdamsStateDictCountsTheDevicesSteps) {
  Tensor w = ones({3}).requires_grad_();
  Adam opt({w}, {.lr = 0.1, .capturable = true});
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    (w * w).sum().backward();
    opt.step();
  }
  OptimizerStateDict saved = opt.state_dict();
  ASSERT_EQ(saved.state.size(), 1u);
  Tensor step;
  for (const auto& [k, v] : saved.state[0].values) {
    if (k == "step") step = v;
  }
  ASSERT_TRUE(step.defined());
  EXPECT_EQ(step.item<double>(), 3.0);
  bool found = false;
  for (const auto& [k, v] : saved.param_groups[0].options) {
    if (k == "capturable") found = v == 1.0;
  }
  EXPECT_TRUE(found) << "capturable is in the group's options, as torch's";
  Adam other({w}, {.lr = 0.1, .capturable = true});
  ASSERT_TRUE(other.load_state_dict(saved).ok());
  opt.zero_grad();
  (w * w).sum().backward();
  other.step();  // the fourth step's bias corrections
  EXPECT_EQ(other.state_dict().state[0].values[0].second.item<double>(), 4.0);
}

}  // namespace
}  // namespace ember::nn::optim
