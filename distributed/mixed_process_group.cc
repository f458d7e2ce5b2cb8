#include "distributed/mixed_process_group.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ember::distributed {

absl::StatusOr<std::vector<std::pair<DeviceType, std::string>>> parse_device_backends(
    std::string_view spec) {
  std::vector<std::pair<DeviceType, std::string>> parts;
  bool seen[kNumDeviceTypes] = {};
  const std::string text(spec);
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    const std::string entry(absl::StripAsciiWhitespace(piece));
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend '", text, "': entry '", entry, "' ", std::string(why),
                       "; write device:backend pairs, e.g. cpu:gloo,cuda:nccl"));
    };
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) return bad("names no device");
    const std::string device = absl::AsciiStrToLower(entry.substr(0, colon));
    const std::string backend = absl::AsciiStrToLower(entry.substr(colon + 1));
    DeviceType type;
    if (device == DeviceTypeName(DeviceType::kCPU)) {
      type = DeviceType::kCPU;
    } else if (device == DeviceTypeName(DeviceType::kCUDA)) {
      type = DeviceType::kCUDA;
    } else {
      return bad("names an unknown device type (known: cpu, cuda)");
    }
    if (backend.empty()) return bad("names no backend");
    if (seen[static_cast<int>(type)]) return bad("lists a device type a second time");
    seen[static_cast<int>(type)] = true;
    parts.emplace_back(type, backend);
  }
  return parts;
}

MixedProcessGroup::MixedProcessGroup(int rank, int size, std::string name, SupportTable support,
                                     absl::Duration timeout, Groups groups, DeviceType untyped)
    : ProcessGroup(rank, size, std::move(name), support, timeout),
      groups_(std::move(groups)),
      untyped_(untyped) {}

void MixedProcessGroup::abort() {
  // destroy_process_group's shutdown reaches the parts as theirs.
  const bool destroying = shutting_down();
  for (const auto& g : groups_) {
    if (!g) continue;
    if (destroying) {
      g->shutdown();
    } else {
      g->abort();
    }
  }
}

absl::Status MixedProcessGroup::split_for_new_group(const BackendOptions& group,
                                                    const std::string& part) {
  // Each part's keys are under "<group>/<device type>/", as the mixed
  // backend's create (backend_registry.cc) makes them.
  for (int d = 0; d < kNumDeviceTypes; ++d) {
    if (!groups_[d]) continue;
    absl::Status s = groups_[d]->split_for_new_group(
        group, absl::StrCat(part, std::string(DeviceTypeName(static_cast<DeviceType>(d))), "/"));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status MixedProcessGroup::shrink_for_new_group(const BackendOptions& group,
                                                     absl::Span<const int> excluded,
                                                     bool abort_first, const std::string& part) {
  for (int d = 0; d < kNumDeviceTypes; ++d) {
    if (!groups_[d]) continue;
    absl::Status s = groups_[d]->shrink_for_new_group(
        group, excluded, abort_first,
        absl::StrCat(part, std::string(DeviceTypeName(static_cast<DeviceType>(d))), "/"));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

ProcessGroup& MixedProcessGroup::For(const Tensor& tensor) const {
  return *groups_[static_cast<int>(tensor.device().type())];
}

absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoBroadcast(
    const Tensor& tensor, const BroadcastOptions& options) {
  return For(tensor).broadcast(tensor, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoAllReduce(
    const Tensor& tensor, const AllReduceOptions& options) {
  return For(tensor).allreduce(tensor, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoReduce(const Tensor& tensor,
                                                                  const ReduceOptions& options) {
  return For(tensor).reduce(tensor, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoAllGather(
    absl::Span<const Tensor> outputs, const Tensor& input, const AllGatherOptions& options) {
  return For(input).allgather(outputs, input, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoAllGatherIntoTensor(
    const Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  return For(input).allgather_into_tensor(output, input, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoGather(absl::Span<const Tensor> outputs,
                                                                  const Tensor& input,
                                                                  const GatherOptions& options) {
  return For(input).gather(outputs, input, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoScatter(const Tensor& output,
                                                                   absl::Span<const Tensor> inputs,
                                                                   const ScatterOptions& options) {
  return For(output).scatter(output, inputs, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoReduceScatter(
    const Tensor& output, absl::Span<const Tensor> inputs, const ReduceScatterOptions& options) {
  return For(output).reduce_scatter(output, inputs, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoAllToAll(
    absl::Span<const Tensor> outputs, absl::Span<const Tensor> inputs,
    const AllToAllOptions& options) {
  return For(inputs[0]).alltoall(outputs, inputs, options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoBarrier(const BarrierOptions& options) {
  return groups_[static_cast<int>(untyped_)]->barrier(options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoMonitoredBarrier(
    const MonitoredBarrierOptions& options) {
  return groups_[static_cast<int>(untyped_)]->monitored_barrier(options);
}
absl::StatusOr<std::shared_ptr<Work>> MixedProcessGroup::DoSend(const Tensor& tensor, int dst,
                                                                const P2POptions& options) {
  return For(tensor).send(tensor, dst, options);
}
absl::StatusOr<std::shared_ptr<RecvWork>> MixedProcessGroup::DoRecv(const Tensor& tensor, int src,
                                                                    const P2POptions& options) {
  return For(tensor).recv(tensor, src, options);
}

}  // namespace ember::distributed
