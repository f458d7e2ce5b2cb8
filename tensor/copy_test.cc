// copy_/to/cpu/cuda's non_blocking request on the host (Note [Non-blocking
// copies] in ops.h): CPU copies ignore it, it lasts exactly one copy, and
// the conversions to a device need a device backend. The device side is
// cuda/copy_test's.
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

TEST(CopyTest, CpuAndToCpuOfACpuTensorAreTheTensorItself) {
  Tensor t = Make({1, 2, 3});
  EXPECT_TRUE(t.cpu().is_same(t));
  EXPECT_TRUE(t.to(kCPU, /*non_blocking=*/true).is_same(t));
}

TEST(CopyTest, NonBlockingCpuCopiesCopyAndTheRequestEndsWithThem) {
  Tensor src = Make({1, 2, 3, 4}, {2, 2}, kFloat64);
  Tensor dst = zeros({2, 2}, TensorOptions(kInt32));
  dst.copy_(src.t(), /*non_blocking=*/true);
  EXPECT_EQ(Values(dst), (std::vector<double>{1, 3, 2, 4}));
  EXPECT_FALSE(internal::tls_non_blocking_copy);
  // Also when the copy throws.
  EXPECT_THAT(ErrorOf([&] { dst.copy_(zeros({3}), true); }), HasSubstr("cannot be broadcast"));
  EXPECT_FALSE(internal::tls_non_blocking_copy);
}

TEST(CopyTest, NonBlockingGuardNestsAndRestores) {
  {
    NonBlockingCopyGuard outer(true);
    EXPECT_TRUE(internal::tls_non_blocking_copy);
    {
      NonBlockingCopyGuard inner(false);
      EXPECT_FALSE(internal::tls_non_blocking_copy);
    }
    EXPECT_TRUE(internal::tls_non_blocking_copy);
    // A blocking copy inside resets it for its own duration only.
    Tensor a = zeros({2});
    a.copy_(Make({5, 6}));
    EXPECT_TRUE(internal::tls_non_blocking_copy);
  }
  EXPECT_FALSE(internal::tls_non_blocking_copy);
}

TEST(CopyTest, CudaNeedsADeviceBackend) {
  // //cuda is not linked into this test.
  Tensor t = Make({1, 2});
  EXPECT_THAT(ErrorOf([&] { t.cuda(); }), HasSubstr("no allocator is registered for device cuda"));
  EXPECT_THAT(ErrorOf([&] { t.cuda(0, /*non_blocking=*/true); }),
              HasSubstr("no allocator is registered for device cuda:0"));
  EXPECT_THAT(ErrorOf([&] { t.cuda(-2); }), HasSubstr("got -2"));
  EXPECT_FALSE(internal::tls_non_blocking_copy);
}

}  // namespace
}  // namespace ember
