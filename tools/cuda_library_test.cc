// Proves cuda_library (tools/cuda.bzl) builds a linkable object everywhere and
// that the kernel computes correctly where a GPU is present.
#include <cuda_runtime.h>

#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/device_check.h"
#include "tools/saxpy_kernel.h"

namespace {

TEST(CudaLibraryTest, KernelLinksEverywhere) {
  // Taking the launcher's address forces the nvcc object into the link.
  auto* launch = &ember::tools::LaunchSaxpy;
  EXPECT_NE(launch, nullptr);
}

TEST(CudaLibraryTest, SaxpyOnDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.f;
  }
  float *dx, *dy;
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * sizeof(float)), cudaSuccess);
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  ASSERT_EQ(ember::tools::LaunchSaxpy(n, 2.f, dx, dy), cudaSuccess);
  cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  for (int i = 0; i < n; ++i) ASSERT_FLOAT_EQ(y[i], 2.f * i + 1.f) << i;
  int version = 0;
  ASSERT_EQ(ember::tools::SaxpyBinaryVersion(&version), cudaSuccess);
  EXPECT_GE(version, 800);
}

}  // namespace
