#include "parallel/state_dict.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dcp = ::ember::distributed::checkpoint;

// The optimizer's parameters in its order (group by group).
std::vector<Tensor> OptimizerParams(const nn::optim::Optimizer& optimizer) {
  std::vector<Tensor> out;
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    const std::vector<Tensor>& ps = optimizer.params(g);
    out.insert(out.end(), ps.begin(), ps.end());
  }
  return out;
}

// For each of the optimizer's parameters, the key of the same tensor among
// `candidates` (by identity).
absl::StatusOr<std::vector<ParamKey>> OptimizerKeys(
    const nn::optim::Optimizer& optimizer,
    const std::vector<std::pair<Tensor, ParamKey>>& candidates) {
  std::vector<ParamKey> keys;
  const std::vector<Tensor> params = OptimizerParams(optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = std::find_if(candidates.begin(), candidates.end(),
                           [&](const auto& c) { return c.first.is_same(params[i]); });
    if (it == candidates.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("get_state_dict: the optimizer's parameter ", i,
                       " is not a parameter of the model (build the optimizer from the model's "
                       "parameters(); for FullyShardedDataParallel, from the wrapper's)"));
    }
    keys.push_back(it->second);
  }
  return keys;
}

// Re-places `segment` (a flat range of a whole original parameter) inside
// its tensor-parallel box when `shards` lists the parameter.
absl::Status PlaceInShard(const ParameterShards& shards, FlatSegment* segment) {
  auto it = shards.find(segment->key);
  if (it == shards.end()) return absl::OkStatus();
  const LocalShard& shard = it->second;
  if (shard.sizes != segment->global_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "get_state_dict: parameter '", segment->key, "' has shape ",
        ShapeToString(segment->global_shape), " but its shard is ", ShapeToString(shard.sizes),
        " of ", ShapeToString(shard.global_shape),
        "; pass the parameter_shards of the plan that made the wrapped module"));
  }
  segment->global_shape = shard.global_shape;
  segment->box_offsets = shard.offsets;
  segment->box_sizes = shard.sizes;
  return absl::OkStatus();
}

void AddBuffers(const nn::Module& module, dcp::StateDict& items) {
  for (const auto& [name, buffer] : module.named_buffers()) {
    if (buffer.defined()) items.emplace_back(name, dcp::replicated(buffer.detach()));
  }
}

}  // namespace

absl::StatusOr<ModelStateDict> get_state_dict(FullyShardedDataParallel& model,
                                              const nn::optim::Optimizer* optimizer,
                                              const ParameterShards& shards) {
  ModelStateDict out;
  const std::vector<Tensor> flats = model.parameters();
  const std::vector<FlatParamInfo>& infos = model.flat_param_infos();
  std::vector<std::pair<Tensor, ParamKey>> candidates;
  for (size_t u = 0; u < infos.size() && u < flats.size(); ++u) {
    const FlatParamInfo& info = infos[u];
    const Tensor flat = flats[u].detach();
    ParamKey key;
    key.key = info.module_name.empty() ? "<root unit>" : info.module_name;
    for (size_t i = 0; i < info.names.size(); ++i) {
      int64_t numel = 1;
      for (int64_t d : info.shapes[i]) numel *= d;
      // The overlap of original parameter i, elements [offsets[i], +numel)
      // of the unit's flat vector, with this rank's shard.
      const int64_t begin = std::max(info.offsets[i], info.shard_offset);
      const int64_t end = std::min(info.offsets[i] + numel, info.shard_offset + info.shard_numel);
      const int64_t count = std::max<int64_t>(0, end - begin);
      const int64_t local = count > 0 ? begin - info.shard_offset : 0;
      const int64_t within = count > 0 ? begin - info.offsets[i] : 0;
      // A tensor-parallel parameter: the range indexes its box of the whole.
      FlatSegment segment{.key = info.names[i],
                          .global_shape = SizeVector(info.shapes[i].begin(), info.shapes[i].end()),
                          .flat_offset = within,
                          .local_offset = local,
                          .numel = count};
      EMBER_RETURN_IF_ERROR(PlaceInShard(shards, &segment));
      out.model.emplace_back(
          info.names[i], dcp::flat_shard(flat.narrow(0, local, count), segment.global_shape, within,
                                         segment.box_offsets, segment.box_sizes));
      key.segments.push_back(std::move(segment));
    }
    candidates.emplace_back(flats[u], std::move(key));
  }
  AddBuffers(*model.module(), out.model);
  if (optimizer != nullptr) {
    EMBER_ASSIGN_OR_RETURN(out.optimizer, OptimizerKeys(*optimizer, candidates));
  }
  return out;
}

absl::StatusOr<ModelStateDict> get_state_dict(DistributedDataParallel& model,
                                              const nn::optim::Optimizer* optimizer) {
  return get_state_dict(*model.module(), optimizer);
}

absl::StatusOr<ModelStateDict> get_state_dict(nn::Module& model,
                                              const nn::optim::Optimizer* optimizer,
                                              const ParameterShards& shards) {
  ModelStateDict out;
  std::vector<std::pair<Tensor, ParamKey>> candidates;
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = shards.find(name);
    if (it == shards.end()) {
      out.model.emplace_back(name, dcp::replicated(p.detach()));
      candidates.emplace_back(p, ParamKey{.key = name});
      continue;
    }
    const LocalShard& shard = it->second;
    if (!std::equal(shard.sizes.begin(), shard.sizes.end(), p.sizes().begin(), p.sizes().end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "get_state_dict: parameter '", name, "' has shape ", ShapeToString(p.sizes()),
          " but its shard is ", ShapeToString(shard.sizes), " of ",
          ShapeToString(shard.global_shape), "; pass the parameter_shards of the plan that made "
          "this module"));
    }
    dcp::Item item = dcp::shard(p.detach(), shard.global_shape, shard.offsets);
    ParamKey key{.key = name};
    key.placement = item.placement;
    out.model.emplace_back(name, std::move(item));
    candidates.emplace_back(p, std::move(key));
  }
  AddBuffers(model, out.model);
  if (optimizer != nullptr) {
    EMBER_ASSIGN_OR_RETURN(out.optimizer, OptimizerKeys(*optimizer, candidates));
  }
  return out;
}

absl::Status save_state_dict(const ModelStateDict& state, const nn::optim::Optimizer* optimizer,
                             const dcp::CheckpointOptions& options) {
  dcp::StateDict items = state.model;
  if (optimizer != nullptr) {
    EMBER_ASSIGN_OR_RETURN(dcp::StateDict optim,
                           get_optimizer_state_dict(*optimizer, state.optimizer));
    items.insert(items.end(), optim.begin(), optim.end());
  }
  return dcp::save(items, options);
}

absl::Status load_state_dict(const ModelStateDict& state, nn::optim::Optimizer* optimizer,
                             const dcp::CheckpointOptions& options) {
  EMBER_RETURN_IF_ERROR(dcp::load(state.model, options));
  if (optimizer != nullptr) {
    EMBER_RETURN_IF_ERROR(set_optimizer_state_dict(*optimizer, state.optimizer, options));
  }
  return absl::OkStatus();
}

}  // namespace ember::parallel
