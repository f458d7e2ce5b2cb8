// Test helper: skips the current GoogleTest test when no CUDA device is usable,
// with the runtime's own reason (no driver, no device, ...).
//
//   TEST(Foo, Bar) {
//     EMBER_SKIP_WITHOUT_CUDA();
//     ...
//   }
#ifndef EMBER_THIRD_PARTY_CUDA_DEVICE_CHECK_H_
#define EMBER_THIRD_PARTY_CUDA_DEVICE_CHECK_H_

#include <cuda_runtime_api.h>

#include <string>

namespace ember::testing {

// Empty when at least one device is usable; otherwise why not.
inline std::string CudaUnavailableReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky error for later calls.
    return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "no usable CUDA device: the runtime reports 0 devices";
  return "";
}

}  // namespace ember::testing

#define EMBER_SKIP_WITHOUT_CUDA()                                     \
  do {                                                                \
    std::string ember_reason = ::ember::testing::CudaUnavailableReason(); \
    if (!ember_reason.empty()) GTEST_SKIP() << ember_reason;          \
  } while (0)

#endif  // EMBER_THIRD_PARTY_CUDA_DEVICE_CHECK_H_
