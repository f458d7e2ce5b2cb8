#include "tensor/stream.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ember {
namespace {

Device WithIndex(DeviceGuardImpl* impl, Device device) {
  return device.has_index() ? device : impl->GetDevice();
}

}  // namespace

Stream current_stream(Device device) {
  DeviceGuardImpl* impl = GetDeviceGuardImpl(device.type());
  if (impl == nullptr) return Stream(device, 0);
  return impl->GetStream(WithIndex(impl, device));
}

absl::Status synchronize(Stream stream) {
  DeviceGuardImpl* impl = GetDeviceGuardImpl(stream.device().type());
  return impl == nullptr ? absl::OkStatus() : impl->SynchronizeStream(stream);
}

absl::StatusOr<Stream> get_stream_from_pool(Device device, bool high_priority) {
  DeviceGuardImpl* impl = GetDeviceGuardImpl(device.type());
  if (impl == nullptr) return Stream(device, 0);
  return impl->GetStreamFromPool(WithIndex(impl, device), high_priority);
}

StreamGuard::StreamGuard(Stream stream)
    : previous_device_(stream.device()), previous_stream_(stream) {
  impl_ = GetDeviceGuardImpl(stream.device().type());
  if (impl_ == nullptr) return;
  const Stream target(WithIndex(impl_, stream.device()), stream.id());
  previous_device_ = impl_->ExchangeDevice(target.device());
  previous_stream_ = impl_->ExchangeStream(target);
}

StreamGuard::~StreamGuard() {
  if (impl_ == nullptr) return;
  impl_->ExchangeStream(previous_stream_);
  impl_->RestoreDevice(previous_device_);
}

Event::~Event() { Release(); }

Event::Event(Event&& other) noexcept
    : type_(other.type_),
      enable_timing_(other.enable_timing_),
      device_(other.device_),
      event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Release();
    type_ = other.type_;
    enable_timing_ = other.enable_timing_;
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::Release() noexcept {
  if (event_ == nullptr) return;
  if (DeviceGuardImpl* impl = GetDeviceGuardImpl(type_)) impl->DestroyEvent(event_, device_);
  event_ = nullptr;
}

absl::Status Event::record(Stream stream) {
  if (stream.device().type() != type_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Event::record: an event of device type ", std::string(DeviceTypeName(type_)),
                     " cannot be recorded on a stream of ", stream.device().str()));
  }
  DeviceGuardImpl* impl = GetDeviceGuardImpl(type_);
  if (impl == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("Event::record: ", std::string(DeviceTypeName(type_)),
                     " runs its work synchronously and has no events"));
  }
  const Stream target(WithIndex(impl, stream.device()), stream.id());
  if (event_ == nullptr) {
    absl::StatusOr<void*> created = impl->CreateEvent(target.device(), enable_timing_);
    if (!created.ok()) return created.status();
    event_ = *created;
    device_ = target.device();
  } else if (target.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Event::record: the event was first recorded on ", device_.str(),
                     " and cannot be recorded on a stream of ", target.device().str(),
                     "; use one event per device"));
  }
  return impl->RecordEvent(event_, target);
}

absl::Status Event::block(Stream stream) {
  if (event_ == nullptr) return absl::OkStatus();
  if (stream.device().type() != type_) {
    return absl::InvalidArgumentError(absl::StrCat("Event::block: an event of ", device_.str(),
                                                   " cannot block a stream of ",
                                                   stream.device().str()));
  }
  DeviceGuardImpl* impl = GetDeviceGuardImpl(type_);
  return impl->BlockOnEvent(event_, Stream(WithIndex(impl, stream.device()), stream.id()));
}

bool Event::query() const {
  if (event_ == nullptr) return true;
  return GetDeviceGuardImpl(type_)->QueryEvent(event_);
}

absl::Status Event::synchronize() {
  if (event_ == nullptr) return absl::OkStatus();
  return GetDeviceGuardImpl(type_)->SynchronizeEvent(event_);
}

absl::StatusOr<double> Event::elapsed_time(const Event& end) const {
  if (!enable_timing_ || !end.enable_timing_) {
    return absl::FailedPreconditionError(
        "Event::elapsed_time: both events need enable_timing = true");
  }
  if (event_ == nullptr || end.event_ == nullptr) {
    return absl::FailedPreconditionError(
        "Event::elapsed_time: both events must be recorded before they are timed");
  }
  if (type_ != end.type_ || device_ != end.device_) {
    return absl::InvalidArgumentError(absl::StrCat("Event::elapsed_time: events on ", device_.str(),
                                                   " and ", end.device_.str(),
                                                   " cannot be timed against each other"));
  }
  return GetDeviceGuardImpl(type_)->ElapsedTime(event_, end.event_);
}

}  // namespace ember
