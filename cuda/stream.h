// CUDA streams, as torch.cuda.Stream: each device's default stream, the
// calling thread's current stream, streams from a per-device pool, and the
// ordering calls between them (wait_stream, wait_event). Events are
// ember::Event (tensor/stream.h), which the kCUDA DeviceGuardImpl that
// //cuda:device registers backs with cudaEvent_t.
//
//   ```cpp
//   #include "cuda/stream.h"
//   #include "tensor/stream.h"
//   if (!ember::cuda::is_available()) return absl::OkStatus();
//   EMBER_ASSIGN_OR_RETURN(ember::cuda::Stream side, ember::cuda::get_stream_from_pool());
//   EMBER_ASSIGN_OR_RETURN(ember::cuda::Stream main, ember::cuda::current_stream());
//   EMBER_RETURN_IF_ERROR(side.wait_stream(main));  // side starts after main's work so far
//   {
//     ember::StreamGuard guard(side);  // side is the current stream until the scope ends
//     // ... launch kernels on ember::cuda::current_stream()->stream() ...
//   }
//   ember::Event done(ember::DeviceType::kCUDA);
//   EMBER_RETURN_IF_ERROR(done.record(side));
//   EMBER_RETURN_IF_ERROR(main.wait_event(done));  // main's later work waits for side's
//   EMBER_RETURN_IF_ERROR(main.synchronize());
//   ```
//
// Note [CUDA stream ids]: an ember::Stream names a CUDA stream by device and
// id. Id 0 is the device's default stream (the legacy NULL stream, as torch's
// default stream). Ids 1 to kStreamsPerPool are the device's normal-priority
// pool, the next kStreamsPerPool its high-priority pool. A pool's streams are
// created together on first use (non-blocking, so they do not synchronize
// with the default stream implicitly) and live until the process exits: the
// pools are the registry that maps ids to cudaStream_t, bounded at
// 2 * kStreamsPerPool streams per device, so nothing leaks however many
// streams a program asks for. Requests go round-robin over a pool, so the
// kStreamsPerPool + 1st request returns the first stream again, as in torch.
// A cuda::Stream is therefore a value, like ember::Stream, not an owner.
//
// Errors: absl::Status naming the device and stream; kFailedPrecondition
// carrying cuda::unavailable_reason() when no device is usable;
// kInvalidArgument for an ember::Stream that is not a CUDA stream this
// backend made.
//
// Thread-safety: thread-safe; the current stream is per thread and per
// device (a new thread starts on each device's default stream).
#ifndef EMBER_CUDA_STREAM_H_
#define EMBER_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cuda/device.h"
#include "tensor/device.h"
#include "tensor/stream.h"

namespace ember::cuda {

// Streams per pool: each device has a normal- and a high-priority pool.
inline constexpr int kStreamsPerPool = 32;

// A CUDA stream: an ember::Stream of a CUDA device with the cudaStream_t it
// names. Made by the functions below; converts to ember::Stream, so it can
// be given to ember::StreamGuard and ember::Event. Value type.
class Stream {
 public:
  // The CUDA stream `stream` names (Note [CUDA stream ids]); kInvalidArgument
  // for a stream of another device type or an id this backend did not make.
  static absl::StatusOr<Stream> wrap(ember::Stream stream);

  ember::Stream unwrap() const { return stream_; }
  operator ember::Stream() const { return stream_; }  // NOLINT: as c10's CUDAStream

  Device device() const { return stream_.device(); }
  int device_index() const { return stream_.device().index(); }
  int64_t id() const { return stream_.id(); }
  // The handle to launch on (nullptr for the default stream). Owned by the
  // pool; valid for the life of the process.
  cudaStream_t stream() const { return handle_; }
  // The stream's CUDA priority: lower runs first; 0 for normal priority.
  int priority() const { return priority_; }

  // True when all work queued on the stream has finished. Does not block.
  // A runtime error reads as true (nothing left to wait for) and is
  // reported by the next synchronize().
  bool query() const;
  // Blocks until all work queued on the stream has finished.
  absl::Status synchronize() const;
  // Makes work queued on this stream from now on wait until `event`
  // completes; the calling thread does not wait. A never-recorded event
  // makes nothing wait.
  absl::Status wait_event(ember::Event& event) const;
  // Makes work queued on this stream from now on wait for the work queued
  // on `other` so far (torch.cuda.Stream.wait_stream).
  absl::Status wait_stream(const Stream& other) const;
  // Records `event` at the point this stream has reached.
  absl::Status record_event(ember::Event& event) const;

  friend bool operator==(const Stream& a, const Stream& b) { return a.stream_ == b.stream_; }

 private:
  Stream(ember::Stream stream, cudaStream_t handle, int priority)
      : stream_(stream), handle_(handle), priority_(priority) {}

  ember::Stream stream_;
  cudaStream_t handle_;
  int priority_;
};

// The next stream of `device`'s pool (-1: the current device), round-robin
// (c10's getStreamFromPool; torch.cuda.Stream(priority=-1) is the
// high-priority pool). The first request on a device creates its pool.
absl::StatusOr<Stream> get_stream_from_pool(bool is_high_priority = false, int device = -1);

// The default stream of `device` (-1: the current device), id 0.
absl::StatusOr<Stream> default_stream(int device = -1);

// The calling thread's current stream on `device` (-1: the current device):
// the default stream unless an ember::StreamGuard made another current.
absl::StatusOr<Stream> current_stream(int device = -1);

// torch.cuda.is_current_stream_capturing: whether the calling thread's
// current stream of `device` (-1: the current device) is capturing a CUDA
// graph (cuda/graphs.h). False without a usable device.
bool is_current_stream_capturing(int device = -1);

namespace internal {

// The cudaStream_t `stream` names and its device index, checking that it is
// a CUDA stream of a usable device that this backend made; errors name `call`.
struct ResolvedStream {
  int device;
  cudaStream_t handle;
  int priority;
};
absl::StatusOr<ResolvedStream> ResolveStream(absl::string_view call, ember::Stream stream);

// "cuda:0 stream 3" or "cuda:0 default stream", for messages.
std::string DescribeStream(ember::Stream stream);

// Throws ember::Error naming `what` when the calling thread's current stream
// of `device` is capturing a CUDA graph: `what` waits for the device (a copy
// to the host, a synchronize), which a capture cannot hold (Note [Capturing a
// graph] in cuda/graphs.h).
void CheckNotCapturing(Device device, const char* what);

}  // namespace internal

}  // namespace ember::cuda

#endif  // EMBER_CUDA_STREAM_H_
