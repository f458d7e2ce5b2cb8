#include "tensor/device.h"

#include <algorithm>
#include <charconv>

#include "tensor/error.h"

namespace ember {

std::string_view DeviceTypeName(DeviceType type) {
  return type == DeviceType::kCUDA ? "cuda" : "cpu";
}

absl::StatusOr<Device> Device::parse(std::string_view text) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(internal::Concat(
        "invalid device string '", text, "': ", why,
        "; expected 'cpu', 'cuda' or 'cuda:N' with N a non-negative integer"));
  };
  std::string_view type = text, index;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    type = text.substr(0, colon);
    index = text.substr(colon + 1);
  }
  DeviceType dt;
  if (type == "cpu") {
    dt = DeviceType::kCPU;
  } else if (type == "cuda") {
    dt = DeviceType::kCUDA;
  } else {
    return invalid(internal::Concat("unknown device type '", type, "'"));
  }
  if (text.find(':') == std::string_view::npos) return Device(dt);
  int value = -1;
  bool digits = !index.empty() && std::all_of(index.begin(), index.end(),
                                             [](char c) { return c >= '0' && c <= '9'; });
  auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), value);
  if (!digits || ec != std::errc() || end != index.data() + index.size() || value < 0) {
    return invalid(internal::Concat("device index '", index, "' is not a non-negative integer"));
  }
  if (dt == DeviceType::kCPU && value != 0) {
    return invalid(internal::Concat("the cpu device has only index 0, got ", value));
  }
  return Device(dt, value);
}

std::string Device::str() const {
  if (!has_index()) return std::string(DeviceTypeName(type_));
  return internal::Concat(DeviceTypeName(type_), ":", index_);
}

std::ostream& operator<<(std::ostream& os, const Device& device) {
  return os << device.str();
}

}  // namespace ember
