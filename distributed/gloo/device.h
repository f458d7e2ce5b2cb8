// The gloo transport device of a group: which network address gloo listens
// on and publishes to its peers, chosen as PyTorch's ProcessGroupGloo does.
//
//   EMBER_ASSIGN_OR_RETURN(DeviceChoice choice, ChooseDevice());
//   EMBER_ASSIGN_OR_RETURN(auto device, CreateDevice(choice));
//
// Order: GLOO_SOCKET_IFNAME (an interface name; PyTorch accepts a
// comma-separated list and stripes over them, Ember uses the first and says
// so in `describe`), else the address this host's name resolves to when a
// socket can be bound to it, else the loopback address 127.0.0.1.
//
// Errors: kInvalidArgument naming GLOO_SOCKET_IFNAME's value when gloo cannot
// use that interface. Thread-safety: thread-safe.
#ifndef EMBER_DISTRIBUTED_GLOO_DEVICE_H_
#define EMBER_DISTRIBUTED_GLOO_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gloo/transport/device.h"

namespace ember::distributed::gloo {

struct DeviceChoice {
  // Exactly one of the two is set.
  std::string interface;  // from GLOO_SOCKET_IFNAME
  std::string hostname;   // this host's name, or "127.0.0.1"
  // For messages and tests: "interface eth0 (GLOO_SOCKET_IFNAME)",
  // "hostname node7", "loopback 127.0.0.1 (...)".
  std::string describe;
};

// Reads GLOO_SOCKET_IFNAME and resolves the host name; touches no gloo state.
DeviceChoice ChooseDevice();

// Creates gloo's tcp device for `choice`. It starts gloo's network thread,
// which runs under SCHED_BATCH when the caller runs under SCHED_OTHER (Note
// [gloo's network thread] in device.cc; EMBER_GLOO_BATCH_NETWORK_THREAD=0:
// the caller's policy); the caller's own policy is unchanged.
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateDevice(const DeviceChoice& choice);

}  // namespace ember::distributed::gloo

#endif  // EMBER_DISTRIBUTED_GLOO_DEVICE_H_
