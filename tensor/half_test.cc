// Half / BFloat16 conversions, checked against the compiler's own _Float16
// (exact IEEE conversion) and against bit patterns worked out by hand.
#include "tensor/half.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace ember {
namespace {

TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    Half h = Half::FromBits(static_cast<uint16_t>(bits));
    float f = static_cast<float>(h);
    _Float16 ref;
    uint16_t b16 = static_cast<uint16_t>(bits);
    std::memcpy(&ref, &b16, 2);
    float expected = static_cast<float>(ref);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(f)) << bits;
      continue;
    }
    ASSERT_EQ(f, expected) << "bits " << bits;
    ASSERT_EQ(Half(f).bits, bits) << "bits " << bits;
  }
}

TEST(HalfTest, FloatToHalfRoundsToNearestEven) {
  // Sweep floats densely around every half boundary region and compare with
  // the compiler's conversion.
  for (float f = -70000.f; f < 70000.f; f += 0.37f) {
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(Half(f).bits, ref_bits) << f;
  }
  for (float f = 1e-8f; f < 1e-3f; f *= 1.01f) {
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(Half(f).bits, ref_bits) << f;
  }
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(65504.f).bits, 0x7bff);  // Largest finite half.
  EXPECT_EQ(Half(1e6f).bits, 0x7c00);     // Overflow to +inf.
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(BFloat16Test, KeepsUpperBitsWithRounding) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even.
  EXPECT_EQ(BFloat16(1.00390625f).bits, 0x3f80);
  // Just above the half way point rounds up.
  EXPECT_EQ(BFloat16(1.0040f).bits, 0x3f81);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
  EXPECT_EQ(static_cast<float>(BFloat16(-2.5f)), -2.5f);
}

}  // namespace
}  // namespace ember
