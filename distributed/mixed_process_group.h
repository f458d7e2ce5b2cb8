// MixedProcessGroup: one group that runs each op on the backend of its
// tensors' device type, as a backend string such as "cpu:gloo,cuda:nccl"
// asks (torch.distributed accepts the same form). find_backend builds one
// from such a string (backend_registry.cc); each listed backend makes its own
// group over the same ranks, with keys under "<group>/<device type>/".
//
//   ```cpp
//   #include "distributed/mixed_process_group.h"
//   EMBER_ASSIGN_OR_RETURN(auto parts,
//                          ember::distributed::parse_device_backends("cpu:gloo,cuda:nccl"));
//   // parts == {{kCPU, "gloo"}, {kCUDA, "nccl"}}
//   ```
//
// Routing: every op with tensors runs on the group of their device type (the
// support table is each backend's rows for its own device, so an op the
// chosen backend lacks fails naming the mixed backend, the op and the
// device); barrier and monitored_barrier, which carry no tensor, run on the
// CPU backend when one is listed, else on the first. abort() aborts them all.
//
// Thread-safety: as the backends it holds.
#ifndef EMBER_DISTRIBUTED_MIXED_PROCESS_GROUP_H_
#define EMBER_DISTRIBUTED_MIXED_PROCESS_GROUP_H_

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/process_group.h"

namespace ember::distributed {

// "cpu:gloo,cuda:nccl" -> {{kCPU, "gloo"}, {kCUDA, "nccl"}}, in the order
// written (backend names lower-cased). kInvalidArgument naming the entry for
// an entry without "device:", an unknown device type, a device listed twice
// or an empty backend name.
absl::StatusOr<std::vector<std::pair<DeviceType, std::string>>> parse_device_backends(
    std::string_view spec);

class MixedProcessGroup : public ProcessGroup {
 public:
  using Groups = std::array<std::shared_ptr<ProcessGroup>, kNumDeviceTypes>;
  // `groups[d]`: the group for device type d, or null; `support`: the rows
  // of each for its own device; `untyped`: the device whose group runs the
  // ops without tensors (it must have a group).
  MixedProcessGroup(int rank, int size, std::string name, SupportTable support,
                    absl::Duration timeout, Groups groups, DeviceType untyped);

  void abort() override;
  // Passes the hook on to each backend, with the part of the prefix the new
  // group's part for that backend will have ("cuda/").
  absl::Status split_for_new_group(const BackendOptions& group,
                                   const std::string& part) override;
  // Passes shrink_group's hook on to each backend, as split_for_new_group.
  absl::Status shrink_for_new_group(const BackendOptions& group, absl::Span<const int> excluded,
                                    bool abort_first, const std::string& part) override;

 protected:
  absl::StatusOr<std::shared_ptr<Work>> DoBroadcast(const Tensor& tensor,
                                                    const BroadcastOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduce(const Tensor& tensor,
                                                    const AllReduceOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoReduce(const Tensor& tensor,
                                                 const ReduceOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllGather(absl::Span<const Tensor> outputs,
                                                    const Tensor& input,
                                                    const AllGatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllGatherIntoTensor(
      const Tensor& output, const Tensor& input, const AllGatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoGather(absl::Span<const Tensor> outputs,
                                                 const Tensor& input,
                                                 const GatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoScatter(const Tensor& output,
                                                  absl::Span<const Tensor> inputs,
                                                  const ScatterOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoReduceScatter(
      const Tensor& output, absl::Span<const Tensor> inputs,
      const ReduceScatterOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoAllToAll(absl::Span<const Tensor> outputs,
                                                   absl::Span<const Tensor> inputs,
                                                   const AllToAllOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoBarrier(const BarrierOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoMonitoredBarrier(
      const MonitoredBarrierOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> DoSend(const Tensor& tensor, int dst,
                                               const P2POptions& options) override;
  absl::StatusOr<std::shared_ptr<RecvWork>> DoRecv(const Tensor& tensor, int src,
                                                   const P2POptions& options) override;

 private:
  // The group for `tensor`'s device type (the support table guarantees one).
  ProcessGroup& For(const Tensor& tensor) const;

  const Groups groups_;
  const DeviceType untyped_;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_MIXED_PROCESS_GROUP_H_
