// The Tensor class: storage sharing, views, copy_/fill_ across dtypes,
// factories, from_blob, the version counter and printing. Expected values are
// worked out by hand or by plain loops over row-major indices.
#include "tensor/tensor.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"

namespace ember {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Make;
using ::ember::testing::Values;
using ::testing::HasSubstr;

// Reads element `idx` of any tensor as double through sizes/strides only.
double At(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = t.storage_offset();
  int64_t d = 0;
  for (int64_t i : idx) off += i * t.strides()[d++];
  const char* base = static_cast<const char*>(t.storage().data());
  return VisitDtype(t.dtype(), [&]<typename T>() {
    return static_cast<double>(
        static_cast<OpMath<T>>(*reinterpret_cast<const T*>(base + off * sizeof(T))));
  });
}

TEST(TensorTest, FactoriesFillAndShapes) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.dtype(), kFloat32);
  EXPECT_EQ(z.sizes(), (IntArrayRef{2, 3}));
  EXPECT_EQ(z.strides(), (IntArrayRef{3, 1}));
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(Values(z), std::vector<double>(6, 0.0));
  EXPECT_EQ(Values(ones({4}, kInt8)), std::vector<double>(4, 1.0));
  EXPECT_EQ(full({2}, 7).dtype(), kInt64);
  EXPECT_EQ(full({2}, 2.5).dtype(), kFloat32);
  EXPECT_EQ(full({2}, true).dtype(), kBool);
  EXPECT_EQ(Values(full({3}, 2.5, kFloat64)), (std::vector<double>{2.5, 2.5, 2.5}));
  EXPECT_EQ(empty({0, 3}).numel(), 0);
  EXPECT_EQ(scalar_tensor(3).dim(), 0);
  EXPECT_THAT(ErrorOf([] { empty({2, -1}); }), HasSubstr("negative dimension -1"));
}

TEST(TensorTest, AnUndefinedTensorThrowsNamingTheCall) {
  const Tensor none;
  EXPECT_FALSE(none.defined());
  EXPECT_EQ(none.impl(), nullptr);
  EXPECT_THAT(ErrorOf([&] { none.sizes(); }),
              HasSubstr("sizes() called on an undefined tensor"));
  EXPECT_THAT(ErrorOf([&] { none.dtype(); }), HasSubstr("dtype() called on an undefined tensor"));
  EXPECT_THAT(ErrorOf([&] { none.requires_grad(); }), HasSubstr("check defined() first"));
  // Ops check their operands with their own words.
  EXPECT_THAT(ErrorOf([&] { none.add(ones({2})); }), HasSubstr("must be defined"));
  EXPECT_THAT(ErrorOf([&] { none.detach(); }), HasSubstr("called on an undefined tensor"));
}

TEST(TensorTest, ArangeLinspaceEye) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_EQ(Values(a), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Values(arange(1, 10, 3)), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(Values(arange(5, 0, -2)), (std::vector<double>{5, 3, 1}));
  Tensor f = arange(0.0, 1.0, 0.25);
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(Values(f), (std::vector<double>{0, 0.25, 0.5, 0.75}));
  EXPECT_THAT(ErrorOf([] { arange(0, 5, 0); }), HasSubstr("step must be nonzero"));
  EXPECT_THAT(ErrorOf([] { arange(5, 0, 1); }), HasSubstr("inconsistent with step sign"));
  EXPECT_EQ(Values(linspace(-1, 1, 5, kFloat64)), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  EXPECT_EQ(linspace(0, 1, 0).numel(), 0);
  EXPECT_EQ(Values(eye(2, 3)), (std::vector<double>{1, 0, 0, 0, 1, 0}));
}

TEST(TensorTest, RandomIsSeededAndInRange) {
  manual_seed(42);
  Tensor a = rand({1000});
  Tensor n1 = randn({1000}, kFloat64);
  Tensor r = randint(-3, 4, {1000});
  manual_seed(42);
  EXPECT_EQ(Values(a), Values(rand({1000})));
  EXPECT_EQ(Values(n1), Values(randn({1000}, kFloat64)));
  EXPECT_EQ(Values(r), Values(randint(-3, 4, {1000})));
  double sum = 0, sq = 0;
  for (double v : Values(a)) {
    EXPECT_GE(v, 0.0);
    EXPECT_LT(v, 1.0);
  }
  for (double v : Values(n1)) {
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / 1000, 0.0, 0.15);
  EXPECT_NEAR(sq / 1000, 1.0, 0.2);
  std::vector<int> seen(7, 0);
  for (double v : Values(r)) {
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 4);
    seen[static_cast<int>(v) + 3]++;
  }
  for (int c : seen) EXPECT_GT(c, 80);  // Each of 7 values ~143 times.
  Generator g(7);
  Tensor x = rand({5}, kFloat32, &g);
  Generator g2(7);
  EXPECT_EQ(Values(x), Values(rand({5}, kFloat32, &g2)));
  EXPECT_THAT(ErrorOf([] { rand({2}, kInt64); }), HasSubstr("expected a floating point dtype"));
  EXPECT_THAT(ErrorOf([] { randint(3, 3, {2}); }), HasSubstr("low < high"));
}

TEST(TensorTest, FromBlobSharesCallerMemoryAndRunsDeleter) {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  bool deleted = false;
  {
    Tensor t = from_blob(buf.data(), {2, 3}, kFloat32, [&](void* p) {
      EXPECT_EQ(p, buf.data());
      deleted = true;
    });
    EXPECT_EQ(At(t, {1, 2}), 6);
    t.select(0, 1).fill_(0);
    EXPECT_EQ(buf[3], 0);
    Tensor col = from_blob(buf.data(), {3}, {2}, kFloat32);
    EXPECT_EQ(Values(col), (std::vector<double>{1, 3, 0}));
    EXPECT_FALSE(deleted);
  }
  EXPECT_TRUE(deleted);
  std::vector<int64_t> v = {5, 6, 7, 8};
  Tensor from_vec = tensor(v, SizeVector{2, 2});
  v[0] = 0;  // tensor() copies.
  EXPECT_EQ(Values(from_vec), (std::vector<double>{5, 6, 7, 8}));
  EXPECT_EQ(tensor({true, false}).dtype(), kBool);
  EXPECT_EQ(tensor({1, 2}).dtype(), kInt64);
  EXPECT_THAT(ErrorOf([] {
                tensor(std::vector<float>{1, 2, 3}, SizeVector{2, 2});
              }),
              HasSubstr("3 values do not fill shape [2, 2]"));
}

TEST(TensorTest, StorageIsAlignedAndShared) {
  for (int n : {1, 3, 100, 4097}) {
    Tensor t = empty({n}, kInt8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kCpuAlignment, 0u);
  }
  Tensor a = zeros({4});
  Tensor b = a;
  EXPECT_TRUE(a.storage().is_alias_of(b.storage()));
  Tensor v = a.view({2, 2});
  EXPECT_TRUE(v.storage().is_alias_of(a.storage()));
  EXPECT_FALSE(a.clone().storage().is_alias_of(a.storage()));
}

TEST(TensorTest, ViewsShareStorageAndVersion) {
  Tensor base = arange(24).view({2, 3, 4});
  Tensor t = base.transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(t.sizes(), (IntArrayRef{4, 3, 2}));
  EXPECT_EQ(t.strides(), (IntArrayRef{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(At(t, {i, j, k}), k * 12 + j * 4 + i);
  Tensor p = base.permute({1, 2, 0});
  EXPECT_EQ(At(p, {2, 3, 1}), 1 * 12 + 2 * 4 + 3);
  Tensor s = base.select(1, -1);  // [2, 4]
  EXPECT_EQ(At(s, {1, 2}), 12 + 8 + 2);
  Tensor n = base.narrow(2, 1, 2);
  EXPECT_EQ(n.sizes(), (IntArrayRef{2, 3, 2}));
  EXPECT_EQ(At(n, {0, 0, 0}), 1);
  Tensor st = base.slice(2, 0, std::nullopt, 3);  // Indices 0, 3.
  EXPECT_EQ(st.sizes(), (IntArrayRef{2, 3, 2}));
  EXPECT_EQ(At(st, {1, 2, 1}), 12 + 8 + 3);
  EXPECT_EQ(base.slice(0, -100, 100).size(0), 2);
  EXPECT_EQ(base.slice(0, 5, 7).size(0), 0);

  uint32_t v0 = base.version();
  s.fill_(-1);  // Writes through the view...
  EXPECT_EQ(At(base, {0, 2, 3}), -1);
  EXPECT_EQ(base.version(), v0 + 1);  // ...and the shared counter moves.
  EXPECT_EQ(t.version(), base.version());
}

TEST(TensorTest, ExpandSqueezeUnsqueezeFlatten) {
  Tensor col = arange(3).view({3, 1});
  Tensor e = col.expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (IntArrayRef{0, 1, 0}));
  EXPECT_EQ(At(e, {1, 2, 3}), 2);
  EXPECT_EQ(col.expand({-1, 5}).sizes(), (IntArrayRef{3, 5}));
  EXPECT_THAT(ErrorOf([&] {
                col.expand({4, 1});
              }),
              HasSubstr("expanded size of the tensor (4) must match the existing size (3)"));
  EXPECT_THAT(ErrorOf([&] { e.fill_(1); }),
              HasSubstr("more than one element of the written-to tensor"));
  Tensor q = zeros({1, 3, 1, 2});
  EXPECT_EQ(q.squeeze().sizes(), (IntArrayRef{3, 2}));
  EXPECT_EQ(q.squeeze(2).sizes(), (IntArrayRef{1, 3, 2}));
  EXPECT_EQ(q.squeeze(1).sizes(), (IntArrayRef{1, 3, 1, 2}));
  EXPECT_EQ(q.unsqueeze(-1).sizes(), (IntArrayRef{1, 3, 1, 2, 1}));
  EXPECT_EQ(q.unsqueeze(0).sizes(), (IntArrayRef{1, 1, 3, 1, 2}));
  EXPECT_EQ(q.flatten().sizes(), (IntArrayRef{6}));
  EXPECT_EQ(zeros({2, 3, 4}).flatten(1).sizes(), (IntArrayRef{2, 12}));
  EXPECT_EQ(scalar_tensor(1.0).flatten().sizes(), (IntArrayRef{1}));
  EXPECT_THAT(ErrorOf([&] { q.unsqueeze(6); }), HasSubstr("dimension out of range"));
}

TEST(TensorTest, ViewReshapeAndErrors) {
  Tensor a = arange(6).view({2, 3});
  Tensor t = a.t();
  EXPECT_THAT(ErrorOf([&] { t.view({6}); }), HasSubstr("use reshape(...) instead"));
  Tensor r = t.reshape({6});  // Copies.
  EXPECT_FALSE(r.storage().is_alias_of(a.storage()));
  EXPECT_EQ(Values(r), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor r2 = a.reshape({3, -1});  // Views.
  EXPECT_TRUE(r2.storage().is_alias_of(a.storage()));
  EXPECT_EQ(r2.sizes(), (IntArrayRef{3, 2}));
  EXPECT_THAT(ErrorOf([&] { a.view({4, -1}); }), HasSubstr("invalid for input of size 6"));
  EXPECT_THAT(ErrorOf([&] { a.t().t().t().view({3, 2}).view({6}); }), HasSubstr("reshape"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, 2, 2}).t(); }), HasSubstr("<= 2 dimensions"));
  EXPECT_THAT(ErrorOf([&] { a.permute({0, 0}); }), HasSubstr("repeated dim"));
  EXPECT_THAT(ErrorOf([&] { a.select(1, 3); }),
              HasSubstr("index 3 is out of bounds for dimension 1 with size 3"));
  EXPECT_THAT(ErrorOf([&] { a.narrow(0, 1, 2); }), HasSubstr("exceeds dimension size"));
  EXPECT_THAT(ErrorOf([&] {
                a.as_strided({3, 3}, {3, 1});
              }),
              HasSubstr("bytes but the storage holds"));
}

TEST(TensorTest, ChunkSplitUnbind) {
  Tensor a = arange(10);
  std::vector<Tensor> c = a.chunk(3);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].numel(), 4);
  EXPECT_EQ(c[2].numel(), 2);
  EXPECT_EQ(At(c[2], {0}), 8);
  std::vector<Tensor> s = a.split(4);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[2].numel(), 2);
  std::vector<Tensor> w = a.split_with_sizes({1, 9});
  EXPECT_EQ(At(w[1], {0}), 1);
  EXPECT_THAT(ErrorOf([&] { a.split_with_sizes({1, 2}); }), HasSubstr("sum to 3"));
  std::vector<Tensor> u = arange(6).view({2, 3}).unbind(1);
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(Values(u[1]), (std::vector<double>{1, 4}));
  EXPECT_TRUE(u[1].storage().is_alias_of(a.storage()) == false);
  EXPECT_THAT(ErrorOf([&] { a.chunk(0); }), HasSubstr("greater than 0"));
}

TEST(TensorTest, CopyAcrossEveryDtypePair) {
  std::vector<double> src_vals = {0, 1, 2, 100, 3};
  for (Dtype from : kAllDtypes) {
    for (Dtype to : kAllDtypes) {
      Tensor src = tensor(src_vals).to(from);
      Tensor dst = zeros({5}, to);
      dst.copy_(src);
      std::vector<double> got = Values(dst);
      for (size_t i = 0; i < src_vals.size(); ++i) {
        double expect = src_vals[i];
        if (from == kBool || to == kBool) expect = expect != 0 ? 1 : 0;
        ASSERT_EQ(got[i], expect) << dtype_name(from) << " -> " << dtype_name(to) << " at " << i;
      }
    }
  }
}

TEST(TensorTest, CopyBroadcastsNonContiguousAndOverlapping) {
  Tensor dst = zeros({3, 4}).t();  // Non-contiguous destination [4, 3].
  dst.copy_(arange(3));            // Broadcast source.
  EXPECT_EQ(Values(dst), (std::vector<double>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
  EXPECT_THAT(ErrorOf([&] { zeros({2}).copy_(zeros({3})); }),
              HasSubstr("cannot be broadcast to the destination shape [2]"));
  // Overlapping source and destination in one storage: a shift by one.
  Tensor a = arange(5, kFloat64);
  a.narrow(0, 1, 4).copy_(a.narrow(0, 0, 4));
  EXPECT_EQ(Values(a), (std::vector<double>{0, 0, 1, 2, 3}));
  uint32_t v = a.version();
  a.copy_(a);
  EXPECT_EQ(a.version(), v + 1);
  Tensor empty_t = zeros({0, 3});
  empty_t.copy_(zeros({3}));
  EXPECT_EQ(empty_t.numel(), 0);
}

TEST(TensorTest, ToDtypeContiguousClone) {
  Tensor a = arange(6).view({2, 3});
  EXPECT_TRUE(a.to(kInt64).is_same(a));
  Tensor h = a.to(kFloat16);
  EXPECT_EQ(h.dtype(), kFloat16);
  EXPECT_EQ(Values(h), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  Tensor c = a.t().contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(Values(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(a.contiguous().is_same(a));
  Tensor cl = a.clone();
  cl.fill_(9);
  EXPECT_EQ(At(a, {0, 0}), 0);
  EXPECT_EQ(a.to(kCPU).impl(), a.impl());
}

TEST(TensorTest, ItemAndDataPtr) {
  EXPECT_EQ(scalar_tensor(2.5).item<double>(), 2.5);
  EXPECT_EQ(full({1, 1}, 7, kInt16).item<int64_t>(), 7);
  EXPECT_EQ(full({}, true).item<bool>(), true);
  EXPECT_THAT(ErrorOf([] { zeros({2}).item<float>(); }),
              HasSubstr("2 elements cannot be converted"));
  EXPECT_THAT(ErrorOf([] { zeros({2}).data_ptr<double>(); }),
              HasSubstr("expected a float64 pointer type for a float32 tensor"));
  EXPECT_EQ(zeros({3}, kFloat16).nbytes(), 6u);
}

TEST(TensorTest, PrintsLikeTorch) {
  EXPECT_EQ(arange(6).view({2, 3}).ToString(), "tensor([[0, 1, 2],\n        [3, 4, 5]])");
  EXPECT_EQ(tensor({1.5f, -2.0f}).ToString(), "tensor([ 1.5000, -2.0000])");
  EXPECT_EQ(tensor({1.0f, 2.0f}).ToString(), "tensor([1., 2.])");
  EXPECT_EQ(ones({2}, kInt32).ToString(), "tensor([1, 1], dtype=int32)");
  EXPECT_EQ(tensor({true, false}).ToString(), "tensor([ True, False])");
  EXPECT_EQ(scalar_tensor(3).ToString(), "tensor(3)");
  EXPECT_EQ(zeros({0}).ToString(), "tensor([])");
  EXPECT_EQ(zeros({2, 0}).ToString(), "tensor([], size=(2, 0))");
  EXPECT_EQ(tensor({1e-6, 1.0}).ToString(), "tensor([1.0000e-06, 1.0000e+00], dtype=float64)");
  std::string big = arange(2000).ToString();
  EXPECT_EQ(big, "tensor([   0,    1,    2, ..., 1997, 1998, 1999])");
}

TEST(TensorTest, EqualAndAllclose) {
  Tensor a = tensor({1.0f, 2.0f, 3.0f});
  EXPECT_TRUE(a.equal(tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_FALSE(a.equal(tensor({1.0f, 2.0f, 3.5f})));
  EXPECT_FALSE(a.equal(a.view({3, 1})));  // Shapes differ.
  EXPECT_TRUE(a.equal(a.to(kInt64)));     // Values compare after promotion.
  EXPECT_TRUE(zeros({0, 2}).equal(zeros({0, 2})));
  // |a - b| <= atol + rtol * |b|, elementwise.
  EXPECT_TRUE(a.allclose(tensor({1.0f, 2.0f, 3.0f + 2e-5f}), 1e-5, 1e-8));
  EXPECT_FALSE(a.allclose(tensor({1.0f, 2.0f, 3.001f}), 1e-5, 1e-8));
  EXPECT_TRUE(a.allclose(tensor({1.0f, 2.0f, 3.001f}), 0.0, 0.01));
  EXPECT_TRUE(a.allclose(full({1}, 2.0f), 0.0, 1.0));  // Broadcasts: |1-2|, |3-2| <= 1.
  Tensor n = tensor({1.0, NAN, INFINITY});
  EXPECT_FALSE(n.allclose(tensor({1.0, NAN, INFINITY})));
  EXPECT_TRUE(n.allclose(tensor({1.0, NAN, INFINITY}), 1e-5, 1e-8, /*equal_nan=*/true));
  EXPECT_FALSE(tensor({INFINITY}).allclose(tensor({-INFINITY})));
  EXPECT_TRUE(allclose(arange(3), arange(3)));
  EXPECT_THAT(ErrorOf([&] { a.allclose(zeros({2})); }), HasSubstr("not broadcastable"));
}

TEST(TensorTest, WrapScalarIsANumber) {
  Tensor w = WrapScalar(2.5);
  EXPECT_TRUE(w.impl()->is_wrapped_number());
  EXPECT_EQ(w.dtype(), kFloat64);
  EXPECT_EQ(w.dim(), 0);
}

TEST(TensorTest, FreshTensorsStartAtVersionZero) {
  Tensor src = Make({1, 2, 3, 4}, {2, 2}, kFloat32);
  src.add_(1);  // The source's own version must not leak into its copies.
  ASSERT_EQ(src.version(), 1u);
  EXPECT_EQ(src.clone().version(), 0u);
  EXPECT_EQ(src.to(kFloat64).version(), 0u);
  EXPECT_EQ(src.to(kInt32).version(), 0u);
  EXPECT_EQ(src.t().contiguous().version(), 0u);
  EXPECT_EQ(rand({3}).version(), 0u);
  EXPECT_EQ(randn({3}).version(), 0u);
  EXPECT_EQ(randint(0, 5, {3}).version(), 0u);
  EXPECT_EQ(eye(3).version(), 0u);
  EXPECT_EQ(zeros({3}).version(), 0u);
  EXPECT_EQ(full({3}, 2.0).version(), 0u);
  EXPECT_EQ(arange(4).version(), 0u);
  EXPECT_EQ(linspace(0, 1, 5).version(), 0u);
  // The values are still copied, and later writes still count.
  Tensor c = src.clone();
  EXPECT_EQ(Values(c), (std::vector<double>{2, 3, 4, 5}));
  c.mul_(2);
  EXPECT_EQ(c.version(), 1u);
  EXPECT_EQ(src.version(), 1u);
  // In-place random fills are modifications.
  Tensor u = zeros({3});
  uniform_(u, 0, 1);
  EXPECT_EQ(u.version(), 1u);
}

TEST(TensorTest, ViewsKnowTheirBase) {
  Tensor x = zeros({2, 3});
  EXPECT_FALSE(x.is_view());
  EXPECT_FALSE(x._base().defined());
  Tensor v = x.t().slice(0, 0, 2).unsqueeze(0);
  EXPECT_TRUE(v.is_view());
  EXPECT_TRUE(v._base().is_same(x));  // The first tensor of the chain.
  EXPECT_TRUE(x[1].is_view());
  EXPECT_TRUE(x.view({6})._base().is_same(x));
  EXPECT_FALSE(x.detach().is_view());
  EXPECT_FALSE(v.clone().is_view());
  EXPECT_FALSE(x.contiguous().is_view());  // x itself.
  EXPECT_THAT(ErrorOf([&] { v.detach_(); }), HasSubstr("Can't detach views in-place"));
}

TEST(TensorTest, TensorOptionsSetAndMerge) {
  TensorOptions o;
  EXPECT_FALSE(o.has_dtype() || o.has_device() || o.has_requires_grad() || o.has_pinned_memory());
  EXPECT_EQ(o.dtype(), kFloat32);
  EXPECT_EQ(o.device(), kCPU);
  EXPECT_FALSE(o.requires_grad());
  EXPECT_FALSE(o.pinned_memory());
  TensorOptions r = o.dtype(kFloat64).requires_grad(true);
  EXPECT_EQ(r.dtype(), kFloat64);
  EXPECT_TRUE(r.requires_grad());
  EXPECT_FALSE(o.has_dtype());  // Setters return copies.
  TensorOptions m =
      TensorOptions(kInt64).device(kCPU).merge_in(TensorOptions().requires_grad(true));
  EXPECT_EQ(m.dtype(), kInt64);
  EXPECT_TRUE(m.has_device());
  EXPECT_TRUE(m.requires_grad());
}

// Without a device backend linked (//tensor alone) nothing can pin memory:
// pin_memory says what to link, and no tensor claims to be pinned (the
// factories' side: PinnedMemoryIsRefusedWithoutCuda).
TEST(TensorTest, PinMemoryNeedsADeviceBackend) {
  ASSERT_EQ(GetPinnedMemoryAllocator(), nullptr);
  Tensor t = ones({3});
  EXPECT_FALSE(t.is_pinned());
  EXPECT_THAT(ErrorOf([&] { t.pin_memory(); }), HasSubstr("link //cuda"));
}

TEST(TensorTest, RecordStreamRefusesMemoryThatStreamsDoNotOrder) {
  EXPECT_THAT(ErrorOf([] { ones({3}).record_stream(Stream(kCPU, 0)); }),
              HasSubstr("record_stream: memory from the cpu allocator (on cpu) is not ordered by "
                        "streams"));
  float data[2] = {1, 2};
  EXPECT_THAT(ErrorOf([&] { from_blob(data, {2}, kFloat32).record_stream(Stream(kCPU, 0)); }),
              HasSubstr("was not made by an allocator"));
}

TEST(TensorTest, FactoriesInferTheDtypeWhenOptionsLeaveItOut) {
  TensorOptions cpu = TensorOptions().device(kCPU);
  EXPECT_EQ(full({2}, 3, cpu).dtype(), kInt64);
  EXPECT_EQ(full({2}, true, cpu).dtype(), kBool);
  EXPECT_EQ(full({2}, 0.5, cpu).dtype(), kFloat32);
  EXPECT_EQ(arange(4, cpu).dtype(), kInt64);
  EXPECT_EQ(arange(0, 1, 0.25, cpu).dtype(), kFloat32);
  EXPECT_EQ(randint(0, 5, {3}, cpu).dtype(), kInt64);
  EXPECT_EQ(randint(0, 5, {3}, kInt32).dtype(), kInt32);
  EXPECT_EQ(tensor({1, 2}, cpu).dtype(), kInt64);
  Tensor t = tensor({1, 2}, kFloat64);
  EXPECT_EQ(t.dtype(), kFloat64);
  EXPECT_EQ(Values(t), (std::vector<double>{1, 2}));
  EXPECT_EQ(tensor(std::vector<float>{1.5f}, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(scalar_tensor(2, cpu).dtype(), kInt64);
}

TEST(TensorTest, LikeFactoriesTakeTheInputsDtypeUnlessTold) {
  Tensor x = ones({2, 3}, kFloat64);
  EXPECT_EQ(zeros_like(x).dtype(), kFloat64);
  EXPECT_EQ(zeros_like(x, kInt32).dtype(), kInt32);
  EXPECT_EQ(ones_like(x, TensorOptions().device(kCPU)).dtype(), kFloat64);
  EXPECT_EQ(empty_like(x, kFloat16).sizes(), x.sizes());
  Tensor f = full_like(x, 7, kInt64);
  EXPECT_EQ(f.dtype(), kInt64);
  EXPECT_EQ(Values(f), std::vector<double>(6, 7));
  EXPECT_EQ(rand_like(x).dtype(), kFloat64);
  EXPECT_EQ(randn_like(x, kFloat32).sizes(), x.sizes());
}

// With //cuda linked, the same factories allocate pinned memory instead
// (cuda/caching_allocator_test.cc).
TEST(TensorTest, PinnedMemoryIsRefusedWithoutCuda) {
  TensorOptions pinned = TensorOptions().pinned_memory(true);
  for (auto& [name, make] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"empty", [&] { empty({2}, pinned); }},
           {"zeros", [&] { zeros({2}, pinned); }},
           {"ones", [&] { ones({2}, pinned); }},
           {"full", [&] { full({2}, 1, pinned); }},
           {"arange", [&] { arange(3, pinned); }},
           {"linspace", [&] { linspace(0, 1, 3, pinned); }},
           {"eye", [&] { eye(2, std::nullopt, pinned); }},
           {"rand", [&] { rand({2}, pinned); }},
           {"randn", [&] { randn({2}, pinned); }},
           {"randint", [&] { randint(0, 3, {2}, pinned); }},
           {"tensor", [&] { tensor({1.0f}, pinned); }},
           {"zeros_like", [&] { zeros_like(ones({2}), pinned); }},
       }) {
    EXPECT_THAT(ErrorOf(make), HasSubstr(name + ": pinned_memory(true) needs CUDA")) << name;
  }
  float data[2] = {1, 2};
  EXPECT_THAT(ErrorOf([&] { from_blob(data, {2}, pinned); }),
              HasSubstr("from_blob: pinned_memory(true) does not apply"));
  EXPECT_THAT(ErrorOf([&] { zeros({2}, pinned.device(Device(DeviceType::kCUDA, 0))); }),
              HasSubstr("only CPU tensors can be pinned"));
  // pinned_memory(false) is the default and fine.
  EXPECT_EQ(zeros({2}, TensorOptions().pinned_memory(false)).numel(), 2);
}

TEST(TensorTest, AutogradOptionsNeedTheAutogradLibrary) {
  // //autograd is not linked into this test.
  EXPECT_THAT(ErrorOf([] { zeros({2}, TensorOptions().requires_grad(true)); }),
              HasSubstr("requires_grad_: autograd is not linked into this program"));
  EXPECT_EQ(zeros({2}).grad_fn(), nullptr);
  EXPECT_TRUE(zeros({2}).is_leaf());
  // requires_grad(false) needs nothing.
  EXPECT_FALSE(zeros({2}, TensorOptions().requires_grad(false)).requires_grad());
}

}  // namespace
}  // namespace ember
