// CPU kernel of index_select_out (masked_fill_, masked_select and cat are
// composite: tensor/indexing.cc). The composite has checked dtypes and
// shapes; the index values are data, so they are checked here:
// "index_select: index 7 is out of bounds for dimension 0 with size 3".
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/ops.h"

namespace ember::cpu {
namespace {

// out[..., i, ...] = self[..., index[i], ...] along `dim`, for a contiguous
// `self` and `out` seen as [outer, size, inner] and [outer, n, inner].
void GatherRows(const Tensor& out, const Tensor& self, int64_t dim,
                const std::vector<int64_t>& idx) {
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t size = self.sizes()[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < dim; ++k) outer *= self.sizes()[k];
  for (int64_t k = dim + 1; k < self.dim(); ++k) inner *= self.sizes()[k];
  const char* src = static_cast<const char*>(self.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const int64_t grain = std::max<int64_t>(1, kDefaultGrainSize / std::max<int64_t>(inner, 1));
  if (inner == 1) {  // One element per row: typed copies, no memcpy calls.
    VisitDtype(self.dtype(), [&]<typename T>() {
      const T* s = reinterpret_cast<const T*>(src);
      T* o = reinterpret_cast<T*>(dst);
      parallel_for(0, outer * n, grain, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) o[j] = s[(j / n) * size + idx[j % n]];
      });
    });
    return;
  }
  const size_t row = static_cast<size_t>(inner) * self.element_size();
  parallel_for(0, outer * n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      std::memcpy(dst + j * row, src + ((j / n) * size + idx[j % n]) * row, row);
    }
  });
}

void IndexSelectOut(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  const int64_t n = index.numel();
  const int64_t size = self.dim() == 0 ? 1 : self.sizes()[dim];
  std::vector<int64_t> idx(n);
  Tensor index_c = index.contiguous();
  VisitDtype(index_c.dtype(), [&]<typename I>() {
    if constexpr (std::is_same_v<I, int64_t> || std::is_same_v<I, int32_t>) {
      const I* p = static_cast<const I*>(index_c.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = static_cast<int64_t>(p[i]);
        EMBER_CHECK(v >= 0 && v < size, "index_select: index ", v,
                    " is out of bounds for dimension ", dim, " with size ", size);
        idx[i] = v;
      }
    } else {
      EMBER_FAIL("index_select: expected an int64 or int32 index, got dtype ",
                 dtype_name(index_c.dtype()));
    }
  });
  if (out.numel() == 0) return;
  if (self.dim() == 0) {
    ops::copy_out(out, self);
    return;
  }
  // Rows to copy: one slice of `self` per index entry.
  const int64_t slice = self.numel() / std::max<int64_t>(size, 1);
  if (out.is_contiguous() && self.is_contiguous()) {
    GatherRows(out, self, dim, idx);
  } else if (out.is_contiguous() && self.numel() <= n * std::max<int64_t>(slice, 1024)) {
    // Cheaper to make `self` contiguous than to copy slice by slice.
    GatherRows(out, self.contiguous(), dim, idx);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      ops::copy_out(out.select(dim, i), self.select(dim, idx[i]));
    }
  }
}

EMBER_REGISTER_KERNEL(index_select_out, kCPU, &IndexSelectOut);

}  // namespace
}  // namespace ember::cpu
