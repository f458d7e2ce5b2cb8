// nn's layers under CPU autocast (Note [Autocast] in tensor/autocast.h) and
// in bfloat16 on the CPU (Note [16-bit floats on the CPU] in kernel_util.h):
// a conv -> batch_norm -> relu -> linear step trains float32 parameters with
// bfloat16 activations, and its gradients are those of the float32 step to
// bfloat16's precision. The dtypes of each op are PyTorch's
// (//nn:autocast_torch_test).
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::nn {
namespace {

using ::testing::HasSubstr;

struct Params {
  Tensor conv_w = (randn({4, 3, 3, 3}) * 0.3).requires_grad_();
  Tensor bn_w = (rand({4}) + 0.5).requires_grad_();
  Tensor bn_b = (randn({4}) * 0.1).requires_grad_();
  Tensor fc_w = (randn({5, 4 * 6 * 6}) * 0.05).requires_grad_();
  Tensor fc_b = zeros({5}).requires_grad_();
  std::vector<Tensor> all() const { return {conv_w, bn_w, bn_b, fc_w, fc_b}; }
};

// Returns the logits; `bn_dtype` is the batch norm input's dtype seen.
Tensor Forward(const Params& p, const Tensor& x, Dtype* bn_dtype) {
  Tensor h = functional::conv2d(x, p.conv_w, Tensor(), {1, 1}, {1, 1});
  *bn_dtype = h.dtype();
  h = functional::batch_norm(h, Tensor(), Tensor(), p.bn_w, p.bn_b, /*training=*/true).relu();
  return functional::linear(h.reshape({h.size(0), -1}), p.fc_w, p.fc_b);
}

TEST(NnAutocastTest, AConvBatchNormStepTrainsFloat32ParametersInBFloat16) {
  manual_seed(4);
  Params p;
  Tensor x = randn({8, 3, 6, 6});
  Tensor target = tensor({0, 1, 2, 3, 4, 0, 1, 2}).to(kInt64);
  Dtype bn_dtype = kFloat32;
  Tensor loss;
  {
    autocast ac(DeviceType::kCPU);
    Tensor logits = Forward(p, x, &bn_dtype);
    EXPECT_EQ(logits.dtype(), kBFloat16);
    loss = functional::cross_entropy(logits, target);
  }
  EXPECT_EQ(bn_dtype, kBFloat16);  // the conv ran in bfloat16, batch_norm took it
  EXPECT_EQ(loss.dtype(), kFloat32);
  loss.backward();
  std::vector<Tensor> mixed;
  for (const Tensor& t : p.all()) {
    ASSERT_TRUE(t.grad().defined());
    EXPECT_EQ(t.grad().dtype(), kFloat32);
    mixed.push_back(t.grad().clone());
    t.set_grad(Tensor());
  }
  Tensor loss32 = functional::cross_entropy(Forward(p, x, &bn_dtype), target);
  EXPECT_EQ(bn_dtype, kFloat32);
  loss32.backward();
  EXPECT_NEAR(loss.item<float>(), loss32.item<float>(), 2e-2);
  for (size_t i = 0; i < mixed.size(); ++i) {
    SCOPED_TRACE(i);
    const Tensor& full = p.all()[i].grad();
    const double scale = full.abs().max().item<float>();
    // bfloat16 activations: a few of its places (2^-8) of the largest value.
    EXPECT_LT((mixed[i] - full).abs().max().item<float>(), scale * 0.05);
    EXPECT_FALSE(mixed[i].equal(full));  // it did run in bfloat16
  }
}

TEST(NnAutocastTest, LayerNormTakesABFloat16InputWithFloat32Parameters) {
  Tensor x = randn({3, 8}).to(kBFloat16).requires_grad_();
  Tensor w = (rand({8}) + 0.5).requires_grad_(), b = randn({8}).requires_grad_();
  Tensor y = functional::layer_norm(x, {8}, w, b);
  EXPECT_EQ(y.dtype(), kBFloat16);
  // The float32 layer norm of the same values, rounded once.
  Tensor want = functional::layer_norm(x.detach().to(kFloat32), {8}, w.detach(), b.detach());
  EXPECT_TRUE(y.to(kFloat32).allclose(want, 1e-2, 1e-2));
  y.to(kFloat32).sum().backward();
  EXPECT_EQ(x.grad().dtype(), kBFloat16);
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
}

TEST(NnAutocastTest, ParametersOfAnotherWidthAreRefusedByName) {
  Tensor x = randn({2, 4}).to(kBFloat16);
  try {
    functional::layer_norm(x, {4}, randn({4}, kFloat64), Tensor());
    FAIL() << "float64 weight accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layer_norm: expected weight/bias of the input's dtype "
                                    "(bfloat16) or float32, but got float64"));
  }
  try {
    functional::batch_norm(randn({2, 3}), Tensor(), Tensor(), ones({3}, kBFloat16), Tensor(),
                           true);
    FAIL() << "bfloat16 weight with a float32 input accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("batch_norm: expected weight of the input's dtype (float32), "
                                    "but got bfloat16"));
  }
}

}  // namespace
}  // namespace ember::nn
