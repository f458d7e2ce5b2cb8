// Device: where a tensor's memory lives, "cpu" or "cuda:N"; and Stream, an
// ordered queue of work on one device.
//
//   ```cpp
//   #include "tensor/device.h"
//   EMBER_ASSIGN_OR_RETURN(ember::Device d, ember::Device::parse("cuda:1"));
//   // d.is_cuda(), d.index() == 1, d.str() == "cuda:1"
//   ember::Device cpu = ember::kCPU;
//   if (cpu == d) return absl::InternalError("cpu and cuda:1 compare equal");
//   ```
//
// A CUDA device without an index ("cuda") means the current device. Parsing
// follows torch.device: "cpu", "cuda", "cuda:N"; anything else is an
// InvalidArgument error that names the string and lists the accepted forms.
// Value type; thread-compatible.
#ifndef EMBER_TENSOR_DEVICE_H_
#define EMBER_TENSOR_DEVICE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ember {

enum class DeviceType : int8_t { kCPU = 0, kCUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

std::string_view DeviceTypeName(DeviceType type);

class Device {
 public:
  // A CPU device, or `type` with `index` (-1: no index given).
  constexpr Device(DeviceType type = DeviceType::kCPU, int index = -1)  // NOLINT
      : type_(type), index_(index) {}

  static absl::StatusOr<Device> parse(std::string_view text);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool has_index() const { return index_ >= 0; }
  bool is_cpu() const { return type_ == DeviceType::kCPU; }
  bool is_cuda() const { return type_ == DeviceType::kCUDA; }
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) = default;

 private:
  DeviceType type_;
  int index_;
};

inline constexpr Device kCPU{DeviceType::kCPU};

// A stream: an ordered queue of work on one device (torch.Stream). Streams
// of one device are told apart by `id`; id 0 is the device's default stream.
// Value type; the backend owns what the id names.
class Stream {
 public:
  constexpr Stream(Device device = Device(DeviceType::kCPU), int64_t id = 0)  // NOLINT
      : device_(device), id_(id) {}
  Device device() const { return device_; }
  int64_t id() const { return id_; }
  friend bool operator==(const Stream& a, const Stream& b) = default;

 private:
  Device device_;
  int64_t id_;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace ember

#endif  // EMBER_TENSOR_DEVICE_H_
