// CUDA return codes as absl::Status: one helper per library (the runtime,
// cuBLAS, cuDNN, NCCL), each naming the call that failed and the device that
// was current, so an error read in a log says what to look at.
//
//   ```cpp
//   #include "cuda/status.h"
//   auto copy = [](void* dst, const void* src, size_t n) -> absl::Status {
//     EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
//     return absl::OkStatus();
//   };
//   absl::Status oom = ember::cuda::runtime_status(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)");
//   if (oom.code() != absl::StatusCode::kResourceExhausted) return oom;
//   (void)copy;
//   ```
//
// Code that reports through Status (devices, streams, the allocator) uses
// EMBER_CUDA_RETURN_IF_ERROR; kernels and other tensor math, which throw
// (README.md "API rules"), use EMBER_CUDA_CHECK, which throws ember::Error with
// the same message.
//
// Status codes: out of memory is kResourceExhausted; no device, no driver or
// a driver older than the runtime is kFailedPrecondition; an invalid argument
// (a bad device index, a bad pointer) is kInvalidArgument; everything else is
// kInternal. The CUDA runtime's sticky error state is cleared where it can be
// (cudaGetLastError), so one failed call does not fail every later one.
//
// Thread-safe.
#ifndef EMBER_CUDA_STATUS_H_
#define EMBER_CUDA_STATUS_H_

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <string_view>

#include "absl/status/status.h"

namespace ember::cuda {

// OK when `error` is cudaSuccess; otherwise a Status naming `call`, the
// current device and the runtime's description of `error`.
absl::Status runtime_status(cudaError_t error, std::string_view call);
absl::Status cublas_status(cublasStatus_t status, std::string_view call);
absl::Status cudnn_status(cudnnStatus_t status, std::string_view call);
absl::Status nccl_status(ncclResult_t result, std::string_view call);

namespace internal {
inline absl::Status ToStatus(cudaError_t e, std::string_view call) {
  return runtime_status(e, call);
}
inline absl::Status ToStatus(cublasStatus_t e, std::string_view call) {
  return cublas_status(e, call);
}
inline absl::Status ToStatus(cudnnStatus_t e, std::string_view call) {
  return cudnn_status(e, call);
}
inline absl::Status ToStatus(ncclResult_t e, std::string_view call) { return nccl_status(e, call); }
[[noreturn]] void ThrowStatus(const absl::Status& status);
}  // namespace internal

}  // namespace ember::cuda

// Returns the Status of a failed CUDA runtime, cuBLAS, cuDNN or NCCL call
// from the enclosing function (which returns absl::Status or StatusOr).
#define EMBER_CUDA_RETURN_IF_ERROR(call)                                         \
  do {                                                                           \
    if (auto ember_cuda_code = (call); static_cast<int>(ember_cuda_code) != 0) { \
      return ::ember::cuda::internal::ToStatus(ember_cuda_code, #call);          \
    }                                                                            \
  } while (0)

// Throws ember::Error with the same message when the call fails.
#define EMBER_CUDA_CHECK(call)                                                   \
  do {                                                                           \
    if (auto ember_cuda_code = (call); static_cast<int>(ember_cuda_code) != 0) { \
      ::ember::cuda::internal::ThrowStatus(                                      \
          ::ember::cuda::internal::ToStatus(ember_cuda_code, #call));            \
    }                                                                            \
  } while (0)

#endif  // EMBER_CUDA_STATUS_H_
