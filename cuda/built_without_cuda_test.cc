// The one case of every GPU test in a build without CUDA support
// (tools/cuda.bzl cuda_cc_test): the test reports itself skipped, saying
// why, instead of vanishing from `bazel test //...`.
#include "cuda/device.h"
#include "gtest/gtest.h"

namespace ember::cuda {
namespace {

TEST(BuiltWithoutCuda, GpuTestSkipped) {
  ASSERT_FALSE(is_available());
  GTEST_SKIP() << unavailable_reason()
               << "; this test needs it. Build with NVIDIA's CUDA toolkit in /usr/local/cuda "
                  "(or EMBER_CUDA_PATH) to run it; tools/cuda_configure.bzl says how.";
}

}  // namespace
}  // namespace ember::cuda
