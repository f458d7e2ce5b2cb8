#include "distributed/device_mesh.h"

#include <functional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

std::string NamesString(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& n : names) quoted.push_back(absl::StrCat("'", n, "'"));
  return absl::StrCat("(", absl::StrJoin(quoted, ", "), ")");
}

// Row-major strides of `shape`.
std::vector<int64_t> Strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

// The slices of `ranks` (laid out as `shape`) along `dim`, in the order of
// the rows of mesh.swapdims(-1, dim).reshape(-1, shape[dim]) (Note [Mesh
// groups and their order]).
std::vector<std::vector<int>> SlicesAlong(const std::vector<int>& ranks,
                                          const std::vector<int64_t>& shape, int dim) {
  const int n = static_cast<int>(shape.size());
  // The swapped layout: dims in this order, the last one being `dim`.
  std::vector<int> order(n);
  for (int d = 0; d < n; ++d) order[d] = d;
  std::swap(order[dim], order[n - 1]);
  const std::vector<int64_t> strides = Strides(shape);
  std::vector<int64_t> index(n, 0);  // over `order`'s first n-1 dims
  int64_t count = 1;
  for (int d = 0; d < n - 1; ++d) count *= shape[order[d]];
  std::vector<std::vector<int>> slices;
  slices.reserve(count);
  for (int64_t s = 0; s < count; ++s) {
    int64_t base = 0;
    for (int d = 0; d < n - 1; ++d) base += index[d] * strides[order[d]];
    std::vector<int> slice;
    for (int64_t i = 0; i < shape[dim]; ++i) slice.push_back(ranks[base + i * strides[dim]]);
    slices.push_back(std::move(slice));
    for (int d = n - 2; d >= 0; --d) {  // next index, row-major over `order`
      if (++index[d] < shape[order[d]]) break;
      index[d] = 0;
    }
  }
  return slices;
}

}  // namespace

int64_t DeviceMesh::size() const { return static_cast<int64_t>(ranks_.size()); }

absl::Status DeviceMesh::CheckDim(int dim) const {
  if (dim < 0 || dim >= ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh dimension ", dim, " is out of range for a ", ndim(), "-D DeviceMesh of shape ",
        ShapeString(shape_), "; pass 0..", ndim() - 1, " or a name"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DeviceMesh::size(int dim) const {
  EMBER_RETURN_IF_ERROR(CheckDim(dim));
  return shape_[dim];
}

absl::StatusOr<int> DeviceMesh::dim_index(const std::string& name) const {
  for (size_t d = 0; d < dim_names_.size(); ++d) {
    if (dim_names_[d] == name) return static_cast<int>(d);
  }
  if (dim_names_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the DeviceMesh has no dimension names, so '", name,
                     "' names none; pass mesh_dim_names to init_device_mesh"));
  }
  return absl::InvalidArgumentError(absl::StrCat("the DeviceMesh has no dimension named '", name,
                                                 "'; its dimensions are ",
                                                 NamesString(dim_names_)));
}

absl::StatusOr<Group> DeviceMesh::get_group(int dim) const {
  EMBER_RETURN_IF_ERROR(CheckDim(dim));
  return groups_[dim];
}

absl::StatusOr<Group> DeviceMesh::get_group(const std::string& name) const {
  EMBER_ASSIGN_OR_RETURN(int dim, dim_index(name));
  return groups_[dim];
}

absl::StatusOr<Group> DeviceMesh::get_group() const {
  if (ndim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("get_group() without a dimension needs a 1-D DeviceMesh, this one has shape ",
                     ShapeString(shape_), "; pass the dimension's index or name"));
  }
  return groups_[0];
}

absl::StatusOr<int> DeviceMesh::get_local_rank(int dim) const {
  EMBER_RETURN_IF_ERROR(CheckDim(dim));
  return coordinate_[dim];
}

absl::StatusOr<int> DeviceMesh::get_local_rank(const std::string& name) const {
  EMBER_ASSIGN_OR_RETURN(int dim, dim_index(name));
  return coordinate_[dim];
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](const std::string& name) const {
  return (*this)[std::vector<std::string>{name}];
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](const std::vector<std::string>& names) const {
  if (names.empty()) {
    return absl::InvalidArgumentError("a sub-mesh needs at least one dimension name");
  }
  std::vector<int> dims;
  for (const std::string& name : names) {
    EMBER_ASSIGN_OR_RETURN(int dim, dim_index(name));
    if (!dims.empty() && dim <= dims.back()) {
      return absl::InvalidArgumentError(absl::StrCat("sub-mesh dimensions ", NamesString(names),
                                                     " must be distinct and in the mesh's order ",
                                                     NamesString(dim_names_)));
    }
    dims.push_back(dim);
  }
  DeviceMesh sub;
  sub.device_type_ = device_type_;
  sub.rank_ = rank_;
  for (int d : dims) {
    sub.shape_.push_back(shape_[d]);
    sub.dim_names_.push_back(dim_names_[d]);
    sub.groups_.push_back(groups_[d]);
    sub.coordinate_.push_back(coordinate_[d]);
  }
  // The ranks that share this rank's coordinates on every dimension not kept.
  const std::vector<int64_t> strides = Strides(shape_);
  int64_t base = 0;
  std::set<int> kept(dims.begin(), dims.end());
  for (int d = 0; d < ndim(); ++d) {
    if (kept.count(d) == 0) base += coordinate_[d] * strides[d];
  }
  std::vector<int64_t> index(dims.size(), 0);
  const int64_t count = [&] {
    int64_t c = 1;
    for (int64_t s : sub.shape_) c *= s;
    return c;
  }();
  for (int64_t i = 0; i < count; ++i) {
    int64_t flat = base;
    for (size_t k = 0; k < dims.size(); ++k) flat += index[k] * strides[dims[k]];
    sub.ranks_.push_back(ranks_[flat]);
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
      if (++index[k] < sub.shape_[k]) break;
      index[k] = 0;
    }
  }
  return sub;
}

std::string DeviceMesh::DebugString() const {
  // Nested lists, row-major.
  std::string body;
  const std::vector<int64_t> strides = Strides(shape_);
  std::function<void(int, int64_t)> print = [&](int dim, int64_t base) {
    absl::StrAppend(&body, "[");
    for (int64_t i = 0; i < shape_[dim]; ++i) {
      if (i > 0) absl::StrAppend(&body, ", ");
      if (dim + 1 == ndim()) {
        absl::StrAppend(&body, ranks_[base + i]);
      } else {
        print(dim + 1, base + i * strides[dim]);
      }
    }
    absl::StrAppend(&body, "]");
  };
  if (ndim() > 0) print(0, 0);
  std::string out = absl::StrCat("DeviceMesh('", device_type_, "', ", body);
  if (!dim_names_.empty()) absl::StrAppend(&out, ", mesh_dim_names=", NamesString(dim_names_));
  absl::StrAppend(&out, ")");
  return out;
}

absl::StatusOr<DeviceMesh> init_device_mesh(const std::string& device_type,
                                            std::vector<int64_t> mesh_shape,
                                            std::vector<std::string> mesh_dim_names) {
  if (device_type != "cpu" && device_type != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("init_device_mesh: device_type '", device_type,
                                                   "' is not supported; use 'cpu' or 'cuda'"));
  }
  if (!is_initialized()) {
    return absl::FailedPreconditionError(
        "init_device_mesh needs the default process group; call init_process_group first");
  }
  if (mesh_shape.empty()) {
    return absl::InvalidArgumentError("init_device_mesh: mesh_shape must have at least one size");
  }
  int64_t total = 1;
  for (int64_t s : mesh_shape) {
    if (s <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("init_device_mesh: mesh_shape ",
                                                     ShapeString(mesh_shape), " has a size ", s,
                                                     "; sizes must be >= 1"));
    }
    total *= s;
  }
  const int world = get_world_size();
  if (total != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("init_device_mesh: mesh_shape ", ShapeString(mesh_shape), " holds ", total,
                     " ranks but the world size is ", world,
                     "; the product of the sizes must equal the world size"));
  }
  if (!mesh_dim_names.empty()) {
    if (mesh_dim_names.size() != mesh_shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_device_mesh: mesh_dim_names ", NamesString(mesh_dim_names), " has ",
          mesh_dim_names.size(), " names for the ", mesh_shape.size(), " dimensions of mesh_shape ",
          ShapeString(mesh_shape), "; give one name per dimension"));
    }
    std::set<std::string> seen;
    for (const std::string& n : mesh_dim_names) {
      if (!seen.insert(n).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("init_device_mesh: mesh_dim_names ", NamesString(mesh_dim_names),
                         " names '", n, "' twice; each dimension needs a unique name"));
      }
    }
  }
  DeviceMesh mesh;
  mesh.device_type_ = device_type;
  mesh.shape_ = std::move(mesh_shape);
  mesh.dim_names_ = std::move(mesh_dim_names);
  mesh.rank_ = get_rank();
  for (int r = 0; r < world; ++r) mesh.ranks_.push_back(r);
  const std::vector<int64_t> strides = Strides(mesh.shape_);
  int64_t rest = mesh.rank_;
  for (int d = 0; d < mesh.ndim(); ++d) {
    mesh.coordinate_.push_back(static_cast<int>(rest / strides[d]));
    rest %= strides[d];
  }
  mesh.groups_.resize(mesh.shape_.size());
  if (mesh.ndim() == 1) {
    EMBER_ASSIGN_OR_RETURN(mesh.groups_[0], get_default_group());
    return mesh;
  }
  for (int d = 0; d < mesh.ndim(); ++d) {
    for (const std::vector<int>& slice : SlicesAlong(mesh.ranks_, mesh.shape_, d)) {
      absl::StatusOr<Group> group = new_group(slice);
      if (!group.ok()) {
        return absl::Status(
            group.status().code(),
            absl::StrCat("init_device_mesh: making the group of dimension ", d, " over ranks [",
                         absl::StrJoin(slice, ", "), "]: ", group.status().message()));
      }
      for (int r : slice) {
        if (r == mesh.rank_) mesh.groups_[d] = *group;
      }
    }
  }
  return mesh;
}

}  // namespace ember::distributed
