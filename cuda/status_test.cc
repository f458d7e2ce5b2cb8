#include "cuda/status.h"

#include <string>

#include "gtest/gtest.h"
#include "tensor/error.h"

namespace ember::cuda {
namespace {

absl::Status Allocate(size_t bytes, void** out) {
  EMBER_CUDA_RETURN_IF_ERROR(cudaMalloc(out, bytes));
  return absl::OkStatus();
}

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(runtime_status(cudaSuccess, "cudaFree(p)").ok());
  EXPECT_TRUE(cublas_status(CUBLAS_STATUS_SUCCESS, "cublasCreate(&h)").ok());
  EXPECT_TRUE(cudnn_status(CUDNN_STATUS_SUCCESS, "cudnnCreate(&h)").ok());
  EXPECT_TRUE(nccl_status(ncclSuccess, "ncclCommInitRank(...)").ok());
}

TEST(CudaStatusTest, RuntimeErrorsNameTheCallTheErrorAndAKind) {
  absl::Status oom = runtime_status(cudaErrorMemoryAllocation, "cudaMalloc(&p, bytes)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc(&p, bytes)"), std::string::npos) << oom;
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos) << oom;
  EXPECT_EQ(runtime_status(cudaErrorInsufficientDriver, "cudaGetDeviceCount(&n)").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_status(cudaErrorInvalidDevice, "cudaSetDevice(9)").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_status(cudaErrorLaunchFailure, "kernel<<<...>>>").code(),
            absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, LibraryErrorsNameTheLibrary) {
  absl::Status blas = cublas_status(CUBLAS_STATUS_INVALID_VALUE, "cublasSgemm(...)");
  EXPECT_EQ(blas.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(blas.message().find("cuBLAS call cublasSgemm(...)"), std::string::npos) << blas;
  EXPECT_NE(blas.message().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << blas;
  absl::Status dnn = cudnn_status(CUDNN_STATUS_ALLOC_FAILED, "cudnnCreate(&h)");
  EXPECT_EQ(dnn.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(dnn.message().find("cuDNN call cudnnCreate(&h)"), std::string::npos) << dnn;
  absl::Status nccl = nccl_status(ncclInvalidArgument, "ncclAllReduce(...)");
  EXPECT_EQ(nccl.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nccl.message().find("NCCL call ncclAllReduce(...)"), std::string::npos) << nccl;
}

// A real call through the macros: without a usable device the runtime's own
// error comes back (and the next call is not poisoned by it); with one, a
// request larger than any GPU's memory comes back as kResourceExhausted.
TEST(CudaStatusTest, MacrosReturnAndThrowTheRealError) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  cudaGetLastError();
  void* p = nullptr;
  absl::Status s = Allocate(size_t{1} << 60, &p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cudaMalloc(out, bytes)"), std::string::npos) << s;
  if (probe == cudaSuccess && count > 0) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("on cuda:0"), std::string::npos) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  try {
    EMBER_CUDA_CHECK(cudaMalloc(&p, size_t{1} << 60));
    ADD_FAILURE() << "EMBER_CUDA_CHECK did not throw";
  } catch (const ember::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc(&p, size_t{1} << 60)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ember::cuda
