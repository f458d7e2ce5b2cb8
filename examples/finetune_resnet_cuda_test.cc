// //examples:finetune_resnet's recipe on cuda:0: a hub-loaded ResNet-18
// frozen on the device, its new head trained there; the recipe's promises
// hold (finetune_resnet returns an error otherwise), the loss falls, and the
// first loss is the CPU's (the same published weights and images). Without a
// device the test skips, saying why (the CPU run is
// //examples:finetune_resnet_test).
#include <cmath>
#include <string>

#include "examples/resnet_finetuning.h"
#include "gtest/gtest.h"
#include "third_party/cuda/device_check.h"

namespace ember::examples {
namespace {

TEST(FinetuneResnetTest, TrainsOnCuda) {
  EMBER_SKIP_WITHOUT_CUDA();
  const Device gpu(DeviceType::kCUDA, 0);
  absl::StatusOr<FinetuneResult> result =
      finetune_resnet({.device = gpu, .steps = 6, .verbose = false});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->parameters_device, gpu);
  EXPECT_GT(result->frozen_tensors, 0u);
  ASSERT_EQ(result->losses.size(), 6u);
  for (double loss : result->losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(result->losses.back(), result->losses.front());

  absl::StatusOr<FinetuneResult> cpu =
      finetune_resnet({.device = kCPU, .steps = 1, .verbose = false});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_NEAR(result->losses.front(), cpu->losses.front(), 1e-2 * (1 + cpu->losses.front()));
}

}  // namespace
}  // namespace ember::examples
