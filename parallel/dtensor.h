// DTensor, as torch.distributed.tensor.DTensor, as far as tensor parallelism
// needs it: a tensor laid out over a DeviceMesh, one placement per mesh
// dimension — Shard(dim) (this rank holds its chunk along `dim`),
// Replicate() (every rank holds all of it) or Partial() (every rank holds a
// summand) — with from_local, to_local, full_tensor and redistribute, all
// recorded by autograd.
//
//   ```cpp compile-only
//   #include "parallel/dtensor.h"
//   #include "tensor/factories.h"
//   namespace par = ember::parallel;
//   // Every rank of a 1-D mesh of 2 ranks over the default group:
//   EMBER_ASSIGN_OR_RETURN(auto mesh, ember::distributed::init_device_mesh("cpu", {2}));
//   ember::Tensor w = ember::randn({5, 3}).requires_grad_();  // the same on every rank
//   EMBER_ASSIGN_OR_RETURN(par::DTensor d, par::distribute_tensor(w, mesh, {par::Shard(0)}));
//   // Rank 0 holds rows 0..2, rank 1 rows 3..4 (torch.chunk's sizes), as a leaf.
//   ember::Tensor shard = d.to_local();
//   EMBER_ASSIGN_OR_RETURN(par::DTensor r, d.redistribute({par::Replicate()}));  // all_gather
//   (r.to_local() * 2.0).sum().backward();  // shard.grad(): 2s, its chunk of the gradient
//   ```
//
// Unlike torch's DTensor, this one is not a Tensor: there are no DTensor
// ops (matmul of DTensors and sharding propagation). Code computes on the
// local tensors and states the layouts where they change; parallel/
// tensor_parallel.h does that for Linear, Embedding and LayerNorm.
//
// Layout, as torch's: Shard(d) on mesh dimension i splits dimension d as
// torch.chunk does over the mesh's size n along i: chunks of ceil(len / n),
// the last ones shorter or empty (len 5 over 4 ranks: 2, 2, 1, 0). A
// tensor dimension may be sharded by one mesh dimension only (torch's
// nested sharding, [Shard(0), Shard(0)], is refused with kUnimplemented).
// Partial() is torch's Partial("sum").
//
// Collectives of redistribute, per mesh dimension, over that dimension's
// group: Shard -> Replicate all_gather (padded to equal chunks, as torch);
// Partial -> Replicate all_reduce; Partial -> Shard reduce_scatter;
// Replicate -> Shard takes the local chunk, no communication; Replicate ->
// Partial divides by n (torch's partition of a sum); Shard(d) -> Shard(e)
// gathers along d and takes the chunk along e (torch uses all_to_all).
// Mesh dimensions leaving a Shard go first, those entering one last, so no
// step holds a nested layout.
//
// Note [Gradient placements]
// Autograd sees the local tensors. The gradient of a DTensor's local tensor
// has a layout too, and the backward of each function here turns the
// gradient it receives into the layout its input expects: redistribute's
// backward redistributes from the output's gradient layout to the input's
// placements with Partial read as Replicate (torch's normalisation: the
// gradient of a Partial tensor is replicated); from_local's to its
// placements, normalised the same way, or to its grad_placements;
// to_local's gradient has the DTensor's placements unless grad_placements
// says otherwise (a Replicate DTensor whose local tensor feeds a
// column-sharded matmul gets a Partial gradient: to_local({Partial()})), so
// the transposed collective runs in the backward of whatever produced the
// DTensor — the reduce_scatter of an all_gather, the all_reduce of a
// replicated input, as in torch. The layout a DTensor's gradient arrives in
// is decided by its consumers when they are recorded; two consumers that
// would send gradients in different layouts are refused (kInvalidArgument
// naming both) rather than summed wrongly.
//
// Errors: absl::Status naming the value: placements whose count differs
// from the mesh's dimensions, Shard dims out of range, a tensor dimension
// sharded twice, local shapes that disagree with the global shape.
// Collective failures come back as the group's Status in forward, and
// throw ember::Error in backward (autograd's way).
//
// Thread-safety: a DTensor is an immutable value; its functions are
// collective over the mesh groups they use, so every rank calls them in the
// same order.
#ifndef EMBER_PARALLEL_DTENSOR_H_
#define EMBER_PARALLEL_DTENSOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/device_mesh.h"
#include "tensor/tensor.h"

namespace ember::parallel {

using distributed::DeviceMesh;

struct Placement {
  enum class Kind { kShard, kReplicate, kPartial };
  Kind kind = Kind::kReplicate;
  int64_t dim = 0;  // kShard: the tensor dimension (negative counts from the end)

  bool is_shard() const { return kind == Kind::kShard; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_partial() const { return kind == Kind::kPartial; }
  // "Shard(dim=0)", "Replicate()", "Partial(sum)", as torch prints them.
  std::string DebugString() const;
  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind != Kind::kShard || a.dim == b.dim);
  }
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
};

inline Placement Shard(int64_t dim) { return {.kind = Placement::Kind::kShard, .dim = dim}; }
inline Placement Replicate() { return {.kind = Placement::Kind::kReplicate}; }
inline Placement Partial() { return {.kind = Placement::Kind::kPartial}; }

using Placements = std::vector<Placement>;
std::string PlacementsString(const Placements& placements);

// torch.chunk's split of `length` into `chunks`: the size and offset of
// chunk `index` (empty chunks sit at `length`).
int64_t ShardSize(int64_t length, int64_t chunks, int64_t index);
int64_t ShardOffset(int64_t length, int64_t chunks, int64_t index);

// Where this rank's local tensor lies in the whole tensor of shape
// `global_shape` laid out as `placements` over `mesh` (torch's
// compute_local_shape_and_global_offset): Shard(d) takes this rank's
// torch.chunk of dimension d along its mesh dimension; Replicate and
// Partial take the dimension whole.
struct LocalShard {
  SizeVector global_shape;
  SizeVector offsets;
  SizeVector sizes;
};
// InvalidArgument for placements that do not match the mesh's dimensions, a
// shard dimension outside the shape, or one tensor dimension sharded twice.
absl::StatusOr<LocalShard> local_shard(const SizeVector& global_shape, const DeviceMesh& mesh,
                                       const Placements& placements);

struct FromLocalOptions {
  // The global shape; unset: the local shape with each sharded dimension
  // times the mesh size along it (torch's assumption of even shards). Give
  // it for uneven shards.
  std::optional<SizeVector> shape;
  // The layout of the gradient from_local's backward returns; unset: the
  // placements with Partial read as Replicate (Note [Gradient placements]).
  std::optional<Placements> grad_placements;
};

class DTensor {
 public:
  DTensor() = default;

  // Wraps this rank's `local` piece of a tensor laid out as `placements`
  // (torch's DTensor.from_local, run_check=False). Not collective. The
  // local tensor is shared, not copied; autograd records it.
  static absl::StatusOr<DTensor> from_local(const Tensor& local, const DeviceMesh& mesh,
                                            Placements placements,
                                            const FromLocalOptions& options = {});

  // This rank's piece, in the autograd graph (torch's to_local). With
  // grad_placements, the gradient that will flow back into it has that
  // layout (Note [Gradient placements]).
  Tensor to_local() const;
  absl::StatusOr<Tensor> to_local(const Placements& grad_placements) const;

  // The same tensor laid out as `placements` (torch's redistribute);
  // collective over the mesh dimensions that change.
  absl::StatusOr<DTensor> redistribute(Placements placements) const;

  // The whole tensor on every rank (torch's full_tensor): redistribute to
  // Replicate everywhere, then to_local.
  absl::StatusOr<Tensor> full_tensor() const;

  bool defined() const { return local_.defined(); }
  const SizeVector& shape() const { return shape_; }
  const Placements& placements() const { return placements_; }
  const DeviceMesh& device_mesh() const { return mesh_; }
  bool requires_grad() const { return local_.defined() && local_.requires_grad(); }
  // "DTensor(shape=[4, 6], placements=(Shard(dim=0), Replicate()))".
  std::string DebugString() const;

  // The gradient layout the DTensor's consumers have asked for (Note
  // [Gradient placements]); shared by copies of this DTensor.
  struct GradLayout;

 private:
  friend absl::StatusOr<DTensor> distribute_tensor(const Tensor&, const DeviceMesh&, Placements);

  Tensor local_;
  DeviceMesh mesh_;
  Placements placements_;
  SizeVector shape_;
  std::shared_ptr<GradLayout> grad_layout_;
};

// Splits `tensor`, the same whole tensor on every rank, as `placements`
// (torch's distribute_tensor with src_data_rank=None: each rank takes its
// chunk, no communication). The local tensor is a new leaf (a copy) that
// requires grad when `tensor` does, as torch's. Shard and Replicate only:
// Partial is refused with kInvalidArgument, as torch refuses it.
absl::StatusOr<DTensor> distribute_tensor(const Tensor& tensor, const DeviceMesh& mesh,
                                          Placements placements);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_DTENSOR_H_
