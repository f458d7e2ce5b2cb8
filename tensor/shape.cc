#include "tensor/shape.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace ember {

int64_t Numel(IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

SizeVector ContiguousStrides(IntArrayRef sizes) {
  SizeVector strides(sizes.size());
  int64_t stride = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

std::string ShapeToString(IntArrayRef sizes) { return "[" + absl::StrJoin(sizes, ", ") + "]"; }

int64_t WrapDim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  EMBER_CHECK(dim >= -n && dim < n, op, ": dimension out of range (expected to be in range of [",
              -n, ", ", n - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

SizeVector WrapDims(IntArrayRef dims, int64_t ndim, const char* op) {
  SizeVector out;
  for (int64_t d : dims) {
    int64_t w = WrapDim(d, ndim, op);
    EMBER_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", w,
                " appears multiple times in the list of dims ", ShapeToString(dims));
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

SizeVector BroadcastShapes(IntArrayRef a, IntArrayRef b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  SizeVector out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EMBER_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", ShapeToString(a), " and ",
                ShapeToString(b), " are not broadcastable (size ", da, " vs ", db, " at dim ", i,
                ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

ExpandedGeometry ExpandGeometry(IntArrayRef sizes, IntArrayRef strides, IntArrayRef target) {
  const int64_t nd = static_cast<int64_t>(target.size());
  const int64_t have_nd = static_cast<int64_t>(sizes.size());
  EMBER_CHECK(nd >= have_nd, "expand: the number of sizes provided (", nd,
              ") must be greater or equal to the number of dimensions in the tensor (", have_nd,
              ")");
  ExpandedGeometry out{SizeVector(nd), SizeVector(nd)};
  for (int64_t i = nd - 1; i >= 0; --i) {
    const int64_t j = i - (nd - have_nd);
    int64_t want = target[i];
    if (j < 0) {
      EMBER_CHECK(want >= 0, "expand: the expanded size ", want,
                  " is not allowed in a leading, non-existing dimension ", i);
      out.sizes[i] = want;
      out.strides[i] = 0;
      continue;
    }
    const int64_t have = sizes[j];
    if (want == -1) want = have;
    EMBER_CHECK(have == want || have == 1, "expand: the expanded size of the tensor (", want,
                ") must match the existing size (", have, ") at non-singleton dimension ", i,
                ".  Target sizes: ", ShapeToString(target),
                ".  Tensor sizes: ", ShapeToString(sizes));
    out.sizes[i] = want;
    out.strides[i] = have == want ? strides[j] : 0;
  }
  return out;
}

SizeVector InferSize(IntArrayRef shape, int64_t numel, const char* op) {
  SizeVector out(shape.begin(), shape.end());
  int64_t known = 1;
  int64_t infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      EMBER_CHECK(infer < 0, op, ": only one dimension can be inferred in shape ",
                  ShapeToString(shape));
      infer = static_cast<int64_t>(i);
    } else {
      EMBER_CHECK(out[i] >= 0, op, ": invalid shape dimension ", out[i], " in ",
                  ShapeToString(shape));
      known *= out[i];
    }
  }
  bool ok = infer >= 0 ? (known != 0 && numel % known == 0) : known == numel;
  EMBER_CHECK(ok, op, ": shape '", ShapeToString(shape), "' is invalid for input of size ", numel);
  if (infer >= 0) out[infer] = numel / known;
  return out;
}

std::optional<SizeVector> ComputeViewStrides(IntArrayRef sizes, IntArrayRef strides,
                                             IntArrayRef new_sizes) {
  SizeVector new_strides(new_sizes.size());
  if (sizes.empty()) {  // A 0-dim tensor: every new dim has stride 1.
    for (auto& s : new_strides) s = 1;
    return new_strides;
  }
  int64_t numel = Numel(sizes);
  if (numel == 0) {
    if (sizes == new_sizes) return SizeVector(strides.begin(), strides.end());
    return ContiguousStrides(new_sizes);
  }
  // Walk old dims in chunks that are contiguous among themselves; each chunk
  // must be covered exactly by a run of new dims.
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= sizes[tensor_d];
    if (tensor_d == 0 ||
        (sizes[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

std::optional<BlasMatrixLayout> GetBlasMatrixLayout(int64_t rows, int64_t cols, int64_t rs,
                                                    int64_t cs) {
  const int64_t min_row_ld = std::max<int64_t>(cols, 1);
  const int64_t min_col_ld = std::max<int64_t>(rows, 1);
  if (cs == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? min_row_ld : rs;
    if (ld >= min_row_ld) return BlasMatrixLayout{true, ld};
  }
  if (rs == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? min_col_ld : cs;
    if (ld >= min_col_ld) return BlasMatrixLayout{false, ld};
  }
  return std::nullopt;
}

}  // namespace ember
