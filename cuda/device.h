// CUDA devices, as torch.cuda: whether CUDA can be used in this process and
// why not, how many devices it sees, the calling thread's current device,
// each device's properties, and waiting for a device to finish its work.
//
//   ```cpp
//   #include "cuda/device.h"
//   if (!ember::cuda::is_available()) {
//     // e.g. "cudaErrorInsufficientDriver: CUDA driver version is insufficient
//     // for CUDA runtime version"; every call below fails with it.
//     std::string why = ember::cuda::unavailable_reason();
//     absl::Status s = ember::cuda::set_device(0);  // kFailedPrecondition, names `why`
//     if (s.ok() || why.empty()) return absl::InternalError("no device, yet no reason");
//     return absl::OkStatus();
//   }
//   EMBER_RETURN_IF_ERROR(ember::cuda::set_device(ember::cuda::device_count() - 1));
//   EMBER_ASSIGN_OR_RETURN(ember::DeviceProperties p, ember::cuda::get_device_properties(0));
//   // p.name ("NVIDIA H100 80GB HBM3"), p.total_memory, p.major and p.minor (9, 0)
//   EMBER_RETURN_IF_ERROR(ember::cuda::synchronize());  // the current device
//   ```
//
// The runtime is asked once, on the first call that needs it, how many
// devices there are; the answer (and the reason when there are none) holds
// for the life of the process. Which devices the process sees is the CUDA
// runtime's own business: CUDA_VISIBLE_DEVICES ("1,0", "" for none) hides and
// renumbers them, and must be set before the first call (in practice, before
// the process starts).
//
// Linking //cuda:device also registers the kCUDA DeviceGuardImpl
// (tensor/device_guard.h), so ember::DeviceGuard, ember::device_count,
// ember::current_stream, ember::StreamGuard and ember::Event work on CUDA
// devices; with no usable device it reports 0 devices and its calls fail
// as described above, never crash.
//
// Errors: devices are the environment (README.md "API rules"), so calls
// return absl::Status. No usable device: kFailedPrecondition carrying
// unavailable_reason(). A device index that does not exist: kInvalidArgument
// with torch's "CUDA error: invalid device ordinal", the index and the count
// (ember::DeviceGuard and tensor factories naming such a device throw
// ember::Error with it; none of them falls back to the current device).
// Runtime failures: as cuda/status.h maps them.
//
// Fork: a process forked after its parent initialised CUDA cannot use it
// (the driver does not survive fork). In such a child is_available() is
// false, device_count() is 0 and unavailable_reason() is torch's "Cannot
// re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing,
// you must use the 'spawn' start method", which every call then fails with.
//
// Thread-safety: thread-safe. The current device is per thread, as in the
// CUDA runtime (a new thread starts on device 0). Note [Restoring the current
// device] in device.cc: restoring a device that has no context yet is
// deferred, so a thread that only works on cuda:3 creates no context on cuda:0.
#ifndef EMBER_CUDA_DEVICE_H_
#define EMBER_CUDA_DEVICE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/device_guard.h"

namespace ember::cuda {

// True when the runtime sees at least one device (torch.cuda.is_available).
// Never fails; the first call asks the runtime.
bool is_available();

// Empty when is_available(); otherwise why not: the runtime's error name and
// description ("cudaErrorNoDevice: no CUDA-capable device is detected"), plus
// the value of CUDA_VISIBLE_DEVICES when it is set.
const std::string& unavailable_reason();

// How many devices this process sees; 0 without a driver or device.
int device_count();

// The calling thread's current device index; -1 when !is_available().
int current_device();

// Makes `device` the calling thread's current device (torch.cuda.set_device).
// kInvalidArgument names the index and the count when it is out of range.
absl::Status set_device(int device);

// Name, memory, multiprocessors and compute capability of `device`, read
// from the runtime once per device.
absl::StatusOr<DeviceProperties> get_device_properties(int device);

// Blocks until all work queued on `device` (-1: the current device), on every
// stream, has finished (torch.cuda.synchronize). Reports a kernel's
// asynchronous failure, if one happened.
absl::Status synchronize(int device = -1);

namespace internal {

// The id of the CUDA graph capture `stream` takes part in
// (cudaStreamGetCaptureInfo), or nullopt when it is not capturing (or names
// no stream of a usable device). Defined with the streams (stream.cc).
std::optional<unsigned long long> CaptureIdOf(Stream stream);

// OK when a device is usable; otherwise kFailedPrecondition naming `call` and
// the reason.
absl::Status CheckAvailable(absl::string_view call);

// `device`, or the current device for -1, after checking that CUDA is usable
// and the index is in range; the errors name `call`.
absl::StatusOr<int> CheckDevice(absl::string_view call, int device);

// kInvalidArgument: torch's "CUDA error: invalid device ordinal" for
// `device` in a process that sees `count` devices, naming `call` and what to do.
absl::Status InvalidDeviceOrdinal(absl::string_view call, int device, int count);

// Runs `body` with `device` current on the calling thread, then restores the
// device that was; `device` must be valid.
template <typename F>
auto OnDevice(int device, F&& body) -> decltype(body());

// Makes `device` the runtime's current device for the calling thread (unless
// it is already) and drops a deferred restore; returns the device that was
// current as current_device() reports it (or the runtime's error).
absl::StatusOr<int> ExchangeCurrentDevice(int device);

// Makes `device` current again after an Exchange: at once when it is the
// runtime's current device or has a primary context, else deferred
// (current_device() reports it; the runtime's device stays where work last
// went). Never fails: a failing cudaSetDevice is deferred too.
void RestoreCurrentDevice(int device);

// What RestoreCurrentDevice does for `device` when the runtime's current
// device is `runtime_device` and `device` has a context or not.
enum class RestoreAction { kNothing, kSetDevice, kDefer };
RestoreAction PlanRestore(int device, int runtime_device, bool device_has_context);

// Marks CUDA initialised in this process (the first successful device count
// does): a child forked from now on reports the fork error above.
void MarkCudaInitialized();

// The message a forked child reports (see "Fork" above).
const std::string& ForkedChildReason();

}  // namespace internal

}  // namespace ember::cuda

// Implementation details.

namespace ember::cuda::internal {

template <typename F>
auto OnDevice(int device, F&& body) -> decltype(body()) {
  absl::StatusOr<int> previous = ExchangeCurrentDevice(device);
  if (!previous.ok()) return previous.status();
  auto result = body();
  if (*previous != device && *previous >= 0) RestoreCurrentDevice(*previous);
  return result;
}

}  // namespace ember::cuda::internal

#endif  // EMBER_CUDA_DEVICE_H_
