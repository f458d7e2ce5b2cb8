#include "parallel/data_parallel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "parallel/replicate.h"
#include "parallel/scatter_gather.h"
#include "parallel/warning.h"
#include "tensor/error.h"

namespace ember::parallel {
namespace {

// The device list of `requested`, or every accelerator device when unset.
std::vector<Device> ResolveDeviceIds(const std::optional<std::vector<Device>>& requested,
                                     const char* where) {
  if (!requested) {
    std::vector<Device> all;
    for (int i = 0; i < device_count(DeviceType::kCUDA); ++i)
      all.emplace_back(DeviceType::kCUDA, i);
    return all;
  }
  EMBER_CHECK(!requested->empty(), where,
              ": device_ids is empty; list one device per replica (kCPU repeated for CPU "
              "replicas) or leave it unset to use every accelerator");
  for (const Device& d : *requested) {
    EMBER_CHECK(d.type() == requested->front().type(), where, ": device_ids mixes ",
                requested->front(), " and ", d, "; all replicas must be on one device type");
  }
  return *requested;
}

void CheckModuleOn(const nn::Module& module, Device source) {
  auto check = [&](const Tensor& t) {
    EMBER_CHECK(t.device().type() == source.type() &&
                    (!source.has_index() || t.device().index() == source.index()),
                "module must have its parameters and buffers on device ", source,
                " (device_ids[0]) but found one of them on device: ", t.device());
  };
  for (const Tensor& t : module.parameters()) check(t);
  for (const Tensor& t : module.buffers()) check(t);
}

// The forward of DataParallel and data_parallel once the devices are known.
Value RunReplicas(const std::shared_ptr<nn::Module>& module, const Value::List& inputs,
                  const Value::Dict& kwargs, absl::Span<const Device> device_ids,
                  Device output_device, int64_t dim, const ReplicaForward& forward) {
  CheckModuleOn(*module, device_ids[0]);
  auto [shares, share_kwargs] = scatter_kwargs(inputs, kwargs, device_ids, dim);
  if (shares.empty()) {  // no arguments: one call on device_ids[0]
    shares.emplace_back();
    share_kwargs.emplace_back();
  }
  if (device_ids.size() == 1) return forward(*module, shares[0], share_kwargs[0]);
  absl::Span<const Device> used = device_ids.subspan(0, shares.size());
  std::vector<std::shared_ptr<nn::Module>> replicas =
      replicate(module, used, !autograd::GradMode::is_enabled());
  std::vector<Value> share_values(shares.begin(), shares.end());
  std::vector<Value> outputs = parallel_apply(replicas, share_values, share_kwargs, used, forward);
  return gather(outputs, output_device, dim);
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  EMBER_CHECK(module_ != nullptr, "DataParallel: the module is null");
  register_module("module", module_);
  device_ids_ = ResolveDeviceIds(options_.device_ids, "DataParallel");
  if (device_ids_.empty()) return;
  output_device_ = options_.output_device.value_or(device_ids_[0]);
  std::vector<DeviceProperties> properties;
  for (const Device& d : device_ids_) {
    if (std::optional<DeviceProperties> p = get_device_properties(d)) properties.push_back(*p);
  }
  if (properties.size() == device_ids_.size()) {
    if (std::optional<std::string> warning = check_balance(device_ids_, properties)) {
      internal::Warn(*warning);
    }
  }
  if (device_ids_.size() == 1) module_->to(device_ids_[0]);
}

Value DataParallel::forward(const Value::List& inputs, const Value::Dict& kwargs) {
  if (device_ids_.empty()) return options_.forward(*module_, inputs, kwargs);
  return RunReplicas(module_, inputs, kwargs, device_ids_, output_device_, options_.dim,
                     options_.forward);
}

Tensor DataParallel::forward(const Tensor& input) {
  Value out = forward(Value::List{Value(input)}, {});
  const Tensor* t = out.get_if<Tensor>();
  EMBER_CHECK(t != nullptr, "DataParallel: the module returned a ", out.kind(),
              ", not a tensor; call forward(inputs, kwargs) for other outputs");
  return *t;
}

Value data_parallel(const std::shared_ptr<nn::Module>& module, const Value& inputs,
                    std::optional<std::vector<Device>> device_ids,
                    std::optional<Device> output_device, int64_t dim,
                    const Value::Dict& module_kwargs, const ReplicaForward& forward) {
  EMBER_CHECK(module != nullptr, "data_parallel: the module is null");
  std::vector<Device> devices = ResolveDeviceIds(device_ids, "data_parallel");
  EMBER_CHECK(!devices.empty(),
              "data_parallel: no available devices were found; pass device_ids (kCPU repeated "
              "for CPU replicas)");
  Value::List args = inputs.is<Value::List>() ? inputs.list()
                     : inputs.is_none()       ? Value::List{}
                                              : Value::List{inputs};
  return RunReplicas(module, args, module_kwargs, devices, output_device.value_or(devices[0]), dim,
                     forward);
}

std::optional<std::string> check_balance(absl::Span<const Device> device_ids,
                                         absl::Span<const DeviceProperties> properties) {
  EMBER_CHECK(device_ids.size() == properties.size(), "check_balance: ", device_ids.size(),
              " devices but ", properties.size(), " property records");
  auto imbalance = [&](auto get) -> std::optional<std::string> {
    if (properties.empty()) return std::nullopt;
    size_t min_pos = 0, max_pos = 0;
    for (size_t i = 1; i < properties.size(); ++i) {
      if (get(properties[i]) < get(properties[min_pos])) min_pos = i;
      if (get(properties[i]) > get(properties[max_pos])) max_pos = i;
    }
    if (static_cast<double>(get(properties[min_pos])) >=
        0.75 * static_cast<double>(get(properties[max_pos]))) {
      return std::nullopt;
    }
    auto id = [](const Device& d) { return d.has_index() ? absl::StrCat(d.index()) : d.str(); };
    return absl::StrCat(
        "There is an imbalance between your GPUs. You may want to exclude GPU ",
        id(device_ids[min_pos]), " which has less than 75% of the memory or cores of GPU ",
        id(device_ids[max_pos]),
        ". You can do so by setting the device_ids argument to DataParallel, or by setting the "
        "CUDA_VISIBLE_DEVICES environment variable.");
  };
  if (auto w = imbalance([](const DeviceProperties& p) { return p.total_memory; })) return w;
  return imbalance([](const DeviceProperties& p) { return p.multi_processor_count; });
}

}  // namespace ember::parallel
