// A tiny kernel that exercises the cuda_library macro (tools/cuda.bzl).
#ifndef EMBER_TOOLS_SAXPY_KERNEL_H_
#define EMBER_TOOLS_SAXPY_KERNEL_H_

#include <cuda_runtime_api.h>

namespace ember::tools {

// y[i] = a * x[i] + y[i] for i < n, on device pointers; asynchronous on the
// default stream. Returns the launch error, if any.
cudaError_t LaunchSaxpy(int n, float a, const float* x, float* y);

// The architectures the object was compiled for (e.g. 900 for sm_90), as
// reported by the kernel's attributes; needs a device.
cudaError_t SaxpyBinaryVersion(int* version);

}  // namespace ember::tools

#endif  // EMBER_TOOLS_SAXPY_KERNEL_H_
