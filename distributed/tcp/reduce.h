// Elementwise reduction kernels of the tcp backend: acc[i] = op(acc[i], in[i])
// for every dtype and ReduceOp, in a fixed order (so the same inputs give the
// same bits), plus the AVG division.
//
//   ReduceInto(ReduceOp::kSum, kFloat32, acc, incoming, n);
//
// 16-bit floats are combined in float and rounded once per step, as PyTorch's
// CPU kernels do. Bool: SUM/MAX are "or", PRODUCT/MIN are "and". AVG reduces
// as SUM; DivideBy then divides (floating dtypes only). Pure; thread-safe.
#ifndef EMBER_DISTRIBUTED_TCP_REDUCE_H_
#define EMBER_DISTRIBUTED_TCP_REDUCE_H_

#include <cstdint>

#include "distributed/process_group.h"
#include "tensor/dtype.h"

namespace ember::distributed::tcp {

void ReduceInto(ReduceOp op, Dtype dtype, void* acc, const void* in, int64_t n);
void DivideBy(Dtype dtype, void* data, int64_t n, int64_t divisor);

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_REDUCE_H_
