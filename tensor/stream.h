// Streams and events of any device type, as torch.Stream / torch.Event and
// c10's StreamGuard: the calling thread's current stream per device, a
// scoped guard that makes a stream (and its device) current, and events that
// order work between streams and time it. Each call goes to the
// DeviceGuardImpl registered for the device's type (tensor/device_guard.h);
// the CPU, which has none, has one stream (id 0) and no events.
//
//   ```cpp
//   #include "tensor/stream.h"
//   ember::Stream s = ember::current_stream(ember::kCPU);  // Stream(kCPU, 0)
//   {
//     ember::StreamGuard guard(s);  // current on its device until the scope ends
//   }
//   ember::Event done(ember::DeviceType::kCPU);
//   absl::Status st = done.record(s);  // kUnimplemented: the CPU has no events
//   ```
//
// Errors touch devices, so they are absl::Status (README.md "API rules").
// Thread-safety: current streams are per thread; an Event is
// thread-compatible.
#ifndef EMBER_TENSOR_STREAM_H_
#define EMBER_TENSOR_STREAM_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/device.h"
#include "tensor/device_guard.h"

namespace ember {

// The calling thread's current stream on `device` (its current device of
// that type when `device` has no index). Stream(device, 0) for a type
// without an implementation.
Stream current_stream(Device device);

// Blocks until the work queued on `stream` has finished.
absl::Status synchronize(Stream stream);

// A stream of `device` (its current device of that type when `device` has
// no index) for work beside the caller's: the next stream of the backend's
// pool (torch.cuda.Stream(), c10's getStreamFromPool), high priority if
// asked. Stream(device, 0) for a type without an implementation.
absl::StatusOr<Stream> get_stream_from_pool(Device device, bool high_priority = false);

// Scoped: `stream` is the current stream of its device, and that device the
// current device, until the guard ends; then both are restored. A no-op for
// a type without an implementation.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  DeviceGuardImpl* impl_ = nullptr;
  Device previous_device_;
  Stream previous_stream_;
};

// A marker in a stream's work (torch.Event). Created lazily on its first
// record, on the recording stream's device; every later record must be on a
// stream of that device. Never recorded, it counts as complete: query() is
// true and block() does nothing, as in torch.
class Event {
 public:
  explicit Event(DeviceType type, bool enable_timing = false)
      : type_(type), enable_timing_(enable_timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  DeviceType device_type() const { return type_; }
  // The device of the first record (no index before it).
  Device device() const { return device_; }
  bool was_recorded() const { return event_ != nullptr; }

  // Records the point `stream` has reached. InvalidArgument for a stream of
  // another device type, or of another device than the first record's.
  absl::Status record(Stream stream);
  // Makes the work queued on `stream` from now on wait for this event.
  absl::Status block(Stream stream);
  // True when the work before the last record has finished.
  bool query() const;
  // Blocks the calling thread until then.
  absl::Status synchronize();
  // Milliseconds from this event to `end`, both recorded with timing and
  // complete (torch.Event.elapsed_time).
  absl::StatusOr<double> elapsed_time(const Event& end) const;

 private:
  void Release() noexcept;

  DeviceType type_;
  bool enable_timing_;
  Device device_{DeviceType::kCPU};
  void* event_ = nullptr;
};

}  // namespace ember

#endif  // EMBER_TENSOR_STREAM_H_
