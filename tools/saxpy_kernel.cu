#include "tools/saxpy_kernel.h"

namespace ember::tools {
namespace {

__global__ void Saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

}  // namespace

cudaError_t LaunchSaxpy(int n, float a, const float* x, float* y) {
  Saxpy<<<(n + 255) / 256, 256>>>(n, a, x, y);
  return cudaGetLastError();
}

cudaError_t SaxpyBinaryVersion(int* version) {
  cudaFuncAttributes attrs;
  cudaError_t err = cudaFuncGetAttributes(&attrs, Saxpy);
  if (err == cudaSuccess) *version = attrs.binaryVersion * 10;
  return err;
}

}  // namespace ember::tools
