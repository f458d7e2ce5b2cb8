// What parallel/'s GPU tests share (testonly): skipping a GPU case where too
// few devices are usable, saying why, a device name, and running a rank's
// body with ember::Error turned into a Status.
//
//   TEST(DdpCudaTest, Foo) {
//     RunOnCpu();                     // the CPU side runs everywhere
//     EMBER_SKIP_WITHOUT_GPUS(1);
//     RunOn(ember::parallel::cuda_testing::Cuda(0));
//   }
#ifndef EMBER_PARALLEL_CUDA_TESTING_H_
#define EMBER_PARALLEL_CUDA_TESTING_H_

#include <functional>

#include "absl/status/status.h"
#include "cuda/device.h"
#include "gtest/gtest.h"
#include "tensor/device.h"
#include "tensor/error.h"

// Skips the rest of the test unless `n` CUDA devices are usable.
#define EMBER_SKIP_WITHOUT_GPUS(n)                                                    \
  do {                                                                                \
    if (!::ember::cuda::is_available()) {                                             \
      GTEST_SKIP() << "the CPU side passed; the GPU side needs a GPU: "               \
                   << ::ember::cuda::unavailable_reason();                            \
    }                                                                                 \
    if (::ember::cuda::device_count() < (n)) {                                        \
      GTEST_SKIP() << "the GPU side needs " << (n) << " GPUs, this machine has "      \
                   << ::ember::cuda::device_count();                                  \
    }                                                                                 \
  } while (0)

namespace ember::parallel::cuda_testing {

inline Device Cuda(int index) { return Device(DeviceType::kCUDA, index); }

// `body`'s Status, or kInternal with the message of an ember::Error it threw.
inline absl::Status Guard(const std::function<absl::Status()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace ember::parallel::cuda_testing

#endif  // EMBER_PARALLEL_CUDA_TESTING_H_
