#include "parallel/dtensor.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "distributed/process_group.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"

namespace ember::parallel {

struct DTensor::GradLayout {
  absl::Mutex mu;
  std::optional<Placements> claimed ABSL_GUARDED_BY(mu);
  std::string claimed_by ABSL_GUARDED_BY(mu);

  // Records that a consumer `who` sends gradients back in `placements`.
  absl::Status Claim(const Placements& placements, const std::string& who) {
    absl::MutexLock lock(&mu);
    if (claimed.has_value() && *claimed != placements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a DTensor's gradient would come back as ", PlacementsString(placements), " from ", who,
          " and as ", PlacementsString(*claimed), " from ", claimed_by,
          "; give both consumers the same gradient placements (Note [Gradient placements] in "
          "parallel/dtensor.h)"));
    }
    claimed = placements;
    claimed_by = who;
    return absl::OkStatus();
  }
  Placements Get(const Placements& fallback) {
    absl::MutexLock lock(&mu);
    return claimed.value_or(fallback);
  }
};

std::string Placement::DebugString() const {
  switch (kind) {
    case Kind::kShard:
      return absl::StrCat("Shard(dim=", dim, ")");
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kPartial:
      return "Partial(sum)";
  }
  return "?";
}

std::string PlacementsString(const Placements& placements) {
  std::vector<std::string> parts;
  for (const Placement& p : placements) parts.push_back(p.DebugString());
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

int64_t ShardSize(int64_t length, int64_t chunks, int64_t index) {
  const int64_t chunk = (length + chunks - 1) / chunks;
  const int64_t start = std::min(length, chunk * index);
  return std::min(chunk, length - start);
}

int64_t ShardOffset(int64_t length, int64_t chunks, int64_t index) {
  const int64_t chunk = (length + chunks - 1) / chunks;
  return std::min(length, chunk * index);
}

absl::StatusOr<LocalShard> local_shard(const SizeVector& global_shape, const DeviceMesh& mesh,
                                       const Placements& placements) {
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_shard: ", placements.size(), " placements ",
                     PlacementsString(placements), " for the ", mesh.ndim(), "-D mesh ",
                     mesh.DebugString(), "; give one per mesh dimension"));
  }
  LocalShard out{global_shape, SizeVector(global_shape.size(), 0), global_shape};
  std::vector<bool> sharded(global_shape.size(), false);
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = placements[m];
    if (p.kind != Placement::Kind::kShard) continue;
    const int64_t rank = static_cast<int64_t>(global_shape.size());
    const int64_t d = p.dim < 0 ? p.dim + rank : p.dim;
    if (d < 0 || d >= rank) {
      return absl::InvalidArgumentError(absl::StrCat("local_shard: ", p.DebugString(),
                                                     " of a tensor of shape ",
                                                     ShapeToString(global_shape)));
    }
    if (sharded[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("local_shard: dimension ", d, " is sharded twice in ",
                       PlacementsString(placements), "; nested sharding is not supported"));
    }
    sharded[d] = true;
    EMBER_ASSIGN_OR_RETURN(const int64_t n, mesh.size(m));
    EMBER_ASSIGN_OR_RETURN(const int index, mesh.get_local_rank(m));
    out.offsets[d] = ShardOffset(global_shape[d], n, index);
    out.sizes[d] = ShardSize(global_shape[d], n, index);
  }
  return out;
}

namespace {

using autograd::Node;
using autograd::variable_list;
using distributed::Group;

std::string ShapeString(IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Wait(const absl::StatusOr<std::shared_ptr<distributed::Work>>& work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

// Checks `placements` against the mesh and a tensor of `ndim` dimensions;
// returns them with Shard dims made non-negative.
absl::StatusOr<Placements> Normalize(const Placements& placements, const DeviceMesh& mesh,
                                     int64_t ndim, const char* what) {
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", placements.size(), " placements ", PlacementsString(placements), " for a ",
        mesh.ndim(), "-D DeviceMesh; give one placement per mesh dimension"));
  }
  Placements out = placements;
  std::vector<int> sharded_by(ndim, -1);
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].is_shard()) continue;
    const int64_t d = out[i].dim < 0 ? out[i].dim + ndim : out[i].dim;
    if (d < 0 || d >= ndim) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", out[i].DebugString(), " on mesh dimension ", i, " is out of range for a ",
          ndim, "-D tensor; use a dim in [", -ndim, ", ", ndim - 1, "]"));
    }
    if (sharded_by[d] >= 0) {
      return absl::UnimplementedError(absl::StrCat(
          what, ": placements ", PlacementsString(placements), " shard tensor dimension ", d,
          " on mesh dimensions ", sharded_by[d], " and ", i,
          "; nested sharding is not supported, shard each tensor dimension once"));
    }
    sharded_by[d] = static_cast<int>(i);
    out[i].dim = d;
  }
  return out;
}

// The gradient layout of a DTensor laid out as `placements`: Partial read
// as Replicate (Note [Gradient placements]).
Placements ForGrad(Placements placements) {
  for (Placement& p : placements) {
    if (p.is_partial()) p = Replicate();
  }
  return placements;
}

// Pads `t` with zeros along `dim` up to `length`.
Tensor PadTo(const Tensor& t, int64_t dim, int64_t length) {
  const int64_t have = t.size(dim);
  if (have == length) return t.contiguous();
  SizeVector pad_shape(t.sizes().begin(), t.sizes().end());
  pad_shape[dim] = length - have;
  Tensor pad = zeros(pad_shape, TensorOptions(t.dtype()).device(t.device()));
  if (have == 0) return pad;
  return cat({t, pad}, dim).contiguous();
}

// Shard(dim) -> Replicate over `group`: every rank's chunk, padded to the
// largest chunk, gathered and trimmed.
absl::StatusOr<Tensor> GatherAlong(const Tensor& local, const Group& group, int64_t dim,
                                   int64_t length) {
  const int n = group->size();
  const int64_t chunk = (length + n - 1) / n;
  Tensor padded = PadTo(local, dim, chunk);
  std::vector<Tensor> outputs;
  for (int r = 0; r < n; ++r) outputs.push_back(empty_like(padded));
  EMBER_RETURN_IF_ERROR(Wait(group->allgather(outputs, padded)));
  std::vector<Tensor> pieces;
  for (int r = 0; r < n; ++r) {
    const int64_t size = ShardSize(length, n, r);
    if (size > 0) pieces.push_back(outputs[r].narrow(dim, 0, size));
  }
  return cat(pieces, dim).contiguous();
}

// Replicate -> Shard(dim): this rank's chunk, copied.
Tensor ChunkAlong(const Tensor& full, int64_t dim, int n, int index) {
  const int64_t length = full.size(dim);
  return full.narrow(dim, ShardOffset(length, n, index), ShardSize(length, n, index)).contiguous();
}

// Partial -> Shard(dim): the chunks, padded, reduce-scattered and trimmed.
absl::StatusOr<Tensor> ReduceScatterAlong(const Tensor& partial, const Group& group, int64_t dim) {
  const int n = group->size();
  const int64_t length = partial.size(dim);
  const int64_t chunk = (length + n - 1) / n;
  std::vector<Tensor> inputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(PadTo(ChunkAlong(partial, dim, n, r), dim, chunk));
  }
  Tensor out = empty_like(inputs[0]);
  EMBER_RETURN_IF_ERROR(Wait(group->reduce_scatter(out, inputs)));
  return out.narrow(dim, 0, ShardSize(length, n, group->rank())).contiguous();
}

absl::StatusOr<Group> GroupOf(const DeviceMesh& mesh, int dim) {
  EMBER_ASSIGN_OR_RETURN(Group group, mesh.get_group(dim));
  if (group == nullptr || group->rank() < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this rank (", mesh.get_rank(), ") is not a member of mesh dimension ", dim, "'s group"));
  }
  return group;
}

// The local tensor of a DTensor of global `shape` laid out as `from`, laid
// out as `to` (both normalised). Mesh dimensions leaving a Shard (and
// reducing a Partial to Replicate) go first, those entering a Shard or a
// Partial last, so no step holds a nested layout.
absl::StatusOr<Tensor> RedistributeLocal(Tensor local, const DeviceMesh& mesh,
                                         const SizeVector& shape, const Placements& from,
                                         const Placements& to) {
  autograd::NoGradGuard no_grad;
  Placements current = from;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (current[i] == to[i]) continue;
    EMBER_ASSIGN_OR_RETURN(Group group, GroupOf(mesh, i));
    if (current[i].is_shard()) {
      EMBER_ASSIGN_OR_RETURN(local,
                             GatherAlong(local, group, current[i].dim, shape[current[i].dim]));
      current[i] = Replicate();
    } else if (current[i].is_partial() && to[i].is_replicate()) {
      local = local.clone();
      EMBER_RETURN_IF_ERROR(Wait(group->allreduce(local)));
      current[i] = Replicate();
    }
  }
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (current[i] == to[i]) continue;
    EMBER_ASSIGN_OR_RETURN(Group group, GroupOf(mesh, i));
    if (to[i].is_shard()) {
      if (current[i].is_replicate()) {
        local = ChunkAlong(local, to[i].dim, group->size(), group->rank());
      } else {  // Partial
        EMBER_ASSIGN_OR_RETURN(local, ReduceScatterAlong(local, group, to[i].dim));
      }
    } else if (to[i].is_partial()) {  // from Replicate
      local = local / static_cast<double>(group->size());
    }
    current[i] = to[i];
  }
  return local;
}

// The backward of from_local and redistribute: the gradient arrives in the
// layout the output's consumers claimed and leaves in `target`.
class RedistributeBackward final : public Node {
 public:
  RedistributeBackward(std::string name, DeviceMesh mesh, SizeVector shape, Placements output,
                       Placements target, std::shared_ptr<DTensor::GradLayout> output_layout)
      : name_(std::move(name)),
        mesh_(std::move(mesh)),
        shape_(std::move(shape)),
        output_(std::move(output)),
        target_(std::move(target)),
        output_layout_(std::move(output_layout)) {}
  std::string name() const override { return name_; }

 protected:
  variable_list apply(variable_list&& grads) override {
    Tensor grad = grads[0];
    if (!grad.defined()) return {Tensor()};
    const Placements from = output_layout_->Get(ForGrad(output_));
    absl::StatusOr<Tensor> out = RedistributeLocal(grad, mesh_, shape_, from, target_);
    EMBER_CHECK(out.ok(), name_, ": redistributing the gradient from ", PlacementsString(from),
                " to ", PlacementsString(target_), ": ", out.status().message());
    return {*out};
  }

 private:
  std::string name_;
  DeviceMesh mesh_;
  SizeVector shape_;
  Placements output_;
  Placements target_;
  std::shared_ptr<DTensor::GradLayout> output_layout_;
};

// Records `node` as the producer of `output` from `input`.
void Record(const std::shared_ptr<Node>& node, const Tensor& input, const Tensor& output) {
  node->add_next_edge(autograd::GradientEdge(input));
  autograd::SetHistory(output, node);
}

bool ShouldRecord(const Tensor& input) {
  return autograd::GradMode::is_enabled() && input.requires_grad() && input.is_floating_point();
}

}  // namespace

absl::StatusOr<DTensor> DTensor::from_local(const Tensor& local, const DeviceMesh& mesh,
                                            Placements placements,
                                            const FromLocalOptions& options) {
  if (!local.defined()) {
    return absl::InvalidArgumentError("DTensor::from_local: the local tensor is undefined");
  }
  EMBER_ASSIGN_OR_RETURN(Placements normal,
                         Normalize(placements, mesh, local.dim(), "DTensor::from_local"));
  SizeVector shape(local.sizes().begin(), local.sizes().end());
  if (options.shape.has_value()) {
    if (static_cast<int64_t>(options.shape->size()) != local.dim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DTensor::from_local: shape ", ShapeString(*options.shape), " has ",
                       options.shape->size(), " dimensions but the local tensor of shape ",
                       ShapeString(local.sizes()), " has ", local.dim()));
    }
    shape = *options.shape;
  } else {
    for (int i = 0; i < mesh.ndim(); ++i) {
      if (normal[i].is_shard()) shape[normal[i].dim] *= mesh.shape()[i];
    }
  }
  // This rank's chunk of `shape` must be the local tensor's shape.
  SizeVector expected = shape;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!normal[i].is_shard()) continue;
    const int64_t d = normal[i].dim;
    expected[d] = ShardSize(shape[d], mesh.shape()[i], mesh.get_coordinate()[i]);
  }
  if (!std::equal(expected.begin(), expected.end(), local.sizes().begin(), local.sizes().end())) {
    return absl::InvalidArgumentError(
        absl::StrCat("DTensor::from_local: the local tensor of shape ", ShapeString(local.sizes()),
                     " is not this rank's piece ", ShapeString(expected), " of a tensor of shape ",
                     ShapeString(shape), " laid out as ", PlacementsString(normal),
                     " (mesh coordinate [", absl::StrJoin(mesh.get_coordinate(), ", "),
                     "]); pass the global shape in FromLocalOptions::shape for uneven shards"));
  }
  Placements grad_target = ForGrad(normal);
  if (options.grad_placements.has_value()) {
    EMBER_ASSIGN_OR_RETURN(grad_target, Normalize(*options.grad_placements, mesh, local.dim(),
                                                  "DTensor::from_local grad_placements"));
  }
  DTensor out;
  out.mesh_ = mesh;
  out.placements_ = normal;
  out.shape_ = shape;
  out.grad_layout_ = std::make_shared<GradLayout>();
  out.local_ = local.detach();
  if (ShouldRecord(local)) {
    Record(std::make_shared<RedistributeBackward>("FromLocalBackward", mesh, shape, normal,
                                                  grad_target, out.grad_layout_),
           local, out.local_);
  }
  return out;
}

Tensor DTensor::to_local() const {
  absl::StatusOr<Tensor> local = to_local(placements_);
  EMBER_CHECK(local.ok(), local.status().message());
  return *local;
}

absl::StatusOr<Tensor> DTensor::to_local(const Placements& grad_placements) const {
  if (!defined()) return absl::FailedPreconditionError("to_local of an undefined DTensor");
  EMBER_ASSIGN_OR_RETURN(Placements normal, Normalize(grad_placements, mesh_, local_.dim(),
                                                      "DTensor::to_local grad_placements"));
  if (ShouldRecord(local_)) {
    EMBER_RETURN_IF_ERROR(grad_layout_->Claim(normal, "to_local"));
  }
  return local_;
}

absl::StatusOr<DTensor> DTensor::redistribute(Placements placements) const {
  if (!defined()) return absl::FailedPreconditionError("redistribute of an undefined DTensor");
  EMBER_ASSIGN_OR_RETURN(Placements target,
                         Normalize(placements, mesh_, local_.dim(), "DTensor::redistribute"));
  for (int i = 0; i < mesh_.ndim(); ++i) {
    if (placements_[i].is_shard() && target[i].is_partial()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DTensor::redistribute from ", PlacementsString(placements_), " to ",
                       PlacementsString(target), ": Shard to Partial on mesh dimension ", i,
                       " is not a redistribution torch supports; go through Replicate()"));
    }
  }
  EMBER_ASSIGN_OR_RETURN(Tensor local,
                         RedistributeLocal(local_, mesh_, shape_, placements_, target));
  DTensor out;
  out.mesh_ = mesh_;
  out.placements_ = target;
  out.shape_ = shape_;
  out.grad_layout_ = std::make_shared<GradLayout>();
  out.local_ = local.is_same(local_) ? local_.detach() : local;
  if (ShouldRecord(local_)) {
    const Placements back = ForGrad(placements_);
    EMBER_RETURN_IF_ERROR(grad_layout_->Claim(back, "redistribute"));
    Record(std::make_shared<RedistributeBackward>("RedistributeBackward", mesh_, shape_, target,
                                                  back, out.grad_layout_),
           local_, out.local_);
  }
  return out;
}

absl::StatusOr<Tensor> DTensor::full_tensor() const {
  EMBER_ASSIGN_OR_RETURN(DTensor full, redistribute(Placements(mesh_.ndim(), Replicate())));
  return full.to_local(full.placements());
}

std::string DTensor::DebugString() const {
  return absl::StrCat("DTensor(shape=", ShapeString(shape_),
                      ", placements=", PlacementsString(placements_), ")");
}

absl::StatusOr<DTensor> distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh,
                                          Placements placements) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError("distribute_tensor: the tensor is undefined");
  }
  EMBER_ASSIGN_OR_RETURN(Placements normal,
                         Normalize(placements, mesh, tensor.dim(), "distribute_tensor"));
  Tensor local = tensor.detach();
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (normal[i].is_partial()) {
      return absl::InvalidArgumentError(
          absl::StrCat("distribute_tensor: placements ", PlacementsString(normal),
                       " hold Partial(sum) on mesh dimension ", i,
                       "; distribute as Shard or Replicate and redistribute"));
    }
    if (normal[i].is_shard()) {
      local = ChunkAlong(local, normal[i].dim, static_cast<int>(mesh.shape()[i]),
                         mesh.get_coordinate()[i]);
    }
  }
  local = local.clone();
  if (tensor.requires_grad()) local.requires_grad_(true);
  DTensor out;
  out.mesh_ = mesh;
  out.placements_ = normal;
  out.shape_ = SizeVector(tensor.sizes().begin(), tensor.sizes().end());
  out.grad_layout_ = std::make_shared<DTensor::GradLayout>();
  out.local_ = local;
  return out;
}

}  // namespace ember::parallel
