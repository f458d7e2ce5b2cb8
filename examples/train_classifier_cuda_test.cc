// //examples:train_classifier's training on cuda:0: the model and the data
// live on the device, the loss falls, and the first epoch's loss is the
// CPU's (same initialisation, same batches). Without a device the GPU case
// skips, saying why; the CPU run still checks the loop.
#include <cmath>

#include "examples/classifier_training.h"
#include "gtest/gtest.h"
#include "third_party/cuda/device_check.h"

namespace ember::examples {
namespace {

constexpr int kEpochs = 4;

TEST(TrainClassifierTest, LossFallsOnTheCpu) {
  const ClassifierResult cpu = train_classifier({.device = kCPU, .epochs = kEpochs, .verbose = false});
  ASSERT_EQ(cpu.epoch_losses.size(), static_cast<size_t>(kEpochs));
  EXPECT_LT(cpu.epoch_losses.back(), 0.8 * cpu.epoch_losses.front());
  EXPECT_EQ(cpu.parameters_device, kCPU);
}

TEST(TrainClassifierTest, TrainsOnCuda) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Device gpu(DeviceType::kCUDA, 0);
  const ClassifierResult result = train_classifier({.device = gpu, .epochs = kEpochs, .verbose = false});
  EXPECT_EQ(result.parameters_device, gpu);
  ASSERT_EQ(result.epoch_losses.size(), static_cast<size_t>(kEpochs));
  for (double loss : result.epoch_losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(result.epoch_losses.back(), 0.8 * result.epoch_losses.front());
  // The first epoch starts from the CPU's weights on the CPU's batches.
  const ClassifierResult cpu = train_classifier({.device = kCPU, .epochs = 1, .verbose = false});
  EXPECT_NEAR(result.epoch_losses.front(), cpu.epoch_losses.front(), 1e-2);
}

}  // namespace
}  // namespace ember::examples
