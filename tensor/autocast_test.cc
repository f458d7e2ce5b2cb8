// Autocast on the CPU (Note [Autocast]): which ops cast, to what, the regions'
// nesting, the cast cache, the thread-locality and the errors. The dtypes
// every op gets are checked against PyTorch's in //nn:autocast_torch_test.
#include "tensor/autocast.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember {
namespace {

using ::testing::HasSubstr;

constexpr DeviceType kCpuType = DeviceType::kCPU;

TEST(AutocastTest, MatmulsRunInBFloat16AndTheirValuesAreThoseOfTheCastInputs) {
  manual_seed(1);
  Tensor a = randn({5, 7}), b = randn({7, 3}), c = randn({3});
  // What an mm of the inputs rounded to bfloat16 gives, written out.
  Tensor want = a.to(kBFloat16).mm(b.to(kBFloat16));
  ASSERT_EQ(want.dtype(), kBFloat16);
  {
    autocast ac(kCpuType);
    EXPECT_TRUE(is_autocast_enabled(kCpuType));
    EXPECT_EQ(get_autocast_dtype(kCpuType), kBFloat16);
    Tensor got = a.mm(b);
    EXPECT_EQ(got.dtype(), kBFloat16);
    EXPECT_TRUE(got.equal(want));
    EXPECT_EQ(addmm(c, a, b).dtype(), kBFloat16);
    EXPECT_EQ(a.reshape({1, 5, 7}).bmm(b.reshape({1, 7, 3})).dtype(), kBFloat16);
    EXPECT_EQ(a.matmul(b).dtype(), kBFloat16);  // matmul reaches mm
  }
  EXPECT_FALSE(is_autocast_enabled(kCpuType));
  EXPECT_EQ(a.mm(b).dtype(), kFloat32);
}

TEST(AutocastTest, Float64IntegersAndOpsWithoutAPolicyAreLeftAlone) {
  autocast ac(kCpuType);
  Tensor d = randn({4, 4}, kFloat64);
  EXPECT_EQ(d.mm(d).dtype(), kFloat64);
  Tensor i = ones({3, 3}, kInt64);
  EXPECT_EQ(i.mm(i).dtype(), kInt64);
  Tensor x = randn({4, 4});
  EXPECT_EQ((x + x).dtype(), kFloat32);
  EXPECT_EQ(x.exp().dtype(), kFloat32);  // exp has a policy on CUDA only
  EXPECT_EQ(x.softmax(1).dtype(), kFloat32);
  // A bfloat16 result meeting a float32 tensor promotes as usual.
  EXPECT_EQ((x.mm(x) + x).dtype(), kFloat32);
}

TEST(AutocastTest, Float32OpsCastLowerPrecisionInputsUp) {
  autocast ac(kCpuType);
  Tensor x = (rand({6}) + 0.5).to(kBFloat16);
  Tensor p = x.prod();
  EXPECT_EQ(p.dtype(), kFloat32);
  // The product of the bfloat16 values, computed in float32.
  EXPECT_TRUE(p.equal(x.to(kFloat32).prod()));
  EXPECT_EQ(x.sum().dtype(), kBFloat16);  // sum keeps its dtype on the CPU
}

TEST(AutocastTest, CatPromotesToTheWidestInput) {
  autocast ac(kCpuType);
  Tensor h = ones({2}, kFloat16), b = ones({2}, kBFloat16), f = ones({2});
  EXPECT_EQ(cat({b, b}).dtype(), kBFloat16);
  EXPECT_EQ(cat({h, b}).dtype(), kFloat32);
  EXPECT_EQ(cat({b, f}).dtype(), kFloat32);
}

TEST(AutocastTest, RegionsNestDisableAndChangeTheDtype) {
  Tensor a = randn({3, 3});
  autocast outer(kCpuType);
  EXPECT_EQ(a.mm(a).dtype(), kBFloat16);
  {
    autocast off(kCpuType, std::nullopt, /*enabled=*/false);
    EXPECT_FALSE(is_autocast_enabled(kCpuType));
    EXPECT_EQ(a.mm(a).dtype(), kFloat32);
    {
      autocast half(kCpuType, kFloat16);
      EXPECT_EQ(a.mm(a).dtype(), kFloat16);
    }
    EXPECT_EQ(a.mm(a).dtype(), kFloat32);
  }
  EXPECT_EQ(a.mm(a).dtype(), kBFloat16);
  EXPECT_EQ(get_autocast_dtype(kCpuType), kBFloat16);
}

TEST(AutocastTest, ACudaRegionLeavesCpuTensorsAlone) {
  autocast ac(DeviceType::kCUDA);
  EXPECT_TRUE(is_autocast_enabled(DeviceType::kCUDA));
  EXPECT_FALSE(is_autocast_enabled(kCpuType));
  Tensor a = randn({3, 3});
  EXPECT_EQ(a.mm(a).dtype(), kFloat32);
}

TEST(AutocastTest, TheStateIsPerThread) {
  autocast ac(kCpuType);
  Tensor a = randn({3, 3});
  Dtype other_thread = kBFloat16;
  bool other_enabled = true;
  std::thread t([&] {
    other_enabled = is_autocast_enabled(kCpuType);
    other_thread = a.mm(a).dtype();
  });
  t.join();
  EXPECT_FALSE(other_enabled);
  EXPECT_EQ(other_thread, kFloat32);
  EXPECT_EQ(a.mm(a).dtype(), kBFloat16);
}

TEST(AutocastTest, CastsOfParametersAreCachedForTheOutermostRegion) {
  Tensor w = randn({4, 4}).requires_grad_();
  Tensor x = randn({4, 4});  // not a parameter: never cached
  const Tensor* first = nullptr;
  Tensor kept;
  {
    autocast ac(kCpuType);
    kept = internal::AutocastCast(w, kBFloat16, kCpuType);
    first = &kept;
    {
      autocast inner(kCpuType);
      EXPECT_EQ(internal::AutocastCast(w, kBFloat16, kCpuType).impl(), first->impl());
    }
    // The inner region's end does not empty the outer region's cache.
    EXPECT_EQ(internal::AutocastCast(w, kBFloat16, kCpuType).impl(), first->impl());
    EXPECT_NE(internal::AutocastCast(x, kBFloat16, kCpuType).impl(),
              internal::AutocastCast(x, kBFloat16, kCpuType).impl());
  }
  {
    autocast ac(kCpuType);
    EXPECT_NE(internal::AutocastCast(w, kBFloat16, kCpuType).impl(), kept.impl());
  }
  {
    autocast ac(kCpuType, std::nullopt, true, /*cache_enabled=*/false);
    EXPECT_NE(internal::AutocastCast(w, kBFloat16, kCpuType).impl(),
              internal::AutocastCast(w, kBFloat16, kCpuType).impl());
  }
  EXPECT_TRUE(is_autocast_cache_enabled());
}

TEST(AutocastTest, GradientsReachFloat32ParametersThroughTheCasts) {
  manual_seed(2);
  Tensor w = randn({4, 3}).requires_grad_();
  Tensor x = randn({5, 4});
  Tensor y;
  {
    autocast ac(kCpuType);
    y = x.mm(w);
    y = y + x.mm(w);  // the second use takes the cached cast
  }
  ASSERT_EQ(y.dtype(), kBFloat16);
  y.to(kFloat32).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  // d/dw sum(2 x w) = 2 x^T 1, with x^T 1 computed from the bfloat16 x.
  Tensor want = (x.to(kBFloat16).t().mm(ones({5, 3}, kBFloat16)) * 2).to(kFloat32);
  EXPECT_TRUE(w.grad().allclose(want, 1e-2, 1e-2)) << w.grad() << want;
}

TEST(AutocastTest, UnsupportedDtypesAreRefusedByName) {
  try {
    autocast ac(kCpuType, kFloat32);
    FAIL() << "float32 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("float32"));
    EXPECT_THAT(e.what(), HasSubstr("bfloat16 or float16"));
  }
  EXPECT_FALSE(is_autocast_enabled(kCpuType));
  EXPECT_THROW(set_autocast_dtype(DeviceType::kCUDA, kFloat64), Error);
  EXPECT_EQ(get_autocast_dtype(DeviceType::kCUDA), kFloat16);
}

TEST(AutocastTest, ThePolicyTableNamesEachOpOnce) {
  absl::Span<const AutocastPolicy> rows = autocast_policies();
  ASSERT_FALSE(rows.empty());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < i; ++j) EXPECT_NE(rows[i].op, rows[j].op);
  }
  EXPECT_EQ(autocast_policy("mm", kCpuType), CastPolicy::kLowerPrecision);
  EXPECT_EQ(autocast_policy("softmax", DeviceType::kCUDA), CastPolicy::kFloat32);
  EXPECT_EQ(autocast_policy("no_such_op", DeviceType::kCUDA), CastPolicy::kNone);
  EXPECT_EQ(cast_policy_name(CastPolicy::kPromote), "promote");
}

}  // namespace
}  // namespace ember
