// Scatter-adds: the gradients of ops that gather (as_strided, index_select,
// masked_select) put each incoming element back where it was read from,
// adding where one element was read more than once. The tensor core has no
// such op, so these run here, on CPU tensors of a floating dtype.
//
//   // grad of x.index_select(0, idx): zeros of x's shape, rows added back.
//   Tensor gx = ember::autograd::IndexAdd(x.sizes(), 0, idx, grad);
//
// These are not recorded by autograd; their recorded forms, for double
// backward, are StridedScatter (variable.h) and the index_add node in
// derivatives.cc. Pure functions; thread-safe. Bad arguments throw ember::Error.
#ifndef EMBER_AUTOGRAD_SCATTER_H_
#define EMBER_AUTOGRAD_SCATTER_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace ember::autograd {

// Geometry of a strided tensor within its storage, in elements.
struct StridedGeometry {
  SizeVector sizes;
  SizeVector strides;
  int64_t offset = 0;

  static StridedGeometry Of(const Tensor& t) {
    return {SizeVector(t.sizes().begin(), t.sizes().end()),
            SizeVector(t.strides().begin(), t.strides().end()), t.storage_offset()};
  }
};

// Gradient of `input.as_strided(output)` with respect to `input` (both
// geometries in one storage): each element of `grad` (shaped as `output`) is
// added at the storage position it was read from, and the result is read
// back through `input`'s geometry. `input` must not overlap itself.
Tensor AsStridedBackward(const Tensor& grad, const StridedGeometry& input,
                         const StridedGeometry& output);

// A tensor of `sizes` and grad's dtype, zero except that slice `index[i]`
// along `dim` receives the sum of slices i of `grad` (torch's
// index_add on zeros).
Tensor IndexAdd(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad);

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_SCATTER_H_
