#include "cuda/nccl_dtype.h"

namespace ember::cuda {

std::optional<ncclDataType_t> nccl_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32:
      return ncclFloat32;
    case Dtype::kFloat64:
      return ncclFloat64;
    case Dtype::kFloat16:
      return ncclFloat16;
    case Dtype::kBFloat16:
      return ncclBfloat16;
    case Dtype::kInt64:
      return ncclInt64;
    case Dtype::kInt32:
      return ncclInt32;
    case Dtype::kInt8:
      return ncclInt8;
    case Dtype::kUInt8:
    case Dtype::kBool:
      return ncclUint8;
    case Dtype::kInt16:
      break;
  }
  return std::nullopt;
}

}  // namespace ember::cuda
