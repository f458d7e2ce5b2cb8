#include "cuda/testing_kernels.h"

namespace ember::cuda::testing {
namespace {

__device__ uint64_t GlobalNanoseconds() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinThenStore(int64_t nanoseconds, int* slot, int value) {
  const uint64_t end = GlobalNanoseconds() + static_cast<uint64_t>(nanoseconds);
  while (GlobalNanoseconds() < end) {
  }
  *reinterpret_cast<volatile int*>(slot) = value;
  __threadfence_system();
}

__global__ void CopyInt(const int* from, int* to) {
  *to = *reinterpret_cast<const volatile int*>(from);
}

}  // namespace

cudaError_t LaunchSpinThenStore(cudaStream_t stream, int64_t nanoseconds, int* slot, int value) {
  SpinThenStore<<<1, 1, 0, stream>>>(nanoseconds, slot, value);
  return cudaGetLastError();
}

cudaError_t LaunchCopyInt(cudaStream_t stream, const int* from, int* to) {
  CopyInt<<<1, 1, 0, stream>>>(from, to);
  return cudaGetLastError();
}

}  // namespace ember::cuda::testing
