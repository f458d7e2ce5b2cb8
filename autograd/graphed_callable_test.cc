// make_graphed_callable on cuda:0 (Note [Graphed callables]): a graphed MLP
// block gives the eager block's outputs and gradients (inputs and
// parameters) call after call with new data, steps of SGD on it follow the
// eager steps, and the refusals name their argument. Without a device the
// GPU cases skip, saying why; the argument checks run everywhere.
#include "autograd/graphed_callable.h"

#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::autograd {
namespace {

using ::testing::HasSubstr;

TEST(GraphedCallableArgumentsTest, CpuTensorsAndNonLeafParametersAreRefusedByName) {
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2}; };
  absl::StatusOr<TensorFunction> cpu = make_graphed_callable(fn, {ones({2})});
  EXPECT_TRUE(absl::IsInvalidArgument(cpu.status()));
  EXPECT_THAT(cpu.status().message(), HasSubstr("sample argument 0 must be a CUDA tensor"));
  absl::StatusOr<TensorFunction> none = make_graphed_callable(fn, {});
  EXPECT_THAT(none.status().message(), HasSubstr("which device"));
  NoGradGuard no_grad;
  EXPECT_TRUE(absl::IsFailedPrecondition(make_graphed_callable(fn, {ones({2})}).status()));
}

class GraphedCallableTest : public ::testing::Test {
 protected:
  void SetUp() override { EMBER_SKIP_WITHOUT_CUDA(); }
};

const TensorOptions kGpu = TensorOptions().device(Device(DeviceType::kCUDA, 0));

TEST_F(GraphedCallableTest, CallsMatchTheEagerFunctionAndItsGradients) {
  manual_seed(0);
  Tensor w1 = (randn({32, 64}, kGpu) * 0.1).requires_grad_();
  Tensor w2 = (randn({64, 8}, kGpu) * 0.1).requires_grad_();
  auto block = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].matmul(w1).tanh().matmul(w2)};
  };
  absl::StatusOr<TensorFunction> graphed =
      make_graphed_callable(block, {randn({16, 32}, kGpu).requires_grad_()}, {w1, w2});
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(call);
    Tensor x = randn({16, 32}, kGpu);
    Tensor target = randn({16, 8}, kGpu);
    Tensor xg = x.clone().requires_grad_(), xe = x.clone().requires_grad_();
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Tensor yg = (*graphed)({xg})[0];
    ((yg - target) * (yg - target)).sum().backward();
    const Tensor g1 = w1.grad().clone(), g2 = w2.grad().clone();
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Tensor ye = block({xe})[0];
    ((ye - target) * (ye - target)).sum().backward();
    EXPECT_TRUE(yg.cpu().allclose(ye.cpu(), 1e-5, 1e-6));
    EXPECT_TRUE(xg.grad().cpu().allclose(xe.grad().cpu(), 1e-5, 1e-6));
    EXPECT_TRUE(g1.cpu().allclose(w1.grad().cpu(), 1e-5, 1e-6));
    EXPECT_TRUE(g2.cpu().allclose(w2.grad().cpu(), 1e-5, 1e-6));
  }
}

TEST_F(GraphedCallableTest, AnArgumentOfAnotherShapeIsRefusedByPosition) {
  Tensor w = randn({4, 4}, kGpu).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].matmul(w)}; };
  absl::StatusOr<TensorFunction> graphed = make_graphed_callable(fn, {randn({2, 4}, kGpu)}, {w});
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  try {
    (*graphed)({randn({3, 4}, kGpu)});
    FAIL() << "a [3, 4] argument was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("argument 0 must match its sample ([2, 4]"));
  }
}

}  // namespace
}  // namespace ember::autograd
