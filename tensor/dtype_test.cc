// Type promotion against torch.promote_types / torch.result_type answers
// (values from PyTorch's documentation and its promotion table).
#include "tensor/dtype.h"

#include "gtest/gtest.h"
#include "tensor/half.h"

namespace ember {
namespace {

TEST(DtypeTest, ElementSizesAndNames) {
  EXPECT_EQ(element_size(kFloat32), 4u);
  EXPECT_EQ(element_size(kFloat64), 8u);
  EXPECT_EQ(element_size(kFloat16), 2u);
  EXPECT_EQ(element_size(kBFloat16), 2u);
  EXPECT_EQ(element_size(kInt64), 8u);
  EXPECT_EQ(element_size(kInt32), 4u);
  EXPECT_EQ(element_size(kInt16), 2u);
  EXPECT_EQ(element_size(kInt8), 1u);
  EXPECT_EQ(element_size(kUInt8), 1u);
  EXPECT_EQ(element_size(kBool), 1u);
  EXPECT_EQ(dtype_name(kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(kUInt8), "uint8");
  for (Dtype d : kAllDtypes) {
    EXPECT_EQ(element_size(d), VisitDtype(d, []<typename T>() { return sizeof(T); }));
  }
}

TEST(DtypeTest, Categories) {
  EXPECT_TRUE(is_floating_point(kBFloat16));
  EXPECT_FALSE(is_floating_point(kInt64));
  EXPECT_TRUE(is_integral(kUInt8));
  EXPECT_FALSE(is_integral(kBool));
  EXPECT_TRUE(is_integral(kBool, /*include_bool=*/true));
}

TEST(DtypeTest, PromoteTypesMatchesTorch) {
  EXPECT_EQ(promote_types(kUInt8, kInt8), kInt16);
  EXPECT_EQ(promote_types(kInt8, kUInt8), kInt16);
  EXPECT_EQ(promote_types(kUInt8, kInt32), kInt32);
  EXPECT_EQ(promote_types(kFloat16, kBFloat16), kFloat32);
  EXPECT_EQ(promote_types(kInt64, kFloat16), kFloat16);
  EXPECT_EQ(promote_types(kBool, kInt8), kInt8);
  EXPECT_EQ(promote_types(kBool, kBool), kBool);
  EXPECT_EQ(promote_types(kInt32, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kFloat32, kFloat64), kFloat64);
  EXPECT_EQ(promote_types(kBFloat16, kInt64), kBFloat16);
  // Symmetric and idempotent for every pair.
  for (Dtype a : kAllDtypes) {
    EXPECT_EQ(promote_types(a, a), a);
    for (Dtype b : kAllDtypes) EXPECT_EQ(promote_types(a, b), promote_types(b, a));
  }
}

TEST(DtypeTest, ResultTypeRanksTensorsAboveNumbers) {
  {  // int32 tensor + 2.5 -> float32 (default dtype), not float64.
    ResultTypeState s;
    s.AddTensor(kInt32, false);
    s.AddScalar(kFloat64);
    EXPECT_EQ(s.Result(), kFloat32);
  }
  {  // float16 tensor + 2.5 -> float16.
    ResultTypeState s;
    s.AddTensor(kFloat16, false);
    s.AddScalar(kFloat64);
    EXPECT_EQ(s.Result(), kFloat16);
  }
  {  // int8 tensor + 1000 -> int8 (same category: tensor wins).
    ResultTypeState s;
    s.AddTensor(kInt8, false);
    s.AddScalar(kInt64);
    EXPECT_EQ(s.Result(), kInt8);
  }
  {  // bool tensor + 1 -> int64.
    ResultTypeState s;
    s.AddTensor(kBool, false);
    s.AddScalar(kInt64);
    EXPECT_EQ(s.Result(), kInt64);
  }
  {  // int32 tensor [3] + float64 0-dim tensor -> float64? No: the 0-dim
     // tensor is of a higher category, so promote(int32, float64) = float64.
    ResultTypeState s;
    s.AddTensor(kInt32, false);
    s.AddTensor(kFloat64, true);
    EXPECT_EQ(s.Result(), kFloat64);
  }
  {  // float32 tensor + float64 0-dim tensor -> float32.
    ResultTypeState s;
    s.AddTensor(kFloat32, false);
    s.AddTensor(kFloat64, true);
    EXPECT_EQ(s.Result(), kFloat32);
  }
}

TEST(DtypeTest, CastToFollowsConversionRules) {
  EXPECT_EQ((CastTo<bool, float>(0.5f)), true);
  EXPECT_EQ((CastTo<bool, int64_t>(0)), false);
  EXPECT_EQ((CastTo<int32_t, double>(-2.7)), -2);
  EXPECT_EQ(static_cast<float>(CastTo<BFloat16, Half>(Half(1.5f))), 1.5f);
  EXPECT_EQ((CastTo<uint8_t, int64_t>(257)), 1);
}

}  // namespace
}  // namespace ember
