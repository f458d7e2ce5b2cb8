// Ember's dtypes as NCCL's element types: the one table that every user of
// NCCL in Ember (the nccl process-group backend, parallel/'s transport
// between the GPUs of one process) maps tensors through.
//
//   std::optional<ncclDataType_t> type = ember::cuda::nccl_type(ember::kBFloat16);
//   // *type == ncclBfloat16; nccl_type(ember::kInt16) has no value.
//
// Thread-safe.
#ifndef EMBER_CUDA_NCCL_DTYPE_H_
#define EMBER_CUDA_NCCL_DTYPE_H_

#include <nccl.h>

#include <optional>

#include "tensor/dtype.h"

namespace ember::cuda {

// NCCL's type for `dtype`, element for element; bool is uint8 (so NCCL's
// sums of bools are byte sums, not "or": callers that reduce pick their
// reduction for bool). None for a dtype NCCL has no type for (int16), which
// can still travel as bytes where nothing is reduced.
std::optional<ncclDataType_t> nccl_type(Dtype dtype);

}  // namespace ember::cuda

#endif  // EMBER_CUDA_NCCL_DTYPE_H_
