// Tests of masked_fill(_), masked_select, index_select, cat (and stack, which
// is built on cat): every dtype, broadcasting, non-contiguous, empty and 0-dim
// inputs, in-place rules and error messages. Expected values are literals or
// simple reference loops written here.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"

namespace ember {
namespace {

using ::testing::HasSubstr;
using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;

Tensor Mask(const std::vector<bool>& values, SizeVector shape) {
  return tensor(values, shape);
}

std::vector<double> Iota(int64_t n, double start = 0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i);
  return v;
}

// --- masked_fill -----------------------------------------------------------------

TEST(MaskedFillTest, EveryDtype) {
  Tensor mask = Mask({true, false, true, false}, {4});
  for (Dtype dtype : kAllDtypes) {
    Tensor t = Make({0, 1, 0, 1}, dtype);
    Tensor r = t.masked_fill(mask, 1);
    EXPECT_EQ(r.dtype(), dtype);
    EXPECT_EQ(Values(r), (std::vector<double>{1, 1, 1, 1})) << dtype;
    EXPECT_EQ(Values(t), (std::vector<double>{0, 1, 0, 1})) << "out of place keeps " << dtype;
  }
  // The value is cast to the tensor's dtype.
  EXPECT_EQ(Values(Make({5, 5}, kInt64).masked_fill(Mask({false, true}, {2}), 2.75)),
            (std::vector<double>{5, 2}));
  EXPECT_EQ(Values(Make({5, 5}, kFloat16).masked_fill(Mask({true, false}, {2}), -1.5)),
            (std::vector<double>{-1.5, 5}));
  Tensor nan = Make({1, 2}).masked_fill(Mask({true, false}, {2}),
                                        std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Values(nan)[0]));
}

TEST(MaskedFillTest, InPlaceBroadcastNonContiguousAndErrors) {
  Tensor t = Make(Iota(6), {2, 3}, kFloat32);
  uint32_t v = t.version();
  Tensor r = t.masked_fill_(Mask({false, true, true}, {3}), -1);  // Broadcast over rows.
  EXPECT_TRUE(r.is_same(t));
  EXPECT_GT(t.version(), v);
  EXPECT_EQ(Values(t), (std::vector<double>{0, -1, -1, 3, -1, -1}));
  // Column mask [2, 1] on a transposed view writes through to the base.
  Tensor base = Make(Iota(6), {2, 3}, kInt32);
  base.t().masked_fill_(Mask({true, false, false}, {3, 1}), 9);
  EXPECT_EQ(Values(base), (std::vector<double>{9, 1, 2, 9, 4, 5}));
  // Non-contiguous mask.
  Tensor m = Mask({true, false, false, false, true, false}, {2, 3}).t();  // [3, 2]
  Tensor u = Make(Iota(6), {3, 2}, kUInt8);
  u.masked_fill_(m, 7);
  EXPECT_EQ(Values(u), (std::vector<double>{7, 1, 2, 7, 4, 5}));
  // 0-dim mask and 0-dim tensor.
  Tensor z = scalar_tensor(3.0);
  z.masked_fill_(Mask({true}, {}), 4);
  EXPECT_EQ(z.item<double>(), 4.0);
  Tensor all = Make({1, 2, 3});
  all.masked_fill_(Mask({true}, {}), 0);
  EXPECT_EQ(Values(all), (std::vector<double>{0, 0, 0}));
  // A mask that is self (same layout) and one that overlaps self differently.
  Tensor b = Mask({true, false, true}, {3});
  b.masked_fill_(b, false);
  EXPECT_EQ(Values(b), (std::vector<double>{0, 0, 0}));
  // Mask b[0:3] for b[1:4]: read before b is written (else every later
  // element would see the fills of the previous one).
  Tensor shifted = Mask({true, false, false, false}, {4});
  shifted.slice(0, 1, 4).masked_fill_(shifted.slice(0, 0, 3), true);
  EXPECT_EQ(Values(shifted), (std::vector<double>{1, 1, 0, 0}));
  Tensor e = empty({0, 3});
  v = e.version();
  e.masked_fill_(Mask({true, false, true}, {3}), 1);
  EXPECT_GT(e.version(), v);

  Tensor f = Make({1, 2, 3});
  EXPECT_THAT(ErrorOf([&] { f.masked_fill_(Make({1, 0, 1}, kUInt8), 0); }),
              HasSubstr("masked_fill_: only supports boolean masks, but got mask with dtype "
                        "uint8"));
  EXPECT_THAT(ErrorOf([&] { f.masked_fill_(Mask({true, false}, {2}), 0); }),
              HasSubstr("masked_fill_: shapes [3] and [2] are not broadcastable"));
  EXPECT_THAT(ErrorOf([&] { f.masked_fill_(Mask({true, false, true, true, false, true}, {2, 3}),
                                           0); }),
              HasSubstr("the mask of shape [2, 3] cannot be broadcast to the tensor's shape [3]"));
  EXPECT_THAT(ErrorOf([&] { Make({1}).expand({3}).masked_fill_(Mask({true}, {1}), 0); }),
              HasSubstr("masked_fill_: unsupported operation"));
}

// --- masked_select ---------------------------------------------------------------

TEST(MaskedSelectTest, RowMajorOrderEveryDtype) {
  Tensor mask = Mask({true, false, true, true, false, false}, {2, 3});
  for (Dtype dtype : kAllDtypes) {
    Tensor t = Make({1, 0, 1, 1, 0, 0}, {2, 3}, dtype);
    Tensor s = t.masked_select(mask);
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_EQ(s.sizes(), (SizeVector{3}));
    EXPECT_EQ(Values(s), (std::vector<double>{1, 1, 1})) << dtype;
  }
  Tensor t = Make(Iota(6, 10), {2, 3}, kInt64);
  EXPECT_EQ(Values(t.masked_select(mask)), (std::vector<double>{10, 12, 13}));
  // Transposed input: row-major order of the [3, 2] view.
  Tensor tm = Mask({true, true, false, true, true, false}, {3, 2});
  EXPECT_EQ(Values(t.t().masked_select(tm)), (std::vector<double>{10, 13, 14, 12}));
}

TEST(MaskedSelectTest, BroadcastEmptyAndErrors) {
  // Mask broadcast over rows.
  Tensor t = Make(Iota(6), {2, 3}, kFloat64);
  EXPECT_EQ(Values(t.masked_select(Mask({false, true, true}, {3}))),
            (std::vector<double>{1, 2, 4, 5}));
  // Input broadcast against a bigger mask.
  Tensor row = Make({7, 8});
  Tensor s = row.masked_select(Mask({true, false, true, true}, {2, 2}));
  EXPECT_EQ(Values(s), (std::vector<double>{7, 7, 8}));
  Tensor none = t.masked_select(Mask({false}, {1}));
  EXPECT_EQ(none.sizes(), (SizeVector{0}));
  EXPECT_EQ(none.dtype(), kFloat64);
  EXPECT_EQ(empty({0, 3}).masked_select(Mask({true, true, true}, {3})).sizes(), (SizeVector{0}));
  Tensor z = scalar_tensor(5, kInt32).masked_select(Mask({true}, {}));
  EXPECT_EQ(z.sizes(), (SizeVector{1}));
  EXPECT_EQ(Values(z), (std::vector<double>{5}));
  EXPECT_THAT(ErrorOf([&] { t.masked_select(Make({1, 0, 1}, kInt64)); }),
              HasSubstr("masked_select: expected a bool mask, but got mask with dtype int64"));
  EXPECT_THAT(ErrorOf([&] { t.masked_select(Mask({true, false}, {2})); }),
              HasSubstr("masked_select: shapes [2, 3] and [2] are not broadcastable"));
}

// --- index_select ----------------------------------------------------------------

TEST(IndexSelectTest, EveryDimAndDtype) {
  // [2, 3, 4] reference: value = 100 i + 10 j + k.
  std::vector<double> vals;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) vals.push_back(100 * i + 10 * j + k);
    }
  }
  Tensor t = Make(vals, {2, 3, 4}, kFloat64);
  const std::vector<int64_t> idx = {2, 0, 2};
  for (Dtype index_dtype : {kInt64, kInt32}) {
    Tensor index = Make({2, 0, 2}, index_dtype);
    for (int64_t dim = 0; dim < 3; ++dim) {
      if (dim == 0) continue;  // Size 2: index 2 is out of range (tested below).
      Tensor r = t.index_select(dim, index);
      SizeVector want_shape = {2, 3, 4};
      want_shape[dim] = 3;
      EXPECT_EQ(r.sizes(), want_shape);
      std::vector<double> want;
      for (int64_t i = 0; i < want_shape[0]; ++i) {
        for (int64_t j = 0; j < want_shape[1]; ++j) {
          for (int64_t k = 0; k < want_shape[2]; ++k) {
            int64_t ii = i, jj = dim == 1 ? idx[j] : j, kk = dim == 2 ? idx[k] : k;
            want.push_back(100.0 * ii + 10.0 * jj + kk);
          }
        }
      }
      EXPECT_EQ(Values(r), want) << "dim " << dim;
      EXPECT_EQ(Values(t.index_select(dim - 3, index)), want) << "negative dim " << dim;
    }
    EXPECT_EQ(Values(t.index_select(0, Make({1, 1}, index_dtype))).size(), 24u);
  }
  for (Dtype dtype : kAllDtypes) {
    Tensor x = Make({0, 1, 1, 0}, {2, 2}, dtype);
    Tensor r = x.index_select(1, Make({1, 1, 0}, kInt64));
    EXPECT_EQ(r.dtype(), dtype);
    EXPECT_EQ(Values(r), (std::vector<double>{1, 1, 0, 0, 0, 1})) << dtype;
  }
}

TEST(IndexSelectTest, NonContiguousEmptyZeroDimAndLarge) {
  Tensor base = Make(Iota(12), {3, 4}, kInt32);
  Tensor t = base.t();  // [4, 3]
  EXPECT_EQ(Values(t.index_select(0, Make({3, 1}, kInt64))),
            (std::vector<double>{3, 7, 11, 1, 5, 9}));
  EXPECT_EQ(Values(t.index_select(1, Make({2}, kInt64))), (std::vector<double>{8, 9, 10, 11}));
  Tensor stepped = base.slice(1, 0, 4, 2);  // [3, 2]: columns 0 and 2.
  EXPECT_EQ(Values(stepped.index_select(0, Make({2, 0}, kInt64))),
            (std::vector<double>{8, 10, 0, 2}));
  // 0-dim index.
  Tensor r0 = base.index_select(0, scalar_tensor(1, kInt64));
  EXPECT_EQ(r0.sizes(), (SizeVector{1, 4}));
  EXPECT_EQ(Values(r0), (std::vector<double>{4, 5, 6, 7}));
  // Empty index, empty tensor.
  Tensor e = base.index_select(1, Make({}, {0}, kInt64));
  EXPECT_EQ(e.sizes(), (SizeVector{3, 0}));
  EXPECT_EQ(empty({0, 4}).index_select(1, Make({3}, kInt64)).sizes(), (SizeVector{0, 1}));
  // 0-dim self.
  Tensor z = scalar_tensor(2.5).index_select(0, Make({0}, kInt64));
  EXPECT_EQ(z.dim(), 0);
  EXPECT_EQ(z.item<double>(), 2.5);
  // Large, split over threads: select every row in reverse.
  const int64_t rows = 40000;
  Tensor big = arange(rows * 2).view({rows, 2});
  std::vector<double> rev;
  for (int64_t i = rows - 1; i >= 0; --i) rev.push_back(static_cast<double>(i));
  Tensor ridx = Make(rev, kInt64);
  std::vector<double> got = Values(big.index_select(0, ridx));
  for (int64_t i = 0; i < rows; i += 997) {
    ASSERT_EQ(got[2 * i], 2.0 * (rows - 1 - i));
    ASSERT_EQ(got[2 * i + 1], 2.0 * (rows - 1 - i) + 1);
  }
  std::vector<double> col = Values(big.index_select(1, Make({1}, kInt64)));
  for (int64_t i = 0; i < rows; i += 997) ASSERT_EQ(col[i], 2.0 * i + 1);
  // Large and non-contiguous, few indices (slice by slice).
  Tensor wide = arange(rows * 2).view({2, rows}).t();  // [rows, 2], strides [1, rows]
  EXPECT_EQ(Values(wide.index_select(0, Make({5, rows - 1}, kInt64))),
            (std::vector<double>{5, 5 + rows, rows - 1, 2 * rows - 1}));
}

TEST(IndexSelectTest, Errors) {
  Tensor t = Make(Iota(6), {3, 2}, kFloat32);
  EXPECT_THAT(ErrorOf([&] { t.index_select(0, Make({0, 7}, kInt64)); }),
              HasSubstr("index_select: index 7 is out of bounds for dimension 0 with size 3"));
  EXPECT_THAT(ErrorOf([&] { t.index_select(1, Make({-1}, kInt32)); }),
              HasSubstr("index_select: index -1 is out of bounds for dimension 1 with size 2"));
  EXPECT_THAT(ErrorOf([&] { t.index_select(0, Make({0}, kFloat32)); }),
              HasSubstr("index_select: expected an int64 or int32 index, got dtype float32"));
  EXPECT_THAT(ErrorOf([&] { t.index_select(0, Make({0, 1}, {1, 2}, kInt64)); }),
              HasSubstr("index is supposed to be a vector"));
  EXPECT_THAT(ErrorOf([&] { t.index_select(2, Make({0}, kInt64)); }),
              HasSubstr("dimension out of range"));
  EXPECT_THAT(ErrorOf([&] { scalar_tensor(1.0).index_select(0, Make({0, 0}, kInt64)); }),
              HasSubstr("can have only 1 value, got 2"));
  EXPECT_THAT(ErrorOf([&] { scalar_tensor(1.0).index_select(0, Make({1}, kInt64)); }),
              HasSubstr("index 1 is out of bounds for dimension 0 with size 1"));
  EXPECT_THAT(ErrorOf([&] { empty({0, 2}).index_select(0, Make({0}, kInt64)); }),
              HasSubstr("index 0 is out of bounds for dimension 0 with size 0"));
}

// --- cat / stack -----------------------------------------------------------------

TEST(CatTest, DimsDtypesAndNonContiguous) {
  Tensor a = Make(Iota(6), {2, 3}, kFloat32);
  Tensor b = Make(Iota(3, 10), {1, 3}, kFloat32);
  Tensor c0 = cat({a, b}, 0);
  EXPECT_EQ(c0.sizes(), (SizeVector{3, 3}));
  EXPECT_EQ(Values(c0), (std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12}));
  Tensor d = Make(Iota(4, 20), {2, 2}, kFloat32);
  Tensor c1 = cat({a, d, a}, -1);
  EXPECT_EQ(c1.sizes(), (SizeVector{2, 8}));
  EXPECT_EQ(Values(c1),
            (std::vector<double>{0, 1, 2, 20, 21, 0, 1, 2, 3, 4, 5, 22, 23, 3, 4, 5}));
  // Non-contiguous inputs.
  Tensor ct = cat({a.t(), b.t()}, 1);  // [3, 2] and [3, 1].
  EXPECT_EQ(ct.sizes(), (SizeVector{3, 3}));
  EXPECT_EQ(Values(ct), (std::vector<double>{0, 3, 10, 1, 4, 11, 2, 5, 12}));
  EXPECT_EQ(Values(cat({a.slice(1, 0, 3, 2), Make({9}).expand({2, 1})}, 1)),
            (std::vector<double>{0, 2, 9, 3, 5, 9}));
  for (Dtype dtype : kAllDtypes) {
    Tensor x = Make({1, 0}, dtype), y = Make({0}, dtype);
    Tensor r = cat({x, y, x});
    EXPECT_EQ(r.dtype(), dtype);
    EXPECT_EQ(Values(r), (std::vector<double>{1, 0, 0, 1, 0})) << dtype;
  }
  // Promotion.
  Tensor p = cat({Make({1, 2}, kInt32), Make({0.5}, kFloat16), Make({3}, kInt64)});
  EXPECT_EQ(p.dtype(), kFloat16);
  EXPECT_EQ(Values(p), (std::vector<double>{1, 2, 0.5, 3}));
  EXPECT_EQ(cat({Make({1}, kUInt8), Make({-1}, kInt8)}).dtype(), kInt16);
  EXPECT_EQ(cat({Make({1}, kBool), Make({1}, kBool)}).dtype(), kBool);
  // A single tensor: a copy.
  Tensor one = cat({a}, 0);
  EXPECT_FALSE(one.storage().is_alias_of(a.storage()));
  EXPECT_EQ(Values(one), Values(a));
}

TEST(CatTest, EmptyTensorsAndLegacySkip) {
  Tensor a = Make(Iota(6), {2, 3}, kFloat32);
  // [0]-shaped 1-D tensors are skipped whatever the other shapes (legacy rule),
  // but take part in type promotion.
  Tensor legacy = empty({0}, kFloat64);
  Tensor r = cat({legacy, a, legacy}, 1);
  EXPECT_EQ(r.sizes(), (SizeVector{2, 3}));
  EXPECT_EQ(r.dtype(), kFloat64);
  EXPECT_EQ(Values(r), Values(a));
  // Empty tensors of the right rank take part normally.
  Tensor r2 = cat({empty({2, 0}), a}, 1);
  EXPECT_EQ(r2.sizes(), (SizeVector{2, 3}));
  Tensor r3 = cat({empty({0, 3}), empty({0, 3})}, 0);
  EXPECT_EQ(r3.sizes(), (SizeVector{0, 3}));
  Tensor only = cat({empty({0}), empty({0}, kInt64)});
  EXPECT_EQ(only.sizes(), (SizeVector{0}));
  EXPECT_EQ(only.dtype(), kFloat32);
}

TEST(CatTest, Errors) {
  Tensor a = Make(Iota(6), {2, 3}, kFloat32);
  EXPECT_THAT(ErrorOf([&] { cat({}, 0); }), HasSubstr("cat: expected a non-empty list"));
  EXPECT_THAT(ErrorOf([&] { cat({a, Make(Iota(8), {2, 4}, kFloat32)}, 0); }),
              HasSubstr("Sizes of tensors must match except in dimension 0. Expected size 3 but "
                        "got size 4 for tensor number 1 in the list"));
  EXPECT_THAT(ErrorOf([&] { cat({a, a, Make(Iota(3), {3, 1}, kFloat32)}, 1); }),
              HasSubstr("Expected size 2 but got size 3 for tensor number 2 in the list"));
  EXPECT_THAT(ErrorOf([&] { cat({a, Make({1, 2, 3})}, 0); }),
              HasSubstr("Tensors must have same number of dimensions: got 2"));
  EXPECT_THAT(ErrorOf([&] { cat({a, scalar_tensor(1.0)}, 0); }),
              HasSubstr("zero-dimensional tensor (at position 1) cannot be concatenated"));
  EXPECT_THAT(ErrorOf([&] { cat({a}, 2); }), HasSubstr("dimension out of range"));
}

TEST(StackTest, BuiltOnCat) {
  Tensor a = Make({1, 2}), b = Make({3, 4});
  Tensor s0 = stack({a, b}, 0);
  EXPECT_EQ(s0.sizes(), (SizeVector{2, 2}));
  EXPECT_EQ(Values(s0), (std::vector<double>{1, 2, 3, 4}));
  Tensor s1 = stack({a, b}, 1);
  EXPECT_EQ(s1.sizes(), (SizeVector{2, 2}));
  EXPECT_EQ(Values(s1), (std::vector<double>{1, 3, 2, 4}));
}

}  // namespace
}  // namespace ember
