#include "parallel/optimizer_state.h"

#include "absl/strings/str_cat.h"
#include "distributed/checkpoint/metadata.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {

using distributed::checkpoint::CheckpointOptions;
using distributed::checkpoint::flat_shard;
using distributed::checkpoint::Item;
using distributed::checkpoint::Metadata;
using distributed::checkpoint::Placement;
using distributed::checkpoint::read_metadata;
using distributed::checkpoint::replicated;
using distributed::checkpoint::StateDict;

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

absl::Status CheckSegments(const Tensor& param, const ParamKey& pk) {
  for (const FlatSegment& seg : pk.segments) {
    if (param.dim() != 1 || seg.local_offset < 0 || seg.numel < 0 ||
        seg.local_offset + seg.numel > param.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state: segment \"", seg.key, "\" covers [", seg.local_offset, ", ",
          seg.local_offset + seg.numel, ") of a flat parameter of shape ",
          ShapeToString(param.sizes()), "; segments need a 1-D parameter and must lie inside it"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKeys(const std::vector<Tensor>& params, const std::vector<ParamKey>& keys) {
  if (params.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state: the optimizer has ", params.size(), " parameters but ", keys.size(),
        " ParamKeys were given; give one per parameter, in the optimizer's order"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EMBER_RETURN_IF_ERROR(CheckSegments(params[i], keys[i]));
  }
  return absl::OkStatus();
}

// The Items of state tensor `name` = `value` of parameter `param`, saved as
// `pk`: placed like the parameter when it has the parameter's shape, else
// replicated (under each segment's key).
void AddStateItems(const std::string& name, const Tensor& value, const Tensor& param,
                   const ParamKey& pk, StateDict* out) {
  const bool like_param = value.sizes() == param.sizes();
  if (pk.segments.empty()) {
    out->push_back({StateKey(pk.key, name),
                    like_param && pk.placement ? Item{value, pk.placement} : replicated(value)});
    return;
  }
  for (const FlatSegment& seg : pk.segments) {
    out->push_back({StateKey(seg.key, name),
                    like_param ? flat_shard(value.narrow(0, seg.local_offset, seg.numel),
                                            seg.global_shape, seg.flat_offset, seg.box_offsets,
                                            seg.box_sizes)
                               : replicated(value)});
  }
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
      AddStateItems(name, value, all[i], params[i], &out);
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
  for (size_t i = 0; i < all.size(); ++i) {
    const ParamKey& pk = params[i];
    // The state names saved for this parameter: those of its key, or of its
    // first segment's (a flat parameter's segments share its state names).
    const std::string prefix = StateKey(pk.segments.empty() ? pk.key : pk.segments[0].key, "");
    const SizeVector param_global = !pk.segments.empty() ? pk.segments[0].global_shape
                                    : pk.placement
                                        ? pk.placement->global_shape
                                        : SizeVector(all[i].sizes().begin(), all[i].sizes().end());
    nn::optim::OptimizerStateDict::ParamState ps;
    ps.index = static_cast<int64_t>(i);
    for (const auto& [key, tm] : md.tensors) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(prefix.size());
      if (tm.global_shape != param_global) {
        Tensor value = empty(tm.global_shape, tm.dtype);
        items.push_back({key, replicated(value)});
        ps.values.push_back({name, value});
        continue;
      }
      Tensor value = zeros(all[i].sizes(), tm.dtype);
      if (pk.segments.empty()) {
        items.push_back({key, Item{value, pk.placement}});
      } else {
        for (const FlatSegment& seg : pk.segments) {
          if (seg.numel == 0) continue;
          items.push_back(
              {StateKey(seg.key, name),
               flat_shard(value.narrow(0, seg.local_offset, seg.numel), seg.global_shape,
                          seg.flat_offset, seg.box_offsets, seg.box_sizes)});
        }
      }
      ps.values.push_back({name, value});
    }
    if (!ps.values.empty()) osd.state.push_back(std::move(ps));
  }
  const size_t state_items = items.size();
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
  EMBER_RETURN_IF_ERROR(distributed::checkpoint::load(items, options));
  // Hyperparameters: the items after the state's, in group order.
  size_t next = state_items;
  int64_t index = 0;
  for (auto& group : osd.param_groups) {
    for (auto& [option, value] : group.options) value = items[next++].second.tensor.item<double>();
    for (int64_t& p : group.params) p = index++;
  }
  return optimizer.load_state_dict(osd);
}

}  // namespace ember::parallel
