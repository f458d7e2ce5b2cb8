// Composite kernels of the view ops (tensor/ops.inc): each returns a new
// TensorImpl over the same storage, sharing the version counter, so in-place
// writes through any view are seen by all and counted once, and naming its
// base (Note [View tracking] in tensor.h).
#include <algorithm>
#include <numeric>

#include "tensor/ops.h"

namespace ember {
namespace {

// Every view op's output: shares storage and version counter, and knows its
// base (Note [View tracking] in tensor.h).
Tensor MakeView(const Tensor& self, IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  auto impl = MakeTensorImpl(self.storage(), self.dtype(), sizes, strides, offset);
  impl->set_version_counter(self.impl()->version_counter());
  impl->set_view_of(self.impl_ptr(), internal::tls_grad_mode);
  return Tensor(std::move(impl));
}

Tensor View(const Tensor& self, IntArrayRef sizes) {
  SizeVector shape = InferSize(sizes, self.numel(), "view");
  std::optional<SizeVector> strides = ComputeViewStrides(self.sizes(), self.strides(), shape);
  EMBER_CHECK(strides.has_value(), "view: size ", ShapeToString(shape),
              " is not compatible with input tensor's size ", ShapeToString(self.sizes()),
              " and stride ", ShapeToString(self.strides()),
              " (at least one dimension spans across two contiguous subspaces); use "
              "reshape(...) instead");
  return MakeView(self, shape, *strides, self.storage_offset());
}

Tensor AsStrided(const Tensor& self, IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  EMBER_CHECK(sizes.size() == strides.size(), "as_strided: got ", sizes.size(), " sizes but ",
              strides.size(), " strides");
  EMBER_CHECK(offset >= 0, "as_strided: negative storage offset ", offset);
  int64_t max_index = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    EMBER_CHECK(sizes[d] >= 0 && strides[d] >= 0, "as_strided: sizes ", ShapeToString(sizes),
                " and strides ", ShapeToString(strides), " must be non-negative");
    if (sizes[d] == 0) max_index = -1;
    if (max_index >= 0) max_index += (sizes[d] - 1) * strides[d];
  }
  if (max_index >= 0) {
    int64_t needed = (offset + max_index + 1) * static_cast<int64_t>(self.element_size());
    EMBER_CHECK(needed <= static_cast<int64_t>(self.storage().nbytes()), "as_strided: sizes ",
                ShapeToString(sizes), ", strides ", ShapeToString(strides), " and offset ", offset,
                " need ", needed, " bytes but the storage holds ", self.storage().nbytes());
  }
  return MakeView(self, sizes, strides, offset);
}

Tensor Transpose(const Tensor& self, int64_t d0, int64_t d1) {
  int64_t a = WrapDim(d0, self.dim(), "transpose"), b = WrapDim(d1, self.dim(), "transpose");
  if (self.dim() == 0) return MakeView(self, {}, {}, self.storage_offset());
  SizeVector sizes(self.sizes().begin(), self.sizes().end());
  SizeVector strides(self.strides().begin(), self.strides().end());
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  return MakeView(self, sizes, strides, self.storage_offset());
}

Tensor Permute(const Tensor& self, IntArrayRef dims) {
  EMBER_CHECK(static_cast<int64_t>(dims.size()) == self.dim(), "permute: number of dims ",
              ShapeToString(dims), " don't match the tensor's ", self.dim(), " dims");
  SizeVector sizes(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = WrapDim(dims[i], self.dim(), "permute");
    EMBER_CHECK(!seen[d], "permute: repeated dim ", d, " in ", ShapeToString(dims));
    seen[d] = true;
    sizes[i] = self.sizes()[d];
    strides[i] = self.strides()[d];
  }
  return MakeView(self, sizes, strides, self.storage_offset());
}

// Bounds already normalised by Tensor::slice / narrow: 0 <= start <= end <= size.
Tensor Slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) {
  int64_t d = WrapDim(dim, self.dim(), "slice");
  EMBER_CHECK(step > 0, "slice: step must be positive, got ", step);
  EMBER_CHECK(0 <= start && start <= end && end <= self.sizes()[d], "slice: range [", start, ", ",
              end, ") is out of bounds for dimension ", d, " of size ", self.sizes()[d]);
  SizeVector sizes(self.sizes().begin(), self.sizes().end());
  SizeVector strides(self.strides().begin(), self.strides().end());
  sizes[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return MakeView(self, sizes, strides, self.storage_offset() + start * self.strides()[d]);
}

Tensor Select(const Tensor& self, int64_t dim, int64_t index) {
  EMBER_CHECK(self.dim() > 0, "select: cannot be applied to a 0-dim tensor");
  int64_t d = WrapDim(dim, self.dim(), "select");
  int64_t n = self.sizes()[d];
  EMBER_CHECK(index >= -n && index < n, "select: index ", index, " is out of bounds for dimension ",
              d, " with size ", n);
  if (index < 0) index += n;
  SizeVector sizes(self.sizes().begin(), self.sizes().end());
  SizeVector strides(self.strides().begin(), self.strides().end());
  int64_t offset = self.storage_offset() + index * strides[d];
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return MakeView(self, sizes, strides, offset);
}

Tensor Expand(const Tensor& self, IntArrayRef sizes) {
  ExpandedGeometry g = ExpandGeometry(self.sizes(), self.strides(), sizes);
  return MakeView(self, g.sizes, g.strides, self.storage_offset());
}

Tensor Squeeze(const Tensor& self, std::optional<int64_t> dim) {
  SizeVector sizes, strides;
  std::optional<int64_t> only;
  if (dim) only = WrapDim(*dim, self.dim(), "squeeze");
  for (int64_t d = 0; d < self.dim(); ++d) {
    bool drop = self.sizes()[d] == 1 && (!only || *only == d);
    if (drop) continue;
    sizes.push_back(self.sizes()[d]);
    strides.push_back(self.strides()[d]);
  }
  return MakeView(self, sizes, strides, self.storage_offset());
}

Tensor Unsqueeze(const Tensor& self, int64_t dim) {
  int64_t d = WrapDim(dim, self.dim() + 1, "unsqueeze");
  SizeVector sizes(self.sizes().begin(), self.sizes().end());
  SizeVector strides(self.strides().begin(), self.strides().end());
  int64_t stride = d < self.dim() ? sizes[d] * strides[d] : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return MakeView(self, sizes, strides, self.storage_offset());
}

EMBER_REGISTER_KERNEL(view, kComposite, &View);
EMBER_REGISTER_KERNEL(as_strided, kComposite, &AsStrided);
EMBER_REGISTER_KERNEL(transpose, kComposite, &Transpose);
EMBER_REGISTER_KERNEL(permute, kComposite, &Permute);
EMBER_REGISTER_KERNEL(slice, kComposite, &Slice);
EMBER_REGISTER_KERNEL(select, kComposite, &Select);
EMBER_REGISTER_KERNEL(expand, kComposite, &Expand);
EMBER_REGISTER_KERNEL(squeeze, kComposite, &Squeeze);
EMBER_REGISTER_KERNEL(unsqueeze, kComposite, &Unsqueeze);

}  // namespace
}  // namespace ember
