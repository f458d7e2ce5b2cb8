#include "cuda/status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace ember::cuda {
namespace {

// "cuda:N", or a word saying why no device can be named.
std::string CurrentDevice() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return "no current device";
  }
  return absl::StrCat("cuda:", device);
}

absl::Status Make(absl::StatusCode code, std::string_view library, std::string_view call,
                  std::string_view what) {
  std::string message(library);
  message.append(" call ").append(call).append(" failed on ").append(CurrentDevice());
  message.append(": ").append(what);
  return absl::Status(code, message);
}

}  // namespace

absl::Status runtime_status(cudaError_t error, std::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // Clears the error unless it is sticky (a faulted context).
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error) {
    case cudaErrorMemoryAllocation:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
      code = absl::StatusCode::kInvalidArgument;
      break;
    default:
      break;
  }
  return Make(code, "CUDA runtime", call,
              absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

absl::Status cublas_status(cublasStatus_t status, std::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) code = absl::StatusCode::kResourceExhausted;
  if (status == CUBLAS_STATUS_INVALID_VALUE) code = absl::StatusCode::kInvalidArgument;
  if (status == CUBLAS_STATUS_NOT_INITIALIZED || status == CUBLAS_STATUS_ARCH_MISMATCH) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  return Make(code, "cuBLAS", call,
              absl::StrCat(cublasGetStatusName(status), " (", cublasGetStatusString(status), ")"));
}

absl::Status cudnn_status(cudnnStatus_t status, std::string_view call) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (status == CUDNN_STATUS_ALLOC_FAILED) code = absl::StatusCode::kResourceExhausted;
  if (status == CUDNN_STATUS_BAD_PARAM) code = absl::StatusCode::kInvalidArgument;
  if (status == CUDNN_STATUS_NOT_INITIALIZED) code = absl::StatusCode::kFailedPrecondition;
  return Make(code, "cuDNN", call, cudnnGetErrorString(status));
}

absl::Status nccl_status(ncclResult_t result, std::string_view call) {
  if (result == ncclSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    code = absl::StatusCode::kInvalidArgument;
  }
  if (result == ncclRemoteError) code = absl::StatusCode::kUnavailable;
  return Make(code, "NCCL", call, ncclGetErrorString(result));
}

namespace internal {
void ThrowStatus(const absl::Status& status) {
  ::ember::internal::ThrowError(std::string(status.message()));
}
}  // namespace internal

}  // namespace ember::cuda
