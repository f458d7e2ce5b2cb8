#include "parallel/fully_sharded_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "distributed/distributed.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"
#include "tensor/storage.h"
#include "tensor/stream.h"

namespace ember::parallel {

const char* sharding_strategy_name(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard:
      return "NO_SHARD";
    case ShardingStrategy::kHybridShard:
      return "HYBRID_SHARD";
    case ShardingStrategy::kHybridShardZero2:
      return "_HYBRID_SHARD_ZERO2";
  }
  return "?";
}

bool is_hybrid_strategy(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kHybridShard ||
         strategy == ShardingStrategy::kHybridShardZero2;
}

// One unit's state (Note [Flat parameters], Note [FSDP iteration]).
struct FullyShardedDataParallel::Unit {
  enum class State { kSharded, kGathering, kUnsharded };

  size_t index = 0;
  std::string name;                     // path in the model; "" for the root
  std::shared_ptr<nn::Module> module;   // the unit's module (the root: the model)
  std::vector<std::string> param_names;
  std::vector<Tensor> params;           // the module's parameter tensors
  std::vector<int64_t> offsets;         // into the flat vector
  int64_t numel = 0;
  int64_t shard_numel = 0;
  int64_t padded_numel = 0;
  Tensor flat;  // this rank's shard (NO_SHARD: the whole vector); a registered parameter

  State state = State::kSharded;
  Tensor gathered;      // the compute-dtype buffer the parameters point into
  Tensor gather_input;  // kept until the all_gather completes
  std::shared_ptr<distributed::Work> gather_work;

  std::vector<std::shared_ptr<autograd::Node>> accumulators;
  std::vector<bool> ready;
  size_t pending = 0;
  bool reduced = false;  // this iteration's reduction was issued
  Tensor reduce_input, reduce_output;
  std::shared_ptr<distributed::Work> reduce_work;
  // Hybrid strategies: the all_reduce of reduce_output over the replicate group.
  std::shared_ptr<distributed::Work> replicate_work;

  bool empty() const { return params.empty(); }
};

namespace {

// Points the storage of `param` at `count` bytes of `buffer`'s memory from
// byte `offset`; the parameter keeps `buffer`'s storage alive.
void PointInto(const Tensor& param, const Tensor& buffer, int64_t element_offset) {
  Storage storage = param.storage();
  auto* holder = new Storage(buffer.storage());
  char* data = static_cast<char*>(buffer.raw_data()) +
               element_offset * static_cast<int64_t>(buffer.element_size());
  storage.set_data_ptr(
      DataPtr(data, holder, [](void* context) { delete static_cast<Storage*>(context); },
              buffer.device()),
      nullptr);
}

// Frees what `param`'s storage points at (Note [Flat parameters]). The
// empty allocation keeps the storage's device: a tensor's device is its
// storage's, and the parameter's AccumulateGrad recorded that device when
// it was made (in Build, while the unit is sharded), so a freed parameter on
// cuda:N must still say cuda:N (torch frees by resizing the storage to zero
// bytes, which keeps the device too).
void PointAtNothing(const Tensor& param) {
  Storage storage = param.storage();
  const Device device = storage.device();
  storage.set_data_ptr(DataPtr(nullptr, nullptr, nullptr, device), nullptr);
}

// Counts a new value of the unit's parameters in their version counters
// (Note [Flat parameters]): what a forward reads may differ from what the
// previous forward read (the optimizer stepped the flat shard, or the
// parameters point at a new gathered buffer) without any in-place op on the
// parameters themselves, and kernels that keep something derived from a
// parameter (oneDNN's blocked weights) trust its version. Done where a
// unit's forward starts, before autograd saves the parameters, never in
// backward, whose re-gathered values are the forward's.
void MarkNewValues(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) p.impl()->BumpVersion();
}

bool IsFloating(Dtype d) {
  return d == kFloat32 || d == kFloat64 || d == kFloat16 || d == kBFloat16;
}

// torch's gradient pre-divide factor for `world` data-parallel ranks: the
// smallest power of two f with world % f != 0 or world / f <= f (4 ranks: 2;
// 6 ranks: 4); the post-divide factor is world / f.
double PredivideFactor(int world) {
  int factor = 1;
  while (world % factor == 0 && world / factor > factor) factor *= 2;
  return factor;
}

constexpr const char* kWho = "FullyShardedDataParallel: ";

// The size of a shard group made from the default group (Note [Hybrid
// sharding]): shard_group_size, device_mesh_shape[1] or LOCAL_WORLD_SIZE.
absl::StatusOr<int> ShardGroupSize(const FullyShardOptions& options, int world) {
  int size = 0;
  std::string from;
  if (!options.device_mesh_shape.empty()) {
    const std::vector<int>& mesh = options.device_mesh_shape;
    if (mesh.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "device_mesh_shape must be 2-D {replicas, shards} for ",
          sharding_strategy_name(options.sharding_strategy), ", got ", mesh.size(),
          " dimensions [", absl::StrJoin(mesh, ", "), "]"));
    }
    if (mesh[0] <= 0 || mesh[1] <= 0 || mesh[0] * mesh[1] != world) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "device_mesh_shape [", mesh[0], ", ", mesh[1], "] holds ", mesh[0] * mesh[1],
          " ranks but the world size is ", world,
          "; give {replicas, shards} with replicas * shards == world size"));
    }
    size = mesh[1];
    from = "device_mesh_shape[1]";
  }
  if (options.shard_group_size != 0) {
    if (size != 0 && options.shard_group_size != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "shard_group_size ", options.shard_group_size,
          " disagrees with device_mesh_shape [", options.device_mesh_shape[0], ", ",
          options.device_mesh_shape[1], "]; give one of them"));
    }
    size = options.shard_group_size;
    from = "shard_group_size";
  }
  if (size == 0) {
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    if (local == nullptr || *local == '\0') {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, sharding_strategy_name(options.sharding_strategy),
          " needs its two groups: pass options.hybrid_process_groups, shard_group_size or "
          "device_mesh_shape, or run under the launcher (which sets LOCAL_WORLD_SIZE)"));
    }
    char* end = nullptr;
    const long parsed = std::strtol(local, &end, 10);
    if (*end != '\0' || parsed <= 0 || parsed > world) {
      return absl::InvalidArgumentError(absl::StrCat(kWho, "LOCAL_WORLD_SIZE='", local,
                                                     "' is not a rank count in 1..", world));
    }
    size = static_cast<int>(parsed);
    from = "LOCAL_WORLD_SIZE";
  }
  if (size <= 0 || world % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "the world size ", world, " is not divisible by the shard group size ", size,
        " (", from, "); ", sharding_strategy_name(options.sharding_strategy),
        " needs world size = shard group size x replicas"));
  }
  return size;
}

// Checks the 2-D layout of `shard` x `replicate` (collective over both
// groups): every member of a replicate group holds the same position in its
// shard group, every member of a shard group the same position in its
// replicate group, and together they cover the world.
absl::Status CheckHybridLayout(distributed::ProcessGroup& shard,
                               distributed::ProcessGroup& replicate, Device device) {
  if (shard.rank() < 0 || replicate.rank() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "this process is not a member of its ", shard.rank() < 0 ? "shard" : "replicate",
        " group (rank -1 in it); pass the groups that contain this rank"));
  }
  if (distributed::is_initialized()) {
    const int world = distributed::get_world_size();
    if (shard.size() * replicate.size() != world) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "the shard group (", shard.size(), " ranks) times the replicate group (",
          replicate.size(), " ranks) is ", shard.size() * replicate.size(),
          " ranks, but the world size is ", world,
          "; the groups must cover the world once (world size = shards x replicas)"));
    }
  }
  auto positions = [&](distributed::ProcessGroup& over, int mine,
                       std::vector<int64_t>& out) -> absl::Status {
    Tensor all = empty({over.size()}, TensorOptions().dtype(kInt64).device(device));
    Tensor me = full({1}, mine, TensorOptions().dtype(kInt64).device(device));
    EMBER_RETURN_IF_ERROR(WaitFor(over.allgather_into_tensor(all, me)));
    Tensor host = all.cpu();
    out.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + over.size());
    return absl::OkStatus();
  };
  std::vector<int64_t> shard_ranks, replicate_ranks;
  EMBER_RETURN_IF_ERROR(positions(replicate, shard.rank(), shard_ranks));
  EMBER_RETURN_IF_ERROR(positions(shard, replicate.rank(), replicate_ranks));
  const bool shard_ok = std::all_of(shard_ranks.begin(), shard_ranks.end(),
                                    [&](int64_t r) { return r == shard_ranks.front(); });
  const bool replicate_ok = std::all_of(replicate_ranks.begin(), replicate_ranks.end(),
                                        [&](int64_t r) { return r == replicate_ranks.front(); });
  if (!shard_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "the members of this rank's replicate group hold shard group ranks [",
        absl::StrJoin(shard_ranks, ", "),
        "]; every member of a replicate group must hold the same shard (the same rank in "
        "its shard group), as in a 2-D layout"));
  }
  if (!replicate_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "the members of this rank's shard group hold replicate group ranks [",
        absl::StrJoin(replicate_ranks, ", "),
        "]; every member of a shard group must hold the same rank in its replicate group, as "
        "in a 2-D layout"));
  }
  return absl::OkStatus();
}

// This rank's (shard, replicate) groups for a hybrid strategy: the given
// ones, or new groups over the default group (Note [Hybrid sharding]).
absl::StatusOr<HybridShardGroups> MakeHybridGroups(const FullyShardOptions& options) {
  const HybridShardGroups& given = options.hybrid_process_groups;
  if (options.process_group != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, sharding_strategy_name(options.sharding_strategy),
        " shards within one group and replicates across another: pass both as "
        "options.hybrid_process_groups {shard, replicate} (torch's process_group=(intra_node, "
        "inter_node)), not options.process_group"));
  }
  if ((given.shard == nullptr) != (given.replicate == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "hybrid_process_groups has a ", given.shard == nullptr ? "replicate" : "shard",
        " group but no ", given.shard == nullptr ? "shard" : "replicate",
        " group; pass both, or neither to make them from the default group"));
  }
  if (given.shard != nullptr) {
    if (!options.device_mesh_shape.empty() || options.shard_group_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "pass either hybrid_process_groups or a layout (shard_group_size, "
                "device_mesh_shape), not both"));
    }
    return given;
  }
  absl::StatusOr<distributed::Group> world_group = distributed::get_default_group();
  if (!world_group.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kWho, "making the ", sharding_strategy_name(options.sharding_strategy),
        " groups needs the default group (new_group); call init_process_group first or pass "
        "options.hybrid_process_groups (",
        world_group.status().message(), ")"));
  }
  const int world = (*world_group)->size();
  const int rank = (*world_group)->rank();
  EMBER_ASSIGN_OR_RETURN(const int shards, ShardGroupSize(options, world));
  const int replicas = world / shards;
  HybridShardGroups made;
  // Collective: every rank makes every group, in this order.
  for (int block = 0; block < replicas; ++block) {
    std::vector<int> ranks;
    for (int i = 0; i < shards; ++i) ranks.push_back(block * shards + i);
    EMBER_ASSIGN_OR_RETURN(distributed::Group group, distributed::new_group(ranks));
    if (rank / shards == block) made.shard = group;
  }
  for (int position = 0; position < shards; ++position) {
    std::vector<int> ranks;
    for (int block = 0; block < replicas; ++block) ranks.push_back(block * shards + position);
    EMBER_ASSIGN_OR_RETURN(distributed::Group group, distributed::new_group(ranks));
    if (rank % shards == position) made.replicate = group;
  }
  return made;
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<nn::Module> module, std::shared_ptr<distributed::ProcessGroup> group,
    std::shared_ptr<distributed::ProcessGroup> replicate, FullyShardOptions options)
    : module_(std::move(module)),
      group_(std::move(group)),
      replicate_(std::move(replicate)),
      options_(std::move(options)) {}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (nn::HookHandle& handle : hook_handles_) handle.remove();
  // Collectives still in flight write into buffers this object owns.
  for (auto& unit : units_) {
    if (unit->gather_work != nullptr) (void)unit->gather_work->wait();
    if (unit->reduce_work != nullptr) (void)unit->reduce_work->wait();
    if (unit->replicate_work != nullptr) (void)unit->replicate_work->wait();
  }
}

absl::StatusOr<std::shared_ptr<FullyShardedDataParallel>> FullyShardedDataParallel::create(
    std::shared_ptr<nn::Module> module, FullyShardOptions options) {
  if (module == nullptr) return absl::InvalidArgumentError(absl::StrCat(kWho, "the module is null"));
  if (options.min_num_params < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "min_num_params must be >= 0 (0: no size-based wrapping), got ",
        options.min_num_params));
  }
  for (const std::optional<Dtype>& d :
       {options.mixed_precision.param_dtype, options.mixed_precision.reduce_dtype}) {
    if (d.has_value() && !IsFloating(*d)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWho, "a mixed-precision dtype must be floating (float32, float64, "
                             "float16, bfloat16), got ",
                       std::string(dtype_name(*d))));
    }
  }
  const bool hybrid = is_hybrid_strategy(options.sharding_strategy);
  if (!hybrid && (options.hybrid_process_groups.shard != nullptr ||
                  options.hybrid_process_groups.replicate != nullptr ||
                  options.shard_group_size != 0 || !options.device_mesh_shape.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "hybrid_process_groups, shard_group_size and device_mesh_shape are for "
              "HYBRID_SHARD and _HYBRID_SHARD_ZERO2, but the strategy is ",
        sharding_strategy_name(options.sharding_strategy)));
  }
  if (options.shard_group_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, "shard_group_size must be > 0 (0: from device_mesh_shape or LOCAL_WORLD_SIZE), got ",
        options.shard_group_size));
  }
  std::shared_ptr<distributed::ProcessGroup> group = options.process_group;
  std::shared_ptr<distributed::ProcessGroup> replicate;
  if (hybrid) {
    EMBER_ASSIGN_OR_RETURN(HybridShardGroups groups, MakeHybridGroups(options));
    group = std::move(groups.shard);
    replicate = std::move(groups.replicate);
  } else if (group == nullptr) {
    absl::StatusOr<distributed::Group> found = distributed::get_default_group();
    if (!found.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          kWho,
          "no process group was given and there is no default group; call "
          "init_process_group first or pass options.process_group (",
          found.status().message(), ")"));
    }
    group = *std::move(found);
  }

  // The units: the root, then the given and size-wrapped modules in the
  // model's traversal order.
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> all = module->named_modules();
  std::unordered_map<const nn::Module*, std::string> path;
  for (const auto& [name, m] : all) path.emplace(m.get(), name);
  std::unordered_set<const nn::Module*> chosen;
  for (const std::shared_ptr<nn::Module>& unit : options.units) {
    if (unit == nullptr) return absl::InvalidArgumentError(absl::StrCat(kWho, "a unit is null"));
    if (!path.contains(unit.get())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "unit ", unit->name(), " is not a submodule of the wrapped ", module->name(),
          "; pass modules reachable from it (its named_modules())"));
    }
    if (unit.get() != module.get()) chosen.insert(unit.get());
  }
  if (options.min_num_params > 0) {
    // Children first: a module becomes a unit when the parameters of its
    // subtree not already in a smaller unit reach the threshold.
    std::unordered_set<const TensorImpl*> taken;
    std::function<void(nn::Module&)> visit = [&](nn::Module& m) {
      for (const auto& child : m.children()) visit(*child);
      if (&m == module.get()) return;
      int64_t count = 0;
      std::vector<const TensorImpl*> mine;
      for (const Tensor& p : m.parameters()) {
        if (taken.contains(p.impl())) continue;
        count += p.numel();
        mine.push_back(p.impl());
      }
      if (chosen.contains(&m) || (count > 0 && count >= options.min_num_params)) {
        chosen.insert(&m);
        taken.insert(mine.begin(), mine.end());
      }
    };
    visit(*module);
  }
  std::vector<std::shared_ptr<nn::Module>> unit_modules = {module};
  std::vector<std::string> unit_names = {""};
  for (const auto& [name, m] : all) {
    if (chosen.contains(m.get())) {
      unit_modules.push_back(m);
      unit_names.push_back(name);
      chosen.erase(m.get());  // a module reachable twice is one unit
    }
  }

  const auto params = module->named_parameters();
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "parameter '", name,
          "' does not require grad; every parameter of a sharded module must (its flat "
          "parameter is trained as one tensor), so freeze none or keep frozen layers outside"));
    }
    if (!IsFloating(p.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(kWho, "parameter '", name, "' is ",
                                                     std::string(dtype_name(p.dtype())),
                                                     "; only floating parameters can be sharded"));
    }
    if (!p.is_contiguous() || p.storage_offset() != 0 ||
        p.storage().nbytes() != static_cast<size_t>(p.nbytes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "parameter '", name,
          "' does not own its whole storage (it is a view of a larger tensor, or not "
          "contiguous); register a parameter of its own (e.g. a clone) before sharding"));
    }
  }
  if (params.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWho, module->name(), " has no parameters to shard"));
  }
  const Device device = params.front().second.device();
  for (const auto& [name, p] : params) {
    if (p.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, "parameter '", name, "' is on ", p.device().str(), " but '",
          params.front().first, "' is on ", device.str(),
          "; a sharded module lives on one device (move it with module->to(device) first)"));
    }
  }

  if (hybrid) EMBER_RETURN_IF_ERROR(CheckHybridLayout(*group, *replicate, device));

  if (options.sync_module_states) {
    std::vector<Tensor> state;
    for (const auto& [name, p] : params) state.push_back(p);
    for (const Tensor& b : module->buffers()) state.push_back(b);
    // Hybrid: across the replicate group first, so that each shard group's
    // rank 0 holds the world's rank 0 values before its own broadcast (torch's order).
    absl::Status synced = hybrid ? BroadcastFromRank0(*replicate, state) : absl::OkStatus();
    if (synced.ok()) synced = BroadcastFromRank0(*group, state);
    if (!synced.ok()) {
      return absl::Status(synced.code(), absl::StrCat(kWho, "broadcasting rank 0's parameters "
                                                            "and buffers failed: ",
                                                      synced.message()));
    }
  }
  std::shared_ptr<FullyShardedDataParallel> fsdp(
      new FullyShardedDataParallel(std::move(module), group, replicate, std::move(options)));
  EMBER_RETURN_IF_ERROR(fsdp->Build(unit_modules, unit_names));
  return fsdp;
}

absl::Status FullyShardedDataParallel::Build(
    const std::vector<std::shared_ptr<nn::Module>>& unit_modules,
    const std::vector<std::string>& unit_names) {
  const int world = group_->size();
  const int rank = group_->rank();
  const bool sharded = options_.sharding_strategy != ShardingStrategy::kNoShard;
  device_ = module_->parameters().front().device();  // create() checked: one device
  // Note [CPU offload]: on the CPU the shards are where offloading would put them.
  offload_ = options_.cpu_offload.offload_params && !device_.is_cpu();
  if (replicate_ != nullptr) {
    const int data_parallel = world * replicate_->size();
    predivide_ = PredivideFactor(data_parallel);
    postdivide_ = data_parallel / predivide_;
  }
  for (size_t u = 0; u < unit_modules.size(); ++u) {
    auto unit = std::make_unique<Unit>();
    unit->index = u;
    unit->name = unit_names[u];
    unit->module = unit_modules[u];
    units_.push_back(std::move(unit));
  }
  // Each parameter goes to the innermost unit whose path prefixes its name.
  auto owner = [&](const std::string& name) {
    size_t best = 0;
    size_t best_length = 0;
    for (size_t u = 1; u < units_.size(); ++u) {
      const std::string& prefix = units_[u]->name;
      if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
          name[prefix.size()] == '.' && prefix.size() + 1 > best_length) {
        best = u;
        best_length = prefix.size() + 1;
      }
    }
    return best;
  };
  std::vector<std::vector<Tensor>> values(units_.size());
  for (const auto& [name, p] : module_->named_parameters()) {
    Unit& unit = *units_[owner(name)];
    if (!values[unit.index].empty() && values[unit.index].front().dtype() != p.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShardedDataParallel: parameter '", name, "' is ", std::string(dtype_name(p.dtype())),
          " but its unit '", unit.name, "' holds ", std::string(dtype_name(values[unit.index].front().dtype())),
          " parameters; a unit's flat parameter has one dtype"));
    }
    unit.param_names.push_back(name);
    unit.offsets.push_back(unit.numel);
    unit.numel += p.numel();
    values[unit.index].push_back(p);
  }
  // The flat parameters: this rank's shards, fp32 (or the parameters' dtype).
  for (auto& unit_ptr : units_) {
    Unit& unit = *unit_ptr;
    if (values[unit.index].empty()) continue;
    unit.shard_numel = sharded ? (unit.numel + world - 1) / world : unit.numel;
    unit.padded_numel = sharded ? unit.shard_numel * world : unit.numel;
    const Dtype dtype = values[unit.index].front().dtype();
    Tensor full = zeros({unit.padded_numel}, TensorOptions().dtype(dtype).device(device_));
    for (size_t i = 0; i < values[unit.index].size(); ++i) {
      const Tensor& p = values[unit.index][i];
      full.narrow(0, unit.offsets[i], p.numel()).copy_(p.detach().reshape({-1}));
    }
    Tensor flat = sharded ? full.narrow(0, rank * unit.shard_numel, unit.shard_numel).clone()
                          : full;
    if (offload_) flat = flat.cpu().pin_memory();  // Note [CPU offload]
    unit.flat = register_parameter(absl::StrCat("flat_param_", unit.index), flat);
    FlatParamInfo info;
    info.module_name = unit.name;
    info.names = unit.param_names;
    for (const Tensor& p : values[unit.index]) {
      info.shapes.emplace_back(p.sizes().begin(), p.sizes().end());
    }
    info.offsets = unit.offsets;
    info.numel = unit.numel;
    info.padded_numel = unit.padded_numel;
    info.shard_numel = unit.shard_numel;
    info.shard_offset = sharded ? rank * unit.shard_numel : 0;
    infos_.push_back(std::move(info));
  }
  values.clear();
  // Mixed precision: the module computes in param_dtype from now on.
  const Dtype compute = ComputeDtype();
  bool converted = false;
  for (const auto& [name, p] : module_->named_parameters()) converted |= p.dtype() != compute;
  if (converted) module_->to(compute);
  std::unordered_map<std::string, Tensor> by_name;
  for (auto& [name, p] : module_->named_parameters()) by_name.emplace(name, p);
  std::weak_ptr<FullyShardedDataParallel> weak =
      std::static_pointer_cast<FullyShardedDataParallel>(shared_from_this());
  for (auto& unit_ptr : units_) {
    Unit& unit = *unit_ptr;
    if (unit.empty() && unit.param_names.empty()) continue;
    for (const std::string& name : unit.param_names) unit.params.push_back(by_name.at(name));
    if (sharded || converted || offload_) {
      for (const Tensor& p : unit.params) PointAtNothing(p);
      unit.state = Unit::State::kSharded;
    } else {
      // NO_SHARD in the parameters' dtype: the flat parameter is the storage.
      for (size_t i = 0; i < unit.params.size(); ++i) {
        PointInto(unit.params[i], unit.flat, unit.offsets[i]);
      }
      unit.gathered = unit.flat.detach();
      unit.state = Unit::State::kUnsharded;
    }
    const size_t u = unit.index;
    unit.accumulators = RegisterGradReadyHooks(unit.params, [weak, u](size_t i) {
      if (auto self = weak.lock()) self->OnGradReady(u, i);
    });
    unit.ready.assign(unit.params.size(), false);
  }
  for (size_t u = 1; u < units_.size(); ++u) {
    nn::Module& m = *units_[u]->module;
    hook_handles_.push_back(m.register_forward_pre_hook(
        [weak, u](nn::Module&, const Tensor&) -> std::optional<Tensor> {
          if (auto self = weak.lock()) self->OnUnitForwardStart(u);
          return std::nullopt;
        }));
    hook_handles_.push_back(m.register_forward_hook(
        [weak, u](nn::Module&, const Tensor&, const Tensor& output) -> std::optional<Tensor> {
          if (auto self = weak.lock()) self->OnUnitForwardEnd(u, output);
          return std::nullopt;
        }));
  }
  return absl::OkStatus();
}

Dtype FullyShardedDataParallel::ComputeDtype() const {
  if (options_.mixed_precision.param_dtype.has_value()) {
    return *options_.mixed_precision.param_dtype;
  }
  for (const auto& unit : units_) {
    if (unit->flat.defined()) return unit->flat.dtype();
  }
  return kFloat32;
}

Dtype FullyShardedDataParallel::ReduceDtype() const {
  if (options_.mixed_precision.reduce_dtype.has_value()) {
    return *options_.mixed_precision.reduce_dtype;
  }
  return ComputeDtype();
}

void FullyShardedDataParallel::CheckUsable() const {
  if (failure_.ok()) return;
  EMBER_FAIL(
      "FullyShardedDataParallel cannot run another iteration: an earlier collective failed (",
      failure_.ToString(),
      "), so the ranks no longer agree on their collectives; destroy the process group and "
      "restart the job");
}

void FullyShardedDataParallel::Fail(const std::string& what, const absl::Status& status) {
  failure_ = absl::Status(status.code(), absl::StrCat("FullyShardedDataParallel: ", what,
                                                      " failed on rank ", group_->rank(), ": ",
                                                      status.message()));
  in_iteration_ = false;
  end_of_backward_.Done();
  EMBER_FAIL(failure_.message(), " [", absl::StatusCodeToString(failure_.code()), "]");
}

bool FullyShardedDataParallel::ReshardsAfterForward() const {
  return options_.sharding_strategy == ShardingStrategy::kFullShard ||
         options_.sharding_strategy == ShardingStrategy::kHybridShard;
}

bool FullyShardedDataParallel::FreesUnsharded() const {
  return options_.sharding_strategy != ShardingStrategy::kNoShard ||
         options_.mixed_precision.param_dtype.has_value() || offload_;
}

// Note [CPU offload]: the pinned host shard is copied on a side stream of the
// compute device; the current stream (where the all_gather and the compute
// are queued) waits for the copy, and the copy's memory is kept from reuse
// until the current stream's work so far is done.
Tensor FullyShardedDataParallel::ToComputeDevice(const Tensor& host) const {
  absl::StatusOr<Stream> side = get_stream_from_pool(device_);
  if (!side.ok() || side->device() != device_) return host.to(device_);
  const Stream main = current_stream(device_);
  if (*side == main) return host.to(device_, /*non_blocking=*/true);
  Tensor out;
  {
    StreamGuard guard(*side);
    out = host.to(device_, /*non_blocking=*/true);
  }
  Event copied(device_.type());
  absl::Status status = copied.record(*side);
  if (status.ok()) status = copied.block(main);
  EMBER_CHECK(status.ok(), "FullyShardedDataParallel: ordering the copy of an offloaded shard to ",
              device_.str(), " before the current stream failed: ", status.ToString());
  out.record_stream(main);
  return out;
}

void FullyShardedDataParallel::Unshard(Unit& unit) {
  if (unit.empty() || unit.state != Unit::State::kSharded) return;
  const Dtype compute = ComputeDtype();
  Tensor shard = unit.flat.detach();
  if (offload_) shard = ToComputeDevice(shard);
  if (shard.dtype() != compute) shard = shard.to(compute);
  if (options_.sharding_strategy == ShardingStrategy::kNoShard) {
    // Only with mixed precision: the low-precision copy.
    unit.gathered = shard;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      PointInto(unit.params[i], unit.gathered, unit.offsets[i]);
    }
    unit.state = Unit::State::kUnsharded;
    return;
  }
  unit.gathered = empty({unit.padded_numel}, TensorOptions().dtype(compute).device(device_));
  unit.gather_input = shard;
  absl::StatusOr<std::shared_ptr<distributed::Work>> work =
      group_->allgather_into_tensor(unit.gathered, unit.gather_input);
  unit.gather_work =
      work.ok() ? *std::move(work)
                : distributed::Work::Completed(distributed::OpType::kAllGatherIntoTensor,
                                               work.status());
  unit.state = Unit::State::kGathering;
  stats_.all_gathers += 1;
}

void FullyShardedDataParallel::WaitUnshard(Unit& unit) {
  Unshard(unit);
  if (unit.state != Unit::State::kGathering) return;
  const absl::Time start = absl::Now();
  const absl::Status status = unit.gather_work->wait();
  stats_.all_gather_wait_time += absl::Now() - start;
  unit.gather_work.reset();
  unit.gather_input = Tensor();
  if (!status.ok()) {
    Fail(absl::StrCat("the all_gather of unit ", unit.index, " ('", unit.name, "')"), status);
  }
  for (size_t i = 0; i < unit.params.size(); ++i) {
    PointInto(unit.params[i], unit.gathered, unit.offsets[i]);
  }
  unit.state = Unit::State::kUnsharded;
}

void FullyShardedDataParallel::Reshard(Unit& unit) {
  if (unit.empty()) return;
  if (unit.state == Unit::State::kGathering) {
    (void)unit.gather_work->wait();
    unit.gather_work.reset();
    unit.gather_input = Tensor();
    unit.state = Unit::State::kUnsharded;
  }
  if (unit.state != Unit::State::kUnsharded) return;
  // NO_SHARD in the parameters' own dtype: the storage is the flat parameter.
  if (unit.gathered.defined() && unit.gathered.storage().is_alias_of(unit.flat.storage())) return;
  for (const Tensor& p : unit.params) PointAtNothing(p);
  unit.gathered = Tensor();
  unit.state = Unit::State::kSharded;
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  CheckUsable();
  if (in_iteration_) {
    // The previous forward's backward never ran (or stopped early).
    end_of_backward_.Done();
    for (auto& unit : units_) {
      if (unit->reduce_work != nullptr) (void)unit->reduce_work->wait();
      if (unit->replicate_work != nullptr) (void)unit->replicate_work->wait();
      unit->reduce_work.reset();
      unit->replicate_work.reset();
      Reshard(*unit);
    }
  }
  for (auto& unit : units_) {
    unit->pending = unit->params.size();
    std::fill(unit->ready.begin(), unit->ready.end(), false);
    unit->reduced = false;
    unit->reduce_input = unit->reduce_output = Tensor();
  }
  expect_backward_ = autograd::GradMode::is_enabled();
  sync_gradients_ = require_backward_grad_sync_;
  in_iteration_ = true;
  forward_order_.clear();
  kept_gathered_.reset();
  Unit& root = *units_[0];
  WaitUnshard(root);
  MarkNewValues(root.params);
  if (options_.forward_prefetch && !last_forward_order_.empty()) {
    Unshard(*units_[last_forward_order_.front()]);
  }
  Tensor x = input;
  const std::optional<Dtype>& param_dtype = options_.mixed_precision.param_dtype;
  if (param_dtype.has_value() && IsFloating(x.dtype()) && x.dtype() != *param_dtype) {
    x = x.to(*param_dtype);
  }
  Tensor output;
  try {
    output = (*module_)(x);
  } catch (...) {
    in_iteration_ = false;
    for (auto& unit : units_) Reshard(*unit);
    throw;
  }
  // Backward visits the root first, then the units in reverse forward order.
  backward_order_ = {0};
  std::unordered_set<size_t> seen = {0};
  for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it) {
    if (seen.insert(*it).second) backward_order_.push_back(*it);
  }
  if (expect_backward_ && output.defined() && output.requires_grad()) {
    std::weak_ptr<FullyShardedDataParallel> weak =
        std::static_pointer_cast<FullyShardedDataParallel>(shared_from_this());
    autograd::RegisterHook(output, [weak](const Tensor&) {
      if (auto self = weak.lock()) self->OnPreBackward(0);
      return Tensor();
    });
  } else {
    in_iteration_ = false;
    last_forward_order_ = forward_order_;
    for (auto& unit : units_) Reshard(*unit);
  }
  return output;
}

void FullyShardedDataParallel::OnUnitForwardStart(size_t index) {
  CheckUsable();
  if (kept_gathered_.has_value() && *kept_gathered_ != index) {
    Reshard(*units_[*kept_gathered_]);
    kept_gathered_.reset();
  }
  Unit& unit = *units_[index];
  WaitUnshard(unit);
  MarkNewValues(unit.params);
  if (!in_iteration_) return;
  forward_order_.push_back(index);
  const size_t position = forward_order_.size();
  if (options_.forward_prefetch && position < last_forward_order_.size()) {
    Unshard(*units_[last_forward_order_[position]]);
  }
}

void FullyShardedDataParallel::OnUnitForwardEnd(size_t index, const Tensor& output) {
  Unit& unit = *units_[index];
  const bool backward_coming =
      in_iteration_ && expect_backward_ && output.defined() && output.requires_grad();
  if (!backward_coming) {
    Reshard(unit);
    return;
  }
  if (ReshardsAfterForward()) {
    if (kept_gathered_.has_value() && *kept_gathered_ != index) {
      Reshard(*units_[*kept_gathered_]);
    }
    kept_gathered_ = index;
  }
  std::weak_ptr<FullyShardedDataParallel> weak =
      std::static_pointer_cast<FullyShardedDataParallel>(shared_from_this());
  autograd::RegisterHook(output, [weak, index](const Tensor&) {
    if (auto self = weak.lock()) self->OnPreBackward(index);
    return Tensor();
  });
}

void FullyShardedDataParallel::QueueFinishBackward() {
  std::weak_ptr<FullyShardedDataParallel> weak =
      std::static_pointer_cast<FullyShardedDataParallel>(shared_from_this());
  end_of_backward_.QueueOnce([weak] {
    if (auto self = weak.lock()) self->FinishBackward();
  });
}

void FullyShardedDataParallel::OnPreBackward(size_t index) {
  if (!in_iteration_) return;
  QueueFinishBackward();
  Unit& unit = *units_[index];
  if (unit.reduced) return;  // a second output of a unit already done
  WaitUnshard(unit);
  if (!options_.backward_prefetch) return;
  auto it = std::find(backward_order_.begin(), backward_order_.end(), index);
  for (++it; it < backward_order_.end(); ++it) {
    Unit& next = *units_[*it];
    if (next.empty() || next.reduced) continue;
    Unshard(next);
    break;
  }
}

void FullyShardedDataParallel::OnGradReady(size_t unit_index, size_t param) {
  if (!in_iteration_ || !expect_backward_) return;
  QueueFinishBackward();
  Unit& unit = *units_[unit_index];
  if (unit.ready[param]) return;
  unit.ready[param] = true;
  if (--unit.pending != 0) return;
  if (sync_gradients_) ReduceGradients(unit);
  if (FreesUnsharded()) Reshard(unit);
}

void FullyShardedDataParallel::ReduceGradients(Unit& unit) {
  if (unit.empty() || unit.reduced) return;
  unit.reduced = true;
  const Dtype dtype = ReduceDtype();
  Tensor flat_grad = empty({unit.padded_numel}, TensorOptions().dtype(dtype).device(device_));
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const Tensor& p = unit.params[i];
    Tensor slot = flat_grad.narrow(0, unit.offsets[i], p.numel());
    const Tensor grad = p.grad();
    if (grad.defined()) {
      slot.copy_(grad.reshape({-1}));
      p.set_grad(Tensor());  // only the shard's gradient is kept
    } else {
      slot.zero_();
    }
  }
  if (unit.padded_numel > unit.numel) {
    flat_grad.narrow(0, unit.numel, unit.padded_numel - unit.numel).zero_();
  }
  // Divided by the world size, then summed, as the DDP reducer (Note
  // [Gradient buckets]): every backend has SUM. Hybrid: torch's pre-divide
  // factor here, the rest after the replicate all_reduce (Note [Hybrid sharding]).
  if (replicate_ != nullptr) {
    if (predivide_ > 1) flat_grad.div_(predivide_);
  } else {
    flat_grad.div_(group_->size());
  }
  absl::StatusOr<std::shared_ptr<distributed::Work>> work;
  distributed::OpType op;
  if (options_.sharding_strategy == ShardingStrategy::kNoShard) {
    op = distributed::OpType::kAllReduce;
    unit.reduce_output = flat_grad;
    work = group_->allreduce(flat_grad, {.op = distributed::ReduceOp::kSum});
  } else {
    op = distributed::OpType::kReduceScatter;
    unit.reduce_output = empty({unit.shard_numel}, TensorOptions().dtype(dtype).device(device_));
    std::vector<Tensor> inputs;
    for (int r = 0; r < group_->size(); ++r) {
      inputs.push_back(flat_grad.narrow(0, r * unit.shard_numel, unit.shard_numel));
    }
    work = group_->reduce_scatter(unit.reduce_output, inputs, {.op = distributed::ReduceOp::kSum});
  }
  unit.reduce_input = flat_grad;
  unit.reduce_work = work.ok() ? *std::move(work) : distributed::Work::Completed(op, work.status());
  stats_.reductions += 1;
}

void FullyShardedDataParallel::FinishBackward() {
  end_of_backward_.Done();
  if (!in_iteration_) return;
  const absl::Time graph_done = absl::Now();
  const bool free_after = FreesUnsharded();
  if (sync_gradients_) {
    // Units whose parameters got no gradient on this rank: zeros, so that
    // every rank issues the same collectives.
    for (auto& unit : units_) ReduceGradients(*unit);
  }
  absl::Status failed;
  std::string failed_what;
  for (auto& unit : units_) {
    if (unit->reduce_work == nullptr) continue;
    absl::Status status = unit->reduce_work->wait();
    if (!status.ok() && failed.ok()) {
      failed = status;
      failed_what = absl::StrCat(
          "the gradient ",
          options_.sharding_strategy == ShardingStrategy::kNoShard ? "all_reduce"
                                                                   : "reduce_scatter",
          " of unit ", unit->index, " ('", unit->name, "')");
    }
    if (replicate_ != nullptr && failed.ok()) {
      // Note [Hybrid sharding]: the reduced shard, summed over its replicas;
      // issued in unit order, the same on every rank.
      absl::StatusOr<std::shared_ptr<distributed::Work>> work =
          replicate_->allreduce(unit->reduce_output, {.op = distributed::ReduceOp::kSum});
      unit->replicate_work =
          work.ok() ? *std::move(work)
                    : distributed::Work::Completed(distributed::OpType::kAllReduce, work.status());
    }
  }
  for (auto& unit : units_) {
    if (unit->replicate_work == nullptr) continue;
    absl::Status status = unit->replicate_work->wait();
    unit->replicate_work.reset();
    if (!status.ok() && failed.ok()) {
      failed = status;
      failed_what = absl::StrCat("the gradient all_reduce over the replicate group of unit ",
                                 unit->index, " ('", unit->name, "')");
    }
    if (postdivide_ > 1) unit->reduce_output.div_(postdivide_);
  }
  stats_.reduce_wait_time += absl::Now() - graph_done;
  if (!failed.ok()) Fail(failed_what, failed);
  std::vector<Tensor> reduced_grads(units_.size());
  for (auto& unit : units_) {
    if (unit->reduce_work == nullptr) continue;
    Tensor reduced = unit->reduce_output;
    if (reduced.dtype() != unit->flat.dtype()) reduced = reduced.to(unit->flat.dtype());
    // Note [CPU offload]: into pinned host memory without waiting; one
    // synchronisation below covers every unit's copy.
    if (offload_) reduced = reduced.to(kCPU, /*non_blocking=*/true);
    reduced_grads[unit->index] = reduced;
  }
  if (offload_) {
    const absl::Status copied = synchronize(current_stream(device_));
    if (!copied.ok()) Fail("copying the reduced gradients to the CPU", copied);
  }
  for (auto& unit : units_) {
    if (free_after) Reshard(*unit);
    if (unit->reduce_work == nullptr) continue;
    unit->reduce_work.reset();
    const Tensor& reduced = reduced_grads[unit->index];
    const Tensor grad = unit->flat.grad();
    if (grad.defined()) {
      grad.add_(reduced);
    } else {
      unit->flat.set_grad(reduced);
    }
    unit->reduce_input = unit->reduce_output = Tensor();
  }
  if (sync_gradients_) stats_.iterations += 1;
  in_iteration_ = false;
  last_forward_order_ = forward_order_;
}

Tensor FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  EMBER_CHECK(norm_type > 0, "FullyShardedDataParallel::clip_grad_norm_: norm_type must be > 0 "
                             "(or infinity), got ",
              norm_type);
  CheckUsable();
  const bool infinite = std::isinf(norm_type);
  double local = 0;
  for (const auto& unit : units_) {
    if (!unit->flat.defined()) continue;
    const Tensor grad = unit->flat.grad();
    if (!grad.defined()) continue;
    Tensor g = grad.to(kFloat64).abs();
    if (infinite) {
      local = std::max(local, g.max().item<double>());
    } else {
      local += g.pow(norm_type).sum().item<double>();
    }
  }
  double total_power = local;
  if (options_.sharding_strategy != ShardingStrategy::kNoShard && group_->size() > 1) {
    Tensor t = full({1}, local, TensorOptions().dtype(kFloat64).device(device_));
    const absl::Status status = WaitFor(group_->allreduce(
        t, {.op = infinite ? distributed::ReduceOp::kMax : distributed::ReduceOp::kSum}));
    if (!status.ok()) Fail("the all_reduce of clip_grad_norm_", status);
    total_power = t.item<double>();
  }
  const double total = infinite ? total_power : std::pow(total_power, 1.0 / norm_type);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1) {
    for (const auto& unit : units_) {
      if (!unit->flat.defined()) continue;
      const Tensor grad = unit->flat.grad();
      if (grad.defined()) grad.mul_(coefficient);
    }
  }
  return full({}, total, TensorOptions().dtype(kFloat32).device(device_));
}

absl::StatusOr<ember::StateDict> FullyShardedDataParallel::full_state_dict() {
  CheckUsable();
  if (in_iteration_) {
    return absl::FailedPreconditionError(
        "FullyShardedDataParallel::full_state_dict: called between a forward and its "
        "backward; call it between iterations");
  }
  std::unordered_map<std::string, Tensor> values;
  for (const auto& unit : units_) {
    if (unit->empty()) continue;
    // On the compute device (Note [CPU offload]), as torch's FULL_STATE_DICT
    // without offload_to_cpu.
    Tensor local = unit->flat.detach();
    if (offload_) local = local.to(device_);
    Tensor whole = local;
    if (options_.sharding_strategy != ShardingStrategy::kNoShard) {
      whole = empty({unit->padded_numel},
                    TensorOptions().dtype(unit->flat.dtype()).device(device_));
      absl::Status status = WaitFor(group_->allgather_into_tensor(whole, local));
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("FullyShardedDataParallel::full_state_dict: the "
                                         "all_gather of unit ",
                                         unit->index, " failed: ", status.message()));
      }
    }
    for (size_t i = 0; i < unit->params.size(); ++i) {
      values.emplace(unit->param_names[i],
                     whole.narrow(0, unit->offsets[i], unit->params[i].numel())
                         .view(unit->params[i].sizes())
                         .clone());
    }
  }
  ember::StateDict state;
  for (auto& [key, value] : module_->state_dict()) {
    auto it = values.find(key);
    state.emplace_back(key, it != values.end() ? it->second : value.clone());
  }
  return state;
}

absl::Status FullyShardedDataParallel::load_full_state_dict(const ember::StateDict& state) {
  if (in_iteration_) {
    return absl::FailedPreconditionError(
        "FullyShardedDataParallel::load_full_state_dict: called between a forward and its "
        "backward; call it between iterations");
  }
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [key, value] : state) given.emplace(key, &value);
  std::vector<std::string> problems;
  auto lookup = [&](const std::string& key, IntArrayRef shape) -> const Tensor* {
    auto it = given.find(key);
    if (it == given.end()) {
      problems.push_back(absl::StrCat("missing key '", key, "'"));
      return nullptr;
    }
    if (it->second->sizes() != shape) {
      problems.push_back(absl::StrCat("'", key, "' has shape ",
                                      ShapeToString(it->second->sizes()), ", expected ",
                                      ShapeToString(shape)));
      return nullptr;
    }
    return it->second;
  };
  for (const auto& unit : units_) {
    for (size_t i = 0; i < unit->params.size(); ++i) {
      lookup(unit->param_names[i], unit->params[i].sizes());
    }
  }
  const auto buffers = module_->named_buffers();
  for (const auto& [key, b] : buffers) {
    if (given.contains(key)) lookup(key, b.sizes());
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FullyShardedDataParallel::load_full_state_dict: ",
                     absl::StrJoin(problems, "; "), "; nothing was loaded"));
  }
  autograd::NoGradGuard no_grad;
  for (const auto& unit : units_) {
    if (unit->empty()) continue;
    const int64_t begin = options_.sharding_strategy == ShardingStrategy::kNoShard
                              ? 0
                              : group_->rank() * unit->shard_numel;
    const int64_t end = begin + unit->shard_numel;
    Tensor shard = unit->flat.detach();
    for (size_t i = 0; i < unit->params.size(); ++i) {
      const int64_t from = std::max(begin, unit->offsets[i]);
      const int64_t to = std::min(end, unit->offsets[i] + unit->params[i].numel());
      if (from >= to) continue;
      Tensor source = given.at(unit->param_names[i])->reshape({-1});
      shard.narrow(0, from - begin, to - from)
          .copy_(source.narrow(0, from - unit->offsets[i], to - from));
    }
  }
  for (const auto& [key, b] : buffers) {
    auto it = given.find(key);
    if (it != given.end()) b.detach().copy_(*it->second);
  }
  return absl::OkStatus();
}

}  // namespace ember::parallel
