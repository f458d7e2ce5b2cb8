// Scatter-adds: the gradients of ops that gather (as_strided, index_select,
// masked_select) put each incoming element back where it was read from,
// adding where one element was read more than once. The tensor core has no
// such op, so these are built here, for tensors of a floating dtype on any
// device: on the CPU by direct loops; elsewhere from ops every device
// backend has (Note [Scatter-adds from gathers]), so that CUDA gradients
// stay on their device. The result is on grad's device.
//
//   // grad of x.index_select(0, idx): zeros of x's shape, rows added back.
//   Tensor gx = ember::autograd::IndexAdd(x.sizes(), 0, idx, grad);
//
// Note [Scatter-adds from gathers]
// Off the CPU a scatter-add is turned into gathers (index_select), sums and
// copies: the index is read on the host (one device-to-host copy when it
// lives on the device), the sources of each target grouped, and the groups
// bucketed by length rounded up to a power of two. Each bucket is one gather
// of grad (padded with a zero slice) shaped [targets, length] and one sum
// over the length; a last gather puts every target's sum (or zero) in place.
// Work and memory are O(n + size) slices (at most twice the sources, from
// the padding), deterministic (fixed order of adds), and no
// size-by-n matrix is ever formed.
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
// Where one storage position is read at most once (`output` does not
// overlap itself), this is a strided copy; otherwise adds are needed (the CPU
// loop, or IndexAdd's device path over the positions read).
Tensor AsStridedBackward(const Tensor& grad, const StridedGeometry& input,
                         const StridedGeometry& output);

// A tensor of `sizes` and grad's dtype, zero except that slice `index[i]`
// along `dim` receives the sum of slices i of `grad` (torch's
// index_add on zeros).
Tensor IndexAdd(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad);

namespace internal {
// IndexAdd's device-generic path (Note [Scatter-adds from gathers]; used for
// every device but the CPU, callable on the CPU for tests). An index out of
// [-size, size) throws, naming it.
Tensor IndexAddByGather(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad);
// AsStridedBackward by the device-generic path only (what non-CPU devices
// run; callable on the CPU for tests).
Tensor AsStridedBackwardByOps(const Tensor& grad, const StridedGeometry& input,
                              const StridedGeometry& output);
// Whether two elements of `g` may share a storage position (false only
// when provably not).
bool MayOverlapItself(const StridedGeometry& g);
}  // namespace internal

}  // namespace ember::autograd

#endif  // EMBER_AUTOGRAD_SCATTER_H_
