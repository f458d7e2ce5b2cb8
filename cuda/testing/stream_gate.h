// A gate that holds a CUDA stream (testonly): work queued on the stream after
// Close() does not start until the test calls Open(), so a test can check
// what the host does while the stream is busy ("the call returned before its
// copy ran", "the watchdog failed the op stuck behind it") without a race
// against a kernel that spins for a set time.
//
//   ember::cuda::testing::StreamGate gate;
//   ASSERT_TRUE(gate.Close(stream.stream()).ok());
//   const Tensor dev = host.to(kCuda0, /*non_blocking=*/true);
//   EXPECT_FALSE(stream.query());  // the copy waits behind the gate
//   gate.Open();
//   ASSERT_TRUE(stream.synchronize().ok());
//
// The gate is a host function (cudaLaunchHostFunc) that waits for Open(). A
// call that waits for the held stream (a synchronizing allocation, the first
// launch of a kernel while CUDA loads modules lazily, a stream or device
// synchronize) would wait for the test; so that such a bug fails the test
// instead of hanging it, the host function gives up after `give_up` and
// gave_up() says so. Load kernels and fill the allocators' caches before
// closing the gate. The destructor opens the gate; it does not wait for the
// stream.
//
// Thread-safety: Open() and gave_up() may be called from any thread.
#ifndef EMBER_CUDA_TESTING_STREAM_GATE_H_
#define EMBER_CUDA_TESTING_STREAM_GATE_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember::cuda::testing {

class StreamGate {
 public:
  explicit StreamGate(absl::Duration give_up = absl::Seconds(30));
  ~StreamGate();  // Open()
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // Queues the gate on `stream`: the stream's later work waits until Open()
  // (or `give_up` after the stream reached the gate). Returns
  // cudaLaunchHostFunc's error. May be called for several streams.
  absl::Status Close(cudaStream_t stream);
  // Lets every stream the gate holds go on. Does not block.
  void Open();
  // Whether a host function stopped waiting because `give_up` passed: the
  // stream ran on although the test had not opened the gate.
  bool gave_up() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the queued host functions
};

}  // namespace ember::cuda::testing

#endif  // EMBER_CUDA_TESTING_STREAM_GATE_H_
