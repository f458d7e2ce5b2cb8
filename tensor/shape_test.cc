#include "tensor/shape.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"

namespace ember {
namespace {

using ::testing::HasSubstr;

TEST(ShapeTest, NumelStridesAndPrinting) {
  EXPECT_EQ(Numel({}), 1);
  EXPECT_EQ(Numel({2, 0, 3}), 0);
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (SizeVector{12, 4, 1}));
  EXPECT_EQ(ContiguousStrides({2, 0, 4}), (SizeVector{4, 4, 1}));
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeToString({}), "[]");
}

TEST(ShapeTest, BroadcastFollowsNumpyRules) {
  EXPECT_EQ(BroadcastShapes({2, 1, 3}, {4, 1}, "add"), (SizeVector{2, 4, 3}));
  EXPECT_EQ(BroadcastShapes({}, {5}, "add"), (SizeVector{5}));
  EXPECT_EQ(BroadcastShapes({0, 1}, {1, 7}, "add"), (SizeVector{0, 7}));
  try {
    BroadcastShapes({2, 3}, {4}, "add");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("add: shapes [2, 3] and [4] are not broadcastable"));
  }
}

TEST(ShapeTest, WrapDimAndErrors) {
  EXPECT_EQ(WrapDim(-1, 3, "sum"), 2);
  EXPECT_EQ(WrapDim(0, 0, "sum"), 0);
  EXPECT_EQ(WrapDim(-1, 0, "sum"), 0);
  try {
    WrapDim(5, 2, "sum");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr("sum: dimension out of range (expected to be in range of [-2, 1], but got 5)"));
  }
  EXPECT_EQ(WrapDims({-1, 0}, 3, "sum"), (SizeVector{0, 2}));
  EXPECT_THROW(WrapDims({1, -2}, 3, "sum"), Error);
}

TEST(ShapeTest, InferSize) {
  EXPECT_EQ(InferSize({2, -1}, 6, "view"), (SizeVector{2, 3}));
  EXPECT_THROW(InferSize({-1, -1}, 6, "view"), Error);
  try {
    InferSize({4, -1}, 6, "view");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("shape '[4, -1]' is invalid for input of size 6"));
  }
  EXPECT_THROW(InferSize({-1, 0}, 0, "view"), Error);
}

TEST(ShapeTest, ExpandGeometryGivesBroadcastDimsStrideZero) {
  // A [3, 1] tensor with strides [1, 1] read as [2, 3, 4]: a new leading dim
  // and the size-1 dim repeat (stride 0), the matching dim keeps its stride.
  ExpandedGeometry g = ExpandGeometry({3, 1}, {1, 1}, {2, 3, 4});
  EXPECT_EQ(g.sizes, (SizeVector{2, 3, 4}));
  EXPECT_EQ(g.strides, (SizeVector{0, 1, 0}));
  // -1 keeps the existing size; a 0-dim tensor expands to anything.
  g = ExpandGeometry({5, 1}, {1, 1}, {-1, 2});
  EXPECT_EQ(g.sizes, (SizeVector{5, 2}));
  EXPECT_EQ(g.strides, (SizeVector{1, 0}));
  g = ExpandGeometry({}, {}, {2, 2});
  EXPECT_EQ(g.strides, (SizeVector{0, 0}));
  try {
    ExpandGeometry({3}, {1}, {4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("expanded size of the tensor (4) must match the existing "
                                    "size (3) at non-singleton dimension 0"));
  }
  EXPECT_THROW(ExpandGeometry({2, 3}, {3, 1}, {3}), Error);
  EXPECT_THROW(ExpandGeometry({3}, {1}, {-1, 3}), Error);
}

TEST(ShapeTest, ViewStrides) {
  // Contiguous [2, 3, 4] viewed as [6, 4] and [24].
  EXPECT_EQ(*ComputeViewStrides({2, 3, 4}, {12, 4, 1}, {6, 4}), (SizeVector{4, 1}));
  EXPECT_EQ(*ComputeViewStrides({2, 3, 4}, {12, 4, 1}, {24}), (SizeVector{1}));
  // Transposed [3, 2] (strides [1, 3]) cannot be flattened.
  EXPECT_FALSE(ComputeViewStrides({3, 2}, {1, 3}, {6}).has_value());
  // ...but splitting a dim of it works.
  EXPECT_EQ(*ComputeViewStrides({4, 2}, {1, 4}, {2, 2, 2}), (SizeVector{2, 1, 4}));
}

}  // namespace
}  // namespace ember
