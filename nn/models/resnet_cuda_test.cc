// ResNet-18 trained on cuda:0 in float16 and in bfloat16 (module.to(dtype)
// after .to(device)): every layer it uses (convolution, batch_norm, ReLU,
// max and adaptive average pooling, linear, cross_entropy) and their
// gradients run in that dtype. The first loss is the CPU's float32 loss on
// the same weights and rounded images within the dtype's precision, the
// loss falls over SGD steps, and parameters, gradients and running
// statistics stay in the dtype. Without a device the test skips, saying why.
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nn/loss.h"
#include "nn/models/resnet.h"
#include "nn/optim/sgd.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn::models {
namespace {

TEST(ResNetCudaTest, TrainsInFloat16AndBfloat16) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Device gpu(DeviceType::kCUDA, 0);
  // Tolerances of the first loss: about 20 layers of rounding to 11 and 8
  // mantissa bits, renormalised by every batch_norm.
  for (auto [dtype, rtol] : {std::pair{kFloat16, 1e-2}, std::pair{kBFloat16, 6e-2}}) {
    SCOPED_TRACE(dtype_name(dtype));
    manual_seed(7);
    auto cpu = std::make_shared<ResNet18>(ResNetOptions{.num_classes = 10});
    std::shared_ptr<nn::Module> net = cpu->clone();
    net->to(gpu);
    net->to(dtype);
    Tensor images = randn({8, 3, 32, 32}).to(dtype);
    Tensor labels = tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});

    const double cpu_loss =
        nn::functional::cross_entropy((*cpu)(images.to(kFloat32)), labels).item<double>();

    nn::optim::SGD sgd(net->parameters(), {.lr = 0.05, .momentum = 0.9});
    std::vector<double> losses;
    for (int step = 0; step < 8; ++step) {
      sgd.zero_grad();
      Tensor loss = nn::functional::cross_entropy((*net)(images.to(gpu)), labels.to(gpu));
      ASSERT_EQ(loss.dtype(), dtype);
      loss.backward();
      sgd.step();
      losses.push_back(loss.to(kCPU).to(kFloat64).item<double>());
      ASSERT_TRUE(std::isfinite(losses.back())) << "step " << step;
    }
    EXPECT_NEAR(losses.front(), cpu_loss, rtol * (1 + cpu_loss));
    EXPECT_LT(losses.back(), 0.8 * losses.front());
    for (const Tensor& p : net->parameters()) {
      EXPECT_EQ(p.dtype(), dtype);
      EXPECT_TRUE(p.is_cuda());
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().dtype(), dtype);
    }
    for (const auto& [name, b] : net->named_buffers()) {
      if (b.is_floating_point()) {
        EXPECT_EQ(b.dtype(), dtype) << name;
      }
    }
  }
}

}  // namespace
}  // namespace ember::nn::models
