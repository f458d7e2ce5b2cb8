#include "parallel/parallel_apply.h"

#include <memory>
#include <thread>
#include <vector>

#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "parallel/replicate.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::parallel {
namespace {

using ::ember::testing::ErrorOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Records the thread and grad mode it ran with; throws on a negative input.
class Probe : public nn::Cloneable<Probe> {
 public:
  Probe() { reset(); }
  void reset() override {}
  Tensor forward(const Tensor& x) override {
    thread = std::this_thread::get_id();
    grad_mode = autograd::GradMode::is_enabled();
    EMBER_CHECK(x.min().item<float>() >= 0, "Probe: negative input ", x.min().item<float>());
    return x * 2;
  }
  std::thread::id thread;
  bool grad_mode = false;
};

TEST(ParallelApplyTest, RunsEachReplicaOnItsOwnThreadWithTheCallersGradMode) {
  std::vector<std::shared_ptr<nn::Module>> modules = {std::make_shared<Probe>(),
                                                      std::make_shared<Probe>()};
  std::vector<Value> inputs = {Value(ones({2})), Value(Value::List{Value(full({3}, 2.0f))})};
  std::vector<Value> out;
  {
    autograd::NoGradGuard no_grad;
    out = parallel_apply(modules, inputs, {}, std::vector<Device>(2, kCPU));
  }
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].get_if<Tensor>()->sum().item<float>(), 12);
  auto* p0 = static_cast<Probe*>(modules[0].get());
  auto* p1 = static_cast<Probe*>(modules[1].get());
  EXPECT_NE(p0->thread, p1->thread);
  EXPECT_NE(p0->thread, std::this_thread::get_id());
  EXPECT_FALSE(p0->grad_mode);
  EXPECT_FALSE(p1->grad_mode);
  // One replica runs on the calling thread; no device list: the input's.
  parallel_apply({modules[0]}, {Value(ones({1}))});
  EXPECT_EQ(p0->thread, std::this_thread::get_id());
  EXPECT_TRUE(p0->grad_mode);
}

TEST(ParallelApplyTest, AFailingReplicaIsNamedWithItsDevice) {
  std::vector<std::shared_ptr<nn::Module>> modules = {
      std::make_shared<Probe>(), std::make_shared<Probe>(), std::make_shared<Probe>()};
  std::vector<Value> inputs = {Value(ones({2})), Value(full({2}, -1.0f)), Value(full({2}, -2.0f))};
  std::string error =
      ErrorOf([&] { parallel_apply(modules, inputs, {}, std::vector<Device>(3, kCPU)); });
  EXPECT_THAT(error, StartsWith("Caught ember::Error in replica 1 on device cpu.\n"));
  EXPECT_THAT(error, HasSubstr("Original message: Probe: negative input -1"));
}

TEST(ParallelApplyTest, RefusesMismatchedCountsAndArgumentsItCannotPass) {
  std::vector<std::shared_ptr<nn::Module>> modules = {std::make_shared<Probe>()};
  EXPECT_THAT(ErrorOf([&] { parallel_apply(modules, {}); }),
              HasSubstr("the number of modules 1 is not equal to the number of inputs 0"));
  EXPECT_THAT(ErrorOf([&] {
                parallel_apply(modules, {Value(Value::List{Value(1), Value(2)})}, {}, {kCPU});
              }),
              HasSubstr("Probe takes one tensor argument, got 2 arguments (first: a int)"));
  EXPECT_THAT(ErrorOf([&] { parallel_apply(modules, {Value(3)}); }),
              HasSubstr("in replica 0, no device was provided and no tensor input was found"));
  // A ReplicaForward passes other arguments.
  std::vector<Value> out = parallel_apply(
      modules, {Value(Value::List{Value(ones({2})), Value(3.0)})}, {{{"bias", Value(1.0)}}}, {kCPU},
      [](nn::Module& m, const Value::List& args, const Value::Dict& kwargs) {
        return Value(m(*args[0].get_if<Tensor>()) * *args[1].get_if<double>() +
                     *kwargs.at("bias").get_if<double>());
      });
  EXPECT_EQ(out[0].get_if<Tensor>()->sum().item<float>(), 14);
}

}  // namespace
}  // namespace ember::parallel
