// GradScaler's behaviour on the CPU (Note [Loss scaling]): what a skipped and
// a taken step do, the scale's growth and back-off, the errors of misuse, the
// state_dict, and the pass-through when disabled. The same run as
// PyTorch's is //nn/optim:grad_scaler_torch_test.
#include "nn/optim/grad_scaler.h"

#include <cmath>
#include <functional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/optim/sgd.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::optim {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

struct Fixture {
  Tensor w = tensor({1.0, 2.0, 3.0}).to(kFloat32).requires_grad_();
  SGD opt{{w}, {.lr = 0.5}};
  // loss = sum(w * c): its gradient is c (times the scale).
  void Backward(GradScaler& scaler, const Tensor& c) {
    opt.zero_grad();
    scaler.scale((w * c).sum()).backward();
  }
};

TEST(GradScalerTest, UnscalesBeforeTheStepAndSkipsStepsWithInfOrNan) {
  Fixture f;
  GradScaler scaler(DeviceType::kCPU, {.init_scale = 8.0, .growth_interval = 3});
  f.Backward(scaler, tensor({1.0, 1.0, 1.0}).to(kFloat32));
  EXPECT_TRUE(f.w.grad().equal(full({3}, 8.0)));  // scaled by 8
  scaler.unscale_(f.opt);
  EXPECT_TRUE(f.w.grad().equal(ones({3})));  // the true gradient
  EXPECT_TRUE(scaler.step(f.opt));
  scaler.update();
  EXPECT_TRUE(f.w.detach().equal(tensor({0.5, 1.5, 2.5}).to(kFloat32)));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 1);

  f.Backward(scaler, tensor({1.0, INFINITY, 1.0}).to(kFloat32));
  EXPECT_FALSE(scaler.step(f.opt));
  scaler.update();
  EXPECT_TRUE(f.w.detach().equal(tensor({0.5, 1.5, 2.5}).to(kFloat32)));  // untouched
  EXPECT_EQ(scaler.get_scale(), 4.0);  // backed off
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 0);

  for (int i = 0; i < 3; ++i) {
    f.Backward(scaler, ones({3}));
    EXPECT_TRUE(scaler.step(f.opt));
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 8.0);  // grown after growth_interval clean steps
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 0);
}

TEST(GradScalerTest, AGrowthThatWouldOverflowKeepsTheScale) {
  Fixture f;
  GradScaler scaler(DeviceType::kCPU, {.init_scale = 3e38, .growth_interval = 1});
  f.Backward(scaler, full({3}, 1e-30));
  scaler.step(f.opt);
  scaler.update();
  EXPECT_FLOAT_EQ(scaler.get_scale(), 3e38f);
}

TEST(GradScalerTest, MisuseIsNamedAsPyTorchNamesIt) {
  Fixture f;
  GradScaler scaler(DeviceType::kCPU);
  EXPECT_THAT(ErrorOf([&] { scaler.unscale_(f.opt); }),
              HasSubstr("did not use scaler.scale(loss or outputs)"));
  f.Backward(scaler, ones({3}));
  scaler.unscale_(f.opt);
  EXPECT_THAT(ErrorOf([&] { scaler.unscale_(f.opt); }),
              HasSubstr("unscale_() has already been called on this optimizer since the last "
                        "update()."));
  scaler.step(f.opt);
  EXPECT_THAT(ErrorOf([&] { scaler.step(f.opt); }),
              HasSubstr("step() has already been called since the last update()."));
  EXPECT_THAT(ErrorOf([&] { scaler.unscale_(f.opt); }),
              HasSubstr("unscale_() is being called after step()."));
  scaler.update();
  EXPECT_THAT(ErrorOf([&] { scaler.update(); }),
              HasSubstr("No inf checks were recorded prior to update."));
  EXPECT_THAT(ErrorOf([&] { scaler.scale(ones({2}, kInt64)); }),
              HasSubstr("expected a floating-point tensor"));
  GradScaler for_cuda(DeviceType::kCUDA);
  EXPECT_THAT(ErrorOf([&] { for_cuda.scale(ones({2})); }),
              HasSubstr("the scaler is for cuda tensors, but outputs are on cpu"));
  EXPECT_THAT(ErrorOf([] { GradScaler(DeviceType::kCPU, {.growth_factor = 1.0}); }),
              HasSubstr("The growth factor must be > 1.0"));
  EXPECT_THAT(ErrorOf([] { GradScaler(DeviceType::kCPU, {.backoff_factor = 1.5}); }),
              HasSubstr("The backoff factor must be < 1.0"));
  EXPECT_THAT(ErrorOf([] { GradScaler(DeviceType::kCPU, {.growth_interval = 0}); }),
              HasSubstr("growth_interval must be > 0, got 0"));

  Tensor h = ones({2}, kFloat16).requires_grad_();
  SGD half_opt({h}, {.lr = 0.1});
  GradScaler half_scaler(DeviceType::kCPU);
  half_scaler.scale(h.to(kFloat32).sum()).backward();
  EXPECT_THAT(ErrorOf([&] { half_scaler.unscale_(half_opt); }),
              HasSubstr("Attempting to unscale FP16 gradients."));
}

TEST(GradScalerTest, TheStateDictRoundTripsAndIsCheckedOnLoad) {
  Fixture f;
  GradScaler scaler(DeviceType::kCPU, {.init_scale = 16.0, .growth_interval = 5});
  f.Backward(scaler, ones({3}));
  scaler.step(f.opt);
  scaler.update();
  const GradScalerState saved = *scaler.state_dict();
  EXPECT_EQ(saved.scale, 16.0);
  EXPECT_EQ(saved.growth_tracker, 1);
  EXPECT_EQ(saved.growth_interval, 5);

  GradScaler other(DeviceType::kCPU);
  other.load_state_dict(saved);
  EXPECT_EQ(other.get_scale(), 16.0);
  EXPECT_EQ(other.get_growth_interval(), 5);
  EXPECT_EQ(other.state_dict()->growth_tracker, 1);
  GradScalerState bad = saved;
  bad.growth_tracker = 9;
  EXPECT_THAT(ErrorOf([&] { other.load_state_dict(bad); }),
              HasSubstr("_growth_tracker must be in [0, growth_interval), got 9"));
  EXPECT_EQ(other.state_dict()->growth_tracker, 1);  // nothing loaded
}

TEST(GradScalerTest, DisabledIsAPassThrough) {
  Fixture f;
  GradScaler scaler(DeviceType::kCPU, {.enabled = false});
  Tensor loss = (f.w * 2).sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  EXPECT_TRUE(scaler.step(f.opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_FALSE(scaler.state_dict().has_value());
  EXPECT_TRUE(f.w.detach().equal(tensor({0.0, 1.0, 2.0}).to(kFloat32)));
}

}  // namespace
}  // namespace ember::nn::optim
