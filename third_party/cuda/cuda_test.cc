// Proves the CUDA runtime, cuBLAS and NCCL link. Library versions are checked
// everywhere; device work runs only where a GPU is present.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/device_check.h"

namespace {

TEST(CudaTest, LibraryVersionsAreAvailableWithoutADevice) {
  int runtime = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  EXPECT_GE(runtime, 12000);
  int nccl = 0;
  ASSERT_EQ(ncclGetVersion(&nccl), ncclSuccess);
  EXPECT_GE(nccl, 22800);
}

TEST(CudaTest, CublasSgemmOnDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int n = 4;
  std::vector<float> a(n * n), b(n * n), c(n * n, 0.f);
  for (int i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = (i % (n + 1) == 0) ? 1.f : 0.f;  // Identity.
  }
  float *da, *db, *dc;
  ASSERT_EQ(cudaMalloc(&da, sizeof(float) * n * n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, sizeof(float) * n * n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, sizeof(float) * n * n), cudaSuccess);
  cudaMemcpy(da, a.data(), sizeof(float) * n * n, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), sizeof(float) * n * n, cudaMemcpyHostToDevice);
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const float one = 1.f, zero = 0.f;
  ASSERT_EQ(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da, n,
                        db, n, &zero, dc, n),
            CUBLAS_STATUS_SUCCESS);
  cudaMemcpy(c.data(), dc, sizeof(float) * n * n, cudaMemcpyDeviceToHost);
  cublasDestroy(handle);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  for (int i = 0; i < n * n; ++i) EXPECT_FLOAT_EQ(c[i], a[i]) << i;
}

TEST(CudaTest, NcclAllReduceOnOneDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  ncclComm_t comm;
  int dev = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess);
  float* buf;
  ASSERT_EQ(cudaMalloc(&buf, sizeof(float) * 8), cudaSuccess);
  std::vector<float> host(8, 2.5f);
  cudaMemcpy(buf, host.data(), sizeof(float) * 8, cudaMemcpyHostToDevice);
  ASSERT_EQ(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr),
            ncclSuccess);
  cudaDeviceSynchronize();
  cudaMemcpy(host.data(), buf, sizeof(float) * 8, cudaMemcpyDeviceToHost);
  ncclCommDestroy(comm);
  cudaFree(buf);
  for (float v : host) EXPECT_FLOAT_EQ(v, 2.5f);
}

}  // namespace
