// DeviceMesh, as torch.distributed.device_mesh: the job's ranks laid out as
// an n-dimensional array, with one process group per mesh dimension, so that
// tensor parallelism (parallel/tensor_parallel.h) talks along one dimension
// and data parallelism along another.
//
//   ```cpp compile-only
//   #include "distributed/device_mesh.h"
//   namespace dist = ember::distributed;
//   // After init_process_group at world size 4, on every rank:
//   EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh mesh,
//                          dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
//   EMBER_ASSIGN_OR_RETURN(dist::DeviceMesh tp, mesh["tp"]);  // this rank's row
//   EMBER_ASSIGN_OR_RETURN(dist::Group tp_group, tp.get_group());
//   EMBER_ASSIGN_OR_RETURN(int tp_rank, mesh.get_local_rank("tp"));
//   // Global rank 3 sits at coordinate {1, 1}; its "tp" group is {2, 3}.
//   if (tp_rank != mesh.get_coordinate()[1] || tp_group->size() != 2) {
//     return absl::InternalError("unexpected layout");
//   }
//   ```
//
// The mesh is the global ranks 0..world-1 in row-major order, as
// torch.arange(world).view(mesh_shape): the last dimension varies fastest,
// so the ranks of one "tp" row above are consecutive.
//
// Note [Mesh groups and their order]
// init_device_mesh makes, for each mesh dimension d in order 0..n-1, one
// group per slice along d (the ranks that differ only in their coordinate
// d), with new_group, which is collective: every rank calls it for every
// slice, in the same order, whether it belongs to the slice or not. The
// slices of dimension d are visited as torch lists them, the rows of
// mesh.swapdims(-1, d).reshape(-1, mesh.size(d)). A one-dimensional mesh of
// all ranks in order uses the default group itself and makes none. So every
// rank of the job must call init_device_mesh with the same arguments, and
// no other new_group may run concurrently. torch makes the groups of a
// dimension with one split_group where the backend supports it; Ember's
// new_group already gives the default group's backend its split hook
// (Note [Splitting new groups] in distributed.cc), so no separate helper is
// needed. A rank keeps only the groups it belongs to (one per dimension).
//
// Sub-meshes (`mesh["tp"]`, `mesh[{"dp", "tp"}]`) are this rank's slice of
// the named dimensions and reuse the parent's groups: no collective, no new
// group.
//
// Errors: absl::Status naming the offending value: kFailedPrecondition
// before init_process_group; kInvalidArgument for a mesh shape whose product
// is not the world size, non-positive sizes, names whose count differs from
// the shape's or that repeat, unknown dimension names or indices out of
// range.
//
// Thread-safety: init_device_mesh must not run concurrently with another
// new_group (it calls new_group). A DeviceMesh is an immutable value; its
// methods are safe from any thread.
#ifndef EMBER_DISTRIBUTED_DEVICE_MESH_H_
#define EMBER_DISTRIBUTED_DEVICE_MESH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/distributed.h"

namespace ember::distributed {

class DeviceMesh {
 public:
  // "cpu" or "cuda". Recorded only: unlike torch, init_device_mesh does not
  // pick each process's CUDA device; set it yourself (tensor/device_guard.h).
  const std::string& device_type() const { return device_type_; }
  // The mesh's shape (torch's mesh.shape).
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // The number of ranks in the mesh (torch's mesh.size()).
  int64_t size() const;
  // The size of one dimension (torch's mesh.size(mesh_dim)).
  absl::StatusOr<int64_t> size(int dim) const;
  // The global ranks of the mesh, row-major (torch's mesh.mesh.flatten()).
  const std::vector<int>& ranks() const { return ranks_; }
  // The dimension names; empty when the mesh was made without any.
  const std::vector<std::string>& mesh_dim_names() const { return dim_names_; }

  // This rank's process group along dimension `dim`, or along the one
  // named `name`. The no-argument form is for one-dimensional meshes.
  absl::StatusOr<Group> get_group(int dim) const;
  absl::StatusOr<Group> get_group(const std::string& name) const;
  absl::StatusOr<Group> get_group() const;
  // This rank's coordinate along a dimension (its rank in get_group(dim)).
  absl::StatusOr<int> get_local_rank(int dim) const;
  absl::StatusOr<int> get_local_rank(const std::string& name) const;
  // This rank's coordinate in the mesh (torch's get_coordinate()).
  const std::vector<int>& get_coordinate() const { return coordinate_; }
  // This process's global rank.
  int get_rank() const { return rank_; }

  // The sub-mesh of this rank's slice along the named dimensions, which
  // must be given in the mesh's order (torch's mesh["tp"],
  // mesh["dp", "tp"]).
  absl::StatusOr<DeviceMesh> operator[](const std::string& name) const;
  absl::StatusOr<DeviceMesh> operator[](const std::vector<std::string>& names) const;

  // The index of the dimension called `name`.
  absl::StatusOr<int> dim_index(const std::string& name) const;

  // "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))".
  std::string DebugString() const;

 private:
  friend absl::StatusOr<DeviceMesh> init_device_mesh(const std::string&, std::vector<int64_t>,
                                                     std::vector<std::string>);
  absl::Status CheckDim(int dim) const;

  std::string device_type_;
  std::vector<int64_t> shape_;
  std::vector<int> ranks_;
  std::vector<std::string> dim_names_;
  std::vector<Group> groups_;  // this rank's group along each dimension
  std::vector<int> coordinate_;
  int rank_ = 0;
};

// Lays the default group's ranks out as `mesh_shape` and makes the groups of
// every dimension (Note [Mesh groups and their order]). Collective: every
// rank calls it with the same arguments. `mesh_dim_names`, when given, has
// one distinct name per dimension.
absl::StatusOr<DeviceMesh> init_device_mesh(const std::string& device_type,
                                            std::vector<int64_t> mesh_shape,
                                            std::vector<std::string> mesh_dim_names = {});

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_DEVICE_MESH_H_
