#include "cuda/nccl_dtype.h"

#include "gtest/gtest.h"

namespace ember::cuda {
namespace {

TEST(NcclTypeTest, EveryDtypeNcclHasMapsToItsOwnType) {
  EXPECT_EQ(nccl_type(kFloat32), ncclFloat32);
  EXPECT_EQ(nccl_type(kFloat64), ncclFloat64);
  EXPECT_EQ(nccl_type(kFloat16), ncclFloat16);
  EXPECT_EQ(nccl_type(kBFloat16), ncclBfloat16);
  EXPECT_EQ(nccl_type(kInt64), ncclInt64);
  EXPECT_EQ(nccl_type(kInt32), ncclInt32);
  EXPECT_EQ(nccl_type(kInt8), ncclInt8);
  EXPECT_EQ(nccl_type(kUInt8), ncclUint8);
}

TEST(NcclTypeTest, BoolTravelsAsBytesAndInt16HasNoType) {
  EXPECT_EQ(nccl_type(kBool), ncclUint8);
  EXPECT_FALSE(nccl_type(kInt16).has_value());
}

TEST(NcclTypeTest, EachTypeHasTheDtypesElementSize) {
  for (Dtype dtype : kAllDtypes) {
    const std::optional<ncclDataType_t> type = nccl_type(dtype);
    if (!type) continue;
    size_t bytes = 0;
    switch (*type) {
      case ncclInt8:
      case ncclUint8:
        bytes = 1;
        break;
      case ncclFloat16:
      case ncclBfloat16:
        bytes = 2;
        break;
      case ncclInt32:
      case ncclUint32:
      case ncclFloat32:
        bytes = 4;
        break;
      case ncclInt64:
      case ncclUint64:
      case ncclFloat64:
        bytes = 8;
        break;
      default:
        ADD_FAILURE() << dtype_name(dtype) << " maps to NCCL type " << static_cast<int>(*type);
    }
    EXPECT_EQ(bytes, element_size(dtype)) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace ember::cuda
