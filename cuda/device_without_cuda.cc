// cuda/device.h in a build without CUDA support (Note [Builds with and
// without CUDA] in tools/cuda_configure.bzl): the no-device state of
// device.cc, fixed at build time. No CUDA header or library is needed: there
// are no devices, unavailable_reason() says why, and every call that returns
// a Status fails with kFailedPrecondition carrying that reason, exactly as
// device.cc does on a machine without a usable GPU.
//
// Linking it registers a kCUDA DeviceGuardImpl that reports 0 devices, so
// ember::DeviceGuard and ember::StreamGuard on a CUDA device do nothing and
// ember::Event's record on a CUDA stream fails with the same reason, as they
// do with device.cc and no device.
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"

namespace ember::cuda {
namespace {

absl::Status Unavailable(absl::string_view call) {
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": CUDA is not available in this process: ", unavailable_reason()));
}

// The kCUDA DeviceGuardImpl without devices: as device.cc's with a device
// count of 0.
class NoCudaGuardImpl final : public DeviceGuardImpl {
 public:
  Device ExchangeDevice(Device device) override { return GetDevice(); }
  Device GetDevice() const override { return Device(DeviceType::kCUDA, current_device()); }
  int DeviceCount() const override { return 0; }
  DeviceProperties Properties(int index) const override { return DeviceProperties{}; }
  ember::Stream GetStream(Device device) const override { return ember::Stream(device, 0); }
  ember::Stream ExchangeStream(ember::Stream stream) override {
    return ember::Stream(stream.device(), 0);
  }
  absl::Status SynchronizeStream(ember::Stream stream) override {
    return Unavailable("synchronize");
  }
  bool QueryStream(ember::Stream stream) const override { return true; }
  absl::StatusOr<void*> CreateEvent(Device device, bool enable_timing) override {
    return Unavailable("Event::record");
  }
  // No event is ever created, so none is ever destroyed, recorded or waited on.
  void DestroyEvent(void* event, Device device) noexcept override {}
  absl::Status RecordEvent(void* event, ember::Stream stream) override {
    return Unavailable("Event::record");
  }
  absl::Status BlockOnEvent(void* event, ember::Stream stream) override {
    return Unavailable("Event::block");
  }
  bool QueryEvent(void* event) const override { return true; }
  absl::Status SynchronizeEvent(void* event) override { return Unavailable("Event::synchronize"); }
  absl::StatusOr<double> ElapsedTime(void* start, void* end) const override {
    return Unavailable("Event::elapsed_time");
  }
};

// Registered when the library is loaded (the target is alwayslink).
[[maybe_unused]] const bool registered = [] {
  static NoCudaGuardImpl* const impl = new NoCudaGuardImpl();
  SetDeviceGuardImpl(DeviceType::kCUDA, impl);
  return true;
}();

}  // namespace

bool is_available() { return false; }

const std::string& unavailable_reason() {
  static const std::string* const reason = new std::string("Ember was built without CUDA support");
  return *reason;
}

int device_count() { return 0; }

int current_device() { return -1; }

absl::Status set_device(int device) { return Unavailable("cuda::set_device"); }

absl::StatusOr<DeviceProperties> get_device_properties(int device) {
  return Unavailable("cuda::get_device_properties");
}

absl::Status synchronize(int device) { return Unavailable("cuda::synchronize"); }

namespace internal {

absl::Status CheckAvailable(absl::string_view call) { return Unavailable(call); }

absl::StatusOr<int> CheckDevice(absl::string_view call, int device) { return Unavailable(call); }

absl::Status InvalidDeviceOrdinal(absl::string_view call, int device, int count) {
  std::string seen = count == 0 ? "no CUDA devices"
                     : count == 1
                         ? "1 CUDA device (cuda:0)"
                         : absl::StrCat(count, " CUDA devices (cuda:0 to cuda:", count - 1, ")");
  return absl::InvalidArgumentError(absl::StrCat(
      call, ": CUDA error: invalid device ordinal: device index ", device,
      " does not exist; this process sees ", seen, ". Use an index from that range, or set ",
      "CUDA_VISIBLE_DEVICES before the process starts to choose which devices it sees"));
}

absl::StatusOr<int> ExchangeCurrentDevice(int device) {
  return Unavailable("cuda::ExchangeCurrentDevice");
}

// Nothing was ever made current, so there is nothing to restore.
void RestoreCurrentDevice(int device) {}

RestoreAction PlanRestore(int device, int runtime_device, bool device_has_context) {
  if (device == runtime_device) return RestoreAction::kNothing;
  return device_has_context ? RestoreAction::kSetDevice : RestoreAction::kDefer;
}

// CUDA is never initialised, so a forked child has nothing to lose.
void MarkCudaInitialized() {}

const std::string& ForkedChildReason() {
  static const std::string* const reason = new std::string(
      "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
      "must use the 'spawn' start method (this process was forked after its parent had "
      "initialised CUDA, and the CUDA driver does not survive fork)");
  return *reason;
}

}  // namespace internal

}  // namespace ember::cuda
