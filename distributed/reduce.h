// Elementwise reduction kernels of the CPU backends (tcp; gloo and mpi for
// the dtypes they cannot reduce themselves), acc[i] = op(acc[i], in[i])
// (ReduceInto) and out[i] = op(a[i], b[i]) (ReduceTo), for every dtype and
// ReduceOp in a fixed order (so the same inputs give the same bits), plus the
// AVG division.
//
//   ReduceInto(ReduceOp::kSum, kFloat32, acc, incoming, n);
//
// 16-bit floats are combined in float and rounded once per step, as PyTorch's
// CPU kernels do. Bool: SUM/MAX are "or", PRODUCT/MIN are "and". AVG reduces
// as SUM; DivideBy then divides (floating dtypes only). SegmentOf is how the
// algorithms split a buffer among ranks. Pure; thread-safe.
#ifndef EMBER_DISTRIBUTED_REDUCE_H_
#define EMBER_DISTRIBUTED_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "distributed/process_group.h"
#include "tensor/dtype.h"

namespace ember::distributed {

void ReduceInto(ReduceOp op, Dtype dtype, void* acc, const void* in, int64_t n);
// out[i] = op(a[i], b[i]), with the same rules; `out` overlaps neither input.
void ReduceTo(ReduceOp op, Dtype dtype, void* out, const void* a, const void* b, int64_t n);
void DivideBy(Dtype dtype, void* data, int64_t n, int64_t divisor);

// Part i (mod n) of a buffer of `numel` elements of `elem` bytes, when it is
// split into n nearly equal parts: its byte offset and length.
struct Segment {
  size_t offset;
  size_t nbytes;
};
inline Segment SegmentOf(int i, int n, int64_t numel, size_t elem) {
  i = ((i % n) + n) % n;
  const int64_t begin = numel * i / n, end = numel * (i + 1) / n;
  return {static_cast<size_t>(begin) * elem, static_cast<size_t>(end - begin) * elem};
}

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_REDUCE_H_
