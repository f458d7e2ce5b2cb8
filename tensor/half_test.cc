// Half / BFloat16 conversions, checked against the compiler's own _Float16
// (exact IEEE conversion) and against bit patterns worked out by hand.
#include "tensor/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// The block conversions (F16C where the CPU has it) give the scalar
// conversions' values for every half, and for floats across the range, at
// lengths that leave a tail after the eight-wide blocks.
TEST(HalfTest, BlockConversionsAreTheScalarOnes) {
  std::vector<Half> halves;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) halves.push_back(Half::FromBits(bits));
  std::vector<float> floats(halves.size());
  HalfToFloat(halves.data(), floats.data(), static_cast<int64_t>(halves.size()));
  for (size_t i = 0; i < halves.size(); ++i) {
    const float want = static_cast<float>(halves[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(floats[i])) << i;
    } else {
      ASSERT_EQ(floats[i], want) << "bits " << i;
    }
  }
  std::vector<float> in;
  for (float f = -70000.f; f < 70000.f; f += 0.77f) in.push_back(f);
  for (float f = 1e-8f; f < 1e-3f; f *= 1.01f) in.push_back(f);
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  in.push_back(1e30f);
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{13}, static_cast<int64_t>(in.size())}) {
    std::vector<Half> out(static_cast<size_t>(n));
    FloatToHalf(in.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(in[i])) {
        ASSERT_TRUE(std::isnan(static_cast<float>(out[i])));
      } else {
        ASSERT_EQ(out[i].bits, Half(in[i]).bits) << in[i];
      }
    }
  }
}

TEST(HalfTest, BFloat16BlockConversionsAreTheScalarOnes) {
  std::vector<BFloat16> halves;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) halves.push_back(BFloat16::FromBits(bits));
  std::vector<float> floats(halves.size());
  HalfToFloat(halves.data(), floats.data(), static_cast<int64_t>(halves.size()));
  std::vector<BFloat16> back(halves.size());
  FloatToHalf(floats.data(), back.data(), static_cast<int64_t>(floats.size()));
  for (size_t i = 0; i < halves.size(); ++i) {
    const float want = static_cast<float>(halves[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(floats[i])) << i;
      continue;
    }
    ASSERT_EQ(floats[i], want) << "bits " << i;
    ASSERT_EQ(back[i].bits, BFloat16(floats[i]).bits) << "bits " << i;
  }
  const float in[] = {1.00390625f, 1.01171875f, -3.3e38f, 1e-40f, 0.1f};
  BFloat16 out[5];
  FloatToHalf(in, out, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i].bits, BFloat16(in[i]).bits) << in[i];
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
