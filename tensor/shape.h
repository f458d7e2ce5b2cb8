// Shape arithmetic shared by every op: sizes, strides, broadcasting and dim
// wrapping, with PyTorch's error messages.
//
//   ```cpp
//   #include "tensor/shape.h"
//   ember::SizeVector s = ember::BroadcastShapes({2, 1, 3}, {4, 1}, "add");
//   // s == {2, 4, 3}
//   int64_t d = ember::WrapDim(-1, 3, "sum");  // 2
//   if (s[1] != 4 || d != 2) return absl::InternalError("unexpected shape arithmetic");
//   ```
//
// Pure functions; thread-safe. Errors throw ember::Error.
#ifndef EMBER_TENSOR_SHAPE_H_
#define EMBER_TENSOR_SHAPE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace ember {

// Most tensors have few dims; keep them inline.
using SizeVector = absl::InlinedVector<int64_t, 6>;
using IntArrayRef = absl::Span<const int64_t>;

// Product of sizes (1 for a 0-dim shape).
int64_t Numel(IntArrayRef sizes);
// Row-major strides for `sizes`.
SizeVector ContiguousStrides(IntArrayRef sizes);
// "[2, 3]".
std::string ShapeToString(IntArrayRef sizes);

// Maps a possibly negative `dim` into [0, ndim) (a 0-dim tensor accepts -1
// and 0). Throws "<op>: dimension out of range (expected to be in range of
// [-2, 1], but got 5)".
int64_t WrapDim(int64_t dim, int64_t ndim, const char* op);
// Wraps each dim and checks none repeats; returns a bitmask-free sorted copy.
SizeVector WrapDims(IntArrayRef dims, int64_t ndim, const char* op);

// NumPy broadcasting as torch documents it: align trailing dims; each pair
// must be equal or one of them 1. Throws "<op>: shapes [2, 3] and [4] are not
// broadcastable".
SizeVector BroadcastShapes(IntArrayRef a, IntArrayRef b, const char* op);

// The geometry of `sizes`/`strides` read as `target` (torch's expand rule:
// new leading dims and size-1 dims get stride 0, -1 keeps a size). Throws
// "expand: ..." naming the first dim that cannot be expanded.
struct ExpandedGeometry {
  SizeVector sizes;
  SizeVector strides;
};
ExpandedGeometry ExpandGeometry(IntArrayRef sizes, IntArrayRef strides, IntArrayRef target);

// Resolves one -1 in `shape` for `numel` elements (view/reshape); throws
// "<op>: shape '[2, -1]' is invalid for input of size 7".
SizeVector InferSize(IntArrayRef shape, int64_t numel, const char* op);

// How a BLAS GEMM sees one rows x cols matrix with element strides (rs, cs):
// row-major (element (i, j) at i*ld + j) or column-major (at i + j*ld), or
// nullopt when neither describes it (the caller copies it first). Shared by
// the CPU (OpenBLAS) and CUDA (cuBLAS) gemm kernels.
struct BlasMatrixLayout {
  bool row_major;
  int64_t ld;
};
std::optional<BlasMatrixLayout> GetBlasMatrixLayout(int64_t rows, int64_t cols, int64_t rs,
                                                    int64_t cs);

// Strides that let a tensor of `sizes`/`strides` be viewed as `new_sizes`
// without copying, or nullopt when its memory layout does not allow it
// (torch's view vs reshape rule).
std::optional<SizeVector> ComputeViewStrides(IntArrayRef sizes, IntArrayRef strides,
                                             IntArrayRef new_sizes);

}  // namespace ember

#endif  // EMBER_TENSOR_SHAPE_H_
