// Autocast on cuda:0 (Note [Autocast] in tensor/autocast.h): each op with a
// CUDA policy returns the dtype of PyTorch's CUDA lists (float16 by default,
// bfloat16 when asked), its values are those of the op on the cast inputs,
// and a training step under autocast with GradScaler matches the same step
// run on the CPU with the casts written out. Without a device the GPU cases
// skip, saying why.
#include <vector>

#include "gtest/gtest.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/sgd.h"
#include "tensor/autocast.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

const Device kGpu(DeviceType::kCUDA, 0);

class AutocastCudaTest : public ::testing::Test {
 protected:
  void SetUp() override { EMBER_SKIP_WITHOUT_CUDA(); }
};

TEST_F(AutocastCudaTest, OpsFollowPyTorchsCudaLists) {
  manual_seed(0);
  Tensor a = (rand({8, 8}) + 0.5).to(kGpu), b = (rand({8, 8}) + 0.5).to(kGpu);
  Tensor c = (rand({8}) + 0.5).to(kGpu);
  for (Dtype lower : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(lower));
    autocast ac(DeviceType::kCUDA, lower);
    EXPECT_EQ(a.mm(b).dtype(), lower);
    EXPECT_EQ(functional::linear(a, b, c).dtype(), lower);
    EXPECT_EQ(functional::conv2d(a.reshape({1, 1, 8, 8}), b.reshape({1, 1, 8, 8}).slice(2, 0, 3)
                                                        .slice(3, 0, 3).contiguous())
                  .dtype(),
              lower);
    Tensor h = a.to(lower);
    EXPECT_EQ(h.softmax(1).dtype(), kFloat32);
    EXPECT_EQ(h.log_softmax(1).dtype(), kFloat32);
    EXPECT_EQ(h.exp().dtype(), kFloat32);
    EXPECT_EQ(h.log().dtype(), kFloat32);
    EXPECT_EQ(h.pow(2.0).dtype(), kFloat32);
    EXPECT_EQ(h.sum().dtype(), kFloat32);
    EXPECT_EQ(h.norm().dtype(), kFloat32);
    EXPECT_EQ(functional::layer_norm(h, {8}, Tensor(), Tensor()).dtype(), kFloat32);
    EXPECT_EQ(c.to(lower).dot(c.to(lower)).dtype(), lower);  // promote: both lower
    EXPECT_EQ(c.dot(c.to(lower)).dtype(), kFloat32);  // promote: the widest
    EXPECT_EQ(h.tanh().dtype(), lower);               // no policy
    EXPECT_EQ(a.mm(b).cpu().to(kFloat32).equal(
                  a.to(lower).mm(b.to(lower)).cpu().to(kFloat32)),
              true);
  }
}

// A linear + cross-entropy step under float16 autocast with GradScaler on
// cuda:0, and the same on the CPU with the inputs and weights rounded to
// float16 by hand: the same loss and the same updated weights, to
// float16's precision.
TEST_F(AutocastCudaTest, AScaledFloat16StepMatchesTheCpu) {
  manual_seed(1);
  Tensor w = (randn({10, 32}) * 0.1), b = zeros({10});
  Tensor x = randn({64, 32}), y = randint(0, 10, {64});
  Tensor gw = w.to(kGpu).requires_grad_(), gb = b.to(kGpu).requires_grad_();
  optim::SGD opt({gw, gb}, {.lr = 0.1});
  optim::GradScaler scaler(DeviceType::kCUDA);
  Tensor loss;
  {
    autocast ac(DeviceType::kCUDA);
    loss = functional::cross_entropy(functional::linear(x.to(kGpu), gw, gb), y.to(kGpu));
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  scaler.scale(loss).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);

  Tensor cw = w.clone().requires_grad_(), cb = b.clone().requires_grad_();
  Tensor logits = functional::linear(x.to(kFloat16).to(kFloat32), cw.to(kFloat16).to(kFloat32),
                                     cb.to(kFloat16).to(kFloat32))
                      .to(kFloat16)
                      .to(kFloat32);
  Tensor cpu_loss = functional::cross_entropy(logits, y);
  cpu_loss.backward();
  EXPECT_NEAR(loss.item<float>(), cpu_loss.item<float>(), 1e-3);
  Tensor want_w = w - cw.grad() * 0.1;
  EXPECT_TRUE(gw.detach().cpu().allclose(want_w, 1e-2, 1e-3));
}

}  // namespace
}  // namespace ember::nn
