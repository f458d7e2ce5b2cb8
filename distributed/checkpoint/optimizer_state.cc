#include "distributed/checkpoint/optimizer_state.h"

#include "absl/strings/str_cat.h"
#include "distributed/checkpoint/metadata.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::checkpoint {
namespace {

std::string StateKey(const std::string& param, const std::string& name) {
  return absl::StrCat("optim.state.", param, ".", name);
}
std::string GroupKey(size_t group, const std::string& option) {
  return absl::StrCat("optim.param_groups.", group, ".", option);
}

// The optimizer's parameters in PyTorch's order.
std::vector<Tensor> AllParams(const nn::optim::Optimizer& optimizer) {
  std::vector<Tensor> out;
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    for (const Tensor& p : optimizer.params(g)) out.push_back(p);
  }
  return out;
}

absl::Status CheckKeys(const std::vector<Tensor>& params, const std::vector<ParamKey>& keys) {
  if (params.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state: the optimizer has ", params.size(), " parameters but ", keys.size(),
        " ParamKeys were given; give one per parameter, in the optimizer's order"));
  }
  return absl::OkStatus();
}

// The Item of a state tensor of parameter `param` saved as `key`.
Item StateItem(const Tensor& value, const Tensor& param, const ParamKey& key) {
  if (value.sizes() == param.sizes() && key.placement.has_value()) {
    return Item{value, key.placement};
  }
  return replicated(value);
}

}  // namespace

absl::StatusOr<StateDict> get_optimizer_state_dict(const nn::optim::Optimizer& optimizer,
                                                   const std::vector<ParamKey>& params) {
  const std::vector<Tensor> all = AllParams(optimizer);
  EMBER_RETURN_IF_ERROR(CheckKeys(all, params));
  const nn::optim::OptimizerStateDict osd = optimizer.state_dict();
  StateDict out;
  for (const auto& ps : osd.state) {
    const size_t i = static_cast<size_t>(ps.index);
    for (const auto& [name, value] : ps.values) {
      out.push_back({StateKey(params[i].key, name), StateItem(value, all[i], params[i])});
    }
  }
  for (size_t g = 0; g < osd.param_groups.size(); ++g) {
    for (const auto& [option, value] : osd.param_groups[g].options) {
      out.push_back({GroupKey(g, option), replicated(scalar_tensor(value, kFloat64))});
    }
  }
  return out;
}

absl::Status set_optimizer_state_dict(nn::optim::Optimizer& optimizer,
                                      const std::vector<ParamKey>& params,
                                      const CheckpointOptions& options) {
  const std::vector<Tensor> all = AllParams(optimizer);
  EMBER_RETURN_IF_ERROR(CheckKeys(all, params));
  EMBER_ASSIGN_OR_RETURN(Metadata md, read_metadata(options.path));
  nn::optim::OptimizerStateDict osd;
  StateDict items;
  // (state index, value index) of each item, to put the loaded tensors back.
  std::vector<std::pair<size_t, size_t>> where;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string prefix = StateKey(params[i].key, "");
    nn::optim::OptimizerStateDict::ParamState ps;
    ps.index = static_cast<int64_t>(i);
    for (const auto& [key, tm] : md.tensors) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(prefix.size());
      const SizeVector param_global =
          params[i].placement ? params[i].placement->global_shape
                              : SizeVector(all[i].sizes().begin(), all[i].sizes().end());
      Item item;
      if (tm.global_shape == param_global) {
        item = Item{empty(all[i].sizes(), tm.dtype), params[i].placement};
      } else {
        item = replicated(empty(tm.global_shape, tm.dtype));
      }
      where.emplace_back(osd.state.size(), ps.values.size());
      ps.values.push_back({name, item.tensor});
      items.push_back({key, std::move(item)});
    }
    if (!ps.values.empty()) osd.state.push_back(std::move(ps));
  }
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    nn::optim::OptimizerStateDict::Group group;
    const std::string prefix = GroupKey(g, "");
    for (const auto& [key, tm] : md.tensors) {
      if (key.rfind(prefix, 0) != 0) continue;
      group.options.push_back({key.substr(prefix.size()), 0.0});
      items.push_back({key, replicated(empty({}, kFloat64))});
    }
    if (group.options.empty()) {
      return absl::NotFoundError(absl::StrCat("distributed checkpoint ", options.path,
                                              " has no optimizer state for parameter group ", g,
                                              " (no key \"", prefix, "*\")"));
    }
    for (size_t i = 0; i < optimizer.params(g).size(); ++i) group.params.push_back(0);
    osd.param_groups.push_back(std::move(group));
  }
  EMBER_RETURN_IF_ERROR(load(items, options));
  // Hyperparameters: the items after the state's, in group order.
  size_t next = where.size();
  int64_t index = 0;
  for (auto& group : osd.param_groups) {
    for (auto& [option, value] : group.options) value = items[next++].second.tensor.item<double>();
    for (int64_t& p : group.params) p = index++;
  }
  return optimizer.load_state_dict(osd);
}

}  // namespace ember::distributed::checkpoint
