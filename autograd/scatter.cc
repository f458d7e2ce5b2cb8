#include "autograd/scatter.h"

#include <algorithm>
#include <cstring>
#include <map>
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
    // Positions read, found on the host (geometry only), added on the device.
    std::vector<int64_t> positions;
    positions.reserve(static_cast<size_t>(grad.numel()));
    ForEachPosition(output, lo, [&](int64_t pos) { positions.push_back(pos); });
    buffer = internal::IndexAddByGather({hi - lo + 1}, 0, tensor(positions), grad.reshape({-1}));
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
  if (!grad.is_cpu()) return internal::IndexAddByGather(sizes, dim, index, grad);
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

Tensor IndexAddByGather(IntArrayRef sizes, int64_t dim, const Tensor& index, const Tensor& grad) {
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
  // Which sources each target sums (Note [Scatter-adds from gathers] in
  // scatter.h), grouped on the host: a device index is copied here once.
  const Tensor host_index = index.to(kInt64).to(kCPU).contiguous();
  const int64_t* ip = host_index.data_ptr<int64_t>();
  std::vector<int64_t> target(n), first(size_d + 1, 0), sources(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = ip[i] < 0 ? ip[i] + size_d : ip[i];
    EMBER_CHECK(t >= 0 && t < size_d, "index_select backward: index ", ip[i],
                " is out of bounds for dimension ", d, " with size ", size_d);
    target[i] = t;
    ++first[t + 1];
  }
  for (int64_t t = 0; t < size_d; ++t) first[t + 1] += first[t];
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < n; ++i) sources[fill[target[i]]++] = i;
  // Targets by group length rounded up to a power of two.
  std::map<int64_t, std::vector<int64_t>> buckets;
  for (int64_t t = 0; t < size_d; ++t) {
    const int64_t len = first[t + 1] - first[t];
    if (len == 0) continue;
    int64_t padded = 1;
    while (padded < len) padded *= 2;
    buckets[padded].push_back(t);
  }
  // grad as [outer, n, inner] with a zero slice at n for the padding.
  const Tensor g =
      ops::cat({grad.reshape({outer, n, inner}), zeros({outer, 1, inner}, options)}, 1);
  std::vector<Tensor> sums;
  std::vector<int64_t> slot_of(size_d, -1);
  int64_t slots = 0;
  for (const auto& [padded, targets] : buckets) {
    const int64_t count = static_cast<int64_t>(targets.size());
    std::vector<int64_t> gather(static_cast<size_t>(count * padded), n);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t t = targets[k];
      for (int64_t j = first[t]; j < first[t + 1]; ++j)
        gather[k * padded + (j - first[t])] = sources[j];
      slot_of[t] = slots + k;
    }
    const Tensor picked = ops::index_select(g, 1, tensor(gather).to(grad.device()));
    sums.push_back(ops::reduce(ReduceOp::kSum, picked.view({outer, count, padded, inner}), {2},
                               /*keepdim=*/false, std::nullopt));
    slots += count;
  }
  sums.push_back(zeros({outer, 1, inner}, options));  // Slot `slots`: targets nothing reaches.
  for (int64_t& s : slot_of) {
    if (s < 0) s = slots;
  }
  const Tensor all = ops::cat(sums, 1);
  return ops::index_select(all, 1, tensor(slot_of).to(grad.device())).reshape(sizes);
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
