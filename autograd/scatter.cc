#include "autograd/scatter.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "tensor/factories.h"
#include "tensor/ops.h"

namespace ember::autograd {
namespace {

// Calls f(flat_position) for each element of `g`, in row-major order.
template <typename F>
void ForEachPosition(const StridedGeometry& g, int64_t base, F&& f) {
  const int64_t n = Numel(g.sizes);
  if (n == 0) return;
  const int64_t nd = static_cast<int64_t>(g.sizes.size());
  SizeVector idx(nd, 0);
  int64_t pos = g.offset - base;
  for (int64_t i = 0; i < n; ++i) {
    f(pos);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < g.sizes[d]) {
        pos += g.strides[d];
        break;
      }
      pos -= (g.sizes[d] - 1) * g.strides[d];
      idx[d] = 0;
    }
  }
}

std::pair<int64_t, int64_t> Extent(const StridedGeometry& g) {
  int64_t hi = g.offset;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 0) return {g.offset, g.offset - 1};
    hi += (g.sizes[d] - 1) * g.strides[d];
  }
  return {g.offset, hi};
}

// The elements of `g` positioned relative to `base`, as an int64 tensor of
// g's shape on `device`.
Tensor Positions(const StridedGeometry& g, int64_t base, Device device) {
  Tensor pos = full({}, g.offset - base, TensorOptions(kInt64).device(device));
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    Tensor along = arange(g.sizes[d], TensorOptions(kInt64).device(device));
    along = ops::binary(BinaryOp::kMul, along,
                        full({}, g.strides[d], TensorOptions(kInt64).device(device)));
    pos = ops::binary(BinaryOp::kAdd, pos.unsqueeze(-1), along);
  }
  return pos;
}

Tensor AsStridedBackwardImpl(const Tensor& grad, const StridedGeometry& input,
                             const StridedGeometry& output, bool by_ops) {
  const TensorOptions options = TensorOptions(grad.dtype()).device(grad.device());
  Tensor result = zeros(input.sizes, options);
  if (result.numel() == 0 || grad.numel() == 0) return result;
  auto [in_lo, in_hi] = Extent(input);
  auto [out_lo, out_hi] = Extent(output);
  const int64_t lo = std::min(in_lo, out_lo), hi = std::max(in_hi, out_hi);
  Tensor buffer = zeros({hi - lo + 1}, options);
  if (!internal::MayOverlapItself(output)) {
    // Each position is read once: putting grad back is a strided copy.
    ops::copy_(buffer.as_strided(output.sizes, output.strides, output.offset - lo), grad);
  } else if (by_ops || !grad.is_cpu()) {
    buffer = internal::IndexAddByMatmul(
        {hi - lo + 1}, 0, Positions(output, lo, grad.device()).reshape({-1}), grad.reshape({-1}));
  } else {
    Tensor g = grad.contiguous();
    VisitFloatingDtype(grad.dtype(), "as_strided backward", [&]<typename T>() {
      T* buf = buffer.data_ptr<T>();
      const T* gp = g.data_ptr<T>();
      int64_t i = 0;
      ForEachPosition(output, lo, [&](int64_t pos) {
        buf[pos] = T(static_cast<OpMath<T>>(buf[pos]) + static_cast<OpMath<T>>(gp[i++]));
      });
    });
  }
  ops::copy_(result, buffer.as_strided(input.sizes, input.strides, input.offset - lo));
  return result;
}

}  // namespace

Tensor AsStridedBackward(const Tensor& grad, const StridedGeometry& input,
                         const StridedGeometry& output) {
  return AsStridedBackwardImpl(grad, input, output, /*by_ops=*/false);
}

Tensor IndexAdd(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad) {
  if (!grad.is_cpu()) return internal::IndexAddByMatmul(sizes, dim, index, grad);
  Tensor result = zeros(sizes, TensorOptions(grad.dtype()));
  if (result.numel() == 0 || grad.numel() == 0) return result;
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const int64_t d = nd == 0 ? 0 : WrapDim(dim, nd, "index_add");
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= sizes[k];
  for (int64_t k = d + 1; k < nd; ++k) inner *= sizes[k];
  const int64_t size_d = nd == 0 ? 1 : sizes[d];
  Tensor idx = index.to(kInt64).to(kCPU).contiguous();
  const int64_t n = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  Tensor g = grad.contiguous();
  VisitFloatingDtype(grad.dtype(), "index_select backward", [&]<typename T>() {
    T* out = result.data_ptr<T>();
    const T* gp = g.data_ptr<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < n; ++i) {
        int64_t target = ip[i] < 0 ? ip[i] + size_d : ip[i];
        T* dst = out + (o * size_d + target) * inner;
        const T* src = gp + (o * n + i) * inner;
        for (int64_t k = 0; k < inner; ++k) {
          dst[k] = T(static_cast<OpMath<T>>(dst[k]) + static_cast<OpMath<T>>(src[k]));
        }
      }
    }
  });
  return result;
}

namespace internal {

Tensor IndexAddByMatmul(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad) {
  EMBER_CHECK(is_floating_point(grad.dtype()), "index_select backward: expected a floating ",
              "gradient, got ", dtype_name(grad.dtype()));
  const TensorOptions options = TensorOptions(grad.dtype()).device(grad.device());
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const int64_t d = nd == 0 ? 0 : WrapDim(dim, nd, "index_add");
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= sizes[k];
  for (int64_t k = d + 1; k < nd; ++k) inner *= sizes[k];
  const int64_t size_d = nd == 0 ? 1 : sizes[d];
  const int64_t n = index.numel();
  if (Numel(sizes) == 0 || n == 0 || grad.numel() == 0) return zeros(sizes, options);
  const TensorOptions long_options = TensorOptions(kInt64).device(grad.device());
  Tensor idx = index.to(kInt64).to(grad.device()).reshape({1, n});
  // Negative indices count from the end, as in the CPU loop.
  idx = ops::where(ops::binary(BinaryOp::kLt, idx, full({}, 0, long_options)),
                   ops::binary(BinaryOp::kAdd, idx, full({}, size_d, long_options)), idx);
  const Tensor rows = arange(size_d, long_options).reshape({size_d, 1});
  const Tensor one_hot = ops::binary(BinaryOp::kEq, rows, idx).to(grad.dtype());  // [size_d, n]
  const Tensor g = grad.contiguous().reshape({outer, n, inner});
  const Tensor r = ops::bmm(one_hot.unsqueeze(0).expand({outer, size_d, n}), g);
  return r.reshape(sizes);
}

Tensor AsStridedBackwardByOps(const Tensor& grad, const StridedGeometry& input,
                              const StridedGeometry& output) {
  return AsStridedBackwardImpl(grad, input, output, /*by_ops=*/true);
}

bool MayOverlapItself(const StridedGeometry& g) {
  // Dims of more than one element, by stride: provably apart when each
  // stride exceeds the span of all the smaller ones.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t k = 0; k < g.sizes.size(); ++k) {
    if (g.sizes[k] == 0) return false;
    if (g.sizes[k] > 1)
      dims.emplace_back(g.strides[k] < 0 ? -g.strides[k] : g.strides[k], g.sizes[k]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // The largest offset the smaller dims reach.
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return true;
    span += (size - 1) * stride;
  }
  return false;
}

}  // namespace internal

}  // namespace ember::autograd
