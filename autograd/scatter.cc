#include "autograd/scatter.h"

#include <algorithm>
#include <cstring>

#include "tensor/factories.h"

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

}  // namespace

Tensor AsStridedBackward(const Tensor& grad, const StridedGeometry& input,
                         const StridedGeometry& output) {
  EMBER_CHECK(grad.is_cpu(), "as_strided backward: only CPU gradients are supported, got ",
              grad.device().str());
  Tensor result = zeros(input.sizes, TensorOptions(grad.dtype()));
  if (result.numel() == 0 || grad.numel() == 0) return result;
  auto [in_lo, in_hi] = Extent(input);
  auto [out_lo, out_hi] = Extent(output);
  const int64_t lo = std::min(in_lo, out_lo), hi = std::max(in_hi, out_hi);
  Tensor buffer = zeros({hi - lo + 1}, TensorOptions(grad.dtype()));
  Tensor g = grad.contiguous();
  VisitFloatingDtype(grad.dtype(), "as_strided backward", [&]<typename T>() {
    T* buf = buffer.data_ptr<T>();
    const T* gp = g.data_ptr<T>();
    int64_t i = 0;
    ForEachPosition(output, lo, [&](int64_t pos) {
      buf[pos] = T(static_cast<OpMath<T>>(buf[pos]) + static_cast<OpMath<T>>(gp[i++]));
    });
    T* out = result.data_ptr<T>();
    int64_t j = 0;
    ForEachPosition(input, lo, [&](int64_t pos) { out[j++] = buf[pos]; });
  });
  return result;
}

Tensor IndexAdd(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad) {
  EMBER_CHECK(grad.is_cpu() && index.is_cpu(),
              "index_select backward: only CPU tensors are supported");
  Tensor result = zeros(sizes, TensorOptions(grad.dtype()));
  if (result.numel() == 0 || grad.numel() == 0) return result;
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const int64_t d = nd == 0 ? 0 : WrapDim(dim, nd, "index_add");
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= sizes[k];
  for (int64_t k = d + 1; k < nd; ++k) inner *= sizes[k];
  const int64_t size_d = nd == 0 ? 1 : sizes[d];
  Tensor idx = index.to(kInt64).contiguous();
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

}  // namespace ember::autograd
