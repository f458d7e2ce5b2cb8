// Test kernels (testonly) for the stream and event tests: one that keeps a
// stream busy for a set time and then publishes a value, and one that copies
// a value, so that a test can tell whether work on one stream waited for
// work on another.
#ifndef EMBER_CUDA_TESTING_KERNELS_H_
#define EMBER_CUDA_TESTING_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::cuda::testing {

// One thread on `stream` spins for `nanoseconds` of the GPU's global timer,
// then stores `value` to the device int `slot`. Returns the launch error.
cudaError_t LaunchSpinThenStore(cudaStream_t stream, int64_t nanoseconds, int* slot, int value);

// One thread on `stream` copies the device int `from` to `to`.
cudaError_t LaunchCopyInt(cudaStream_t stream, const int* from, int* to);

}  // namespace ember::cuda::testing

#endif  // EMBER_CUDA_TESTING_KERNELS_H_
