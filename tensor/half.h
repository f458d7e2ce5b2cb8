// 16-bit floating point storage types: Half (IEEE binary16) and BFloat16
// (the upper half of an IEEE binary32). Both convert to and from float with
// round-to-nearest-even; arithmetic is done in float (see OpMath in dtype.h).
//
//   ```cpp
//   #include "tensor/half.h"
//   ember::Half h(1.5f);
//   float f = static_cast<float>(h);  // 1.5f: exact in binary16
//   ember::BFloat16 b(f);
//   if (static_cast<float>(b) != 1.5f) return absl::InternalError("1.5 did not round trip");
//   ```
//
// Trivially copyable value types; thread-compatible. HalfToFloat and
// FloatToHalf convert arrays (what the kernels use for whole tensors).
#ifndef EMBER_TENSOR_HALF_H_
#define EMBER_TENSOR_HALF_H_

#include <cstdint>
#include <cstring>

namespace ember {

namespace internal {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToHalfBits(float f) {
  uint32_t x = FloatBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Overflow.
  if (abs < 0x38800000u) {  // Subnormal half (or zero).
    // Add the magic so the FPU rounds the mantissa into place.
    float v = BitsFloat(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatBits(v) - 0x3f000000u));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // Re-bias exponent and round to nearest even.
  return static_cast<uint16_t>(sign | (abs >> 13));
}

inline float HalfBitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToBFloat16Bits(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace internal

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(internal::FloatToHalfBits(f)) {}  // NOLINT: implicit by design
  static Half FromBits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
  operator float() const { return internal::HalfBitsToFloat(bits); }  // NOLINT
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(internal::FloatToBFloat16Bits(f)) {}  // NOLINT
  static BFloat16 FromBits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  operator float() const {  // NOLINT
    return internal::BitsFloat(static_cast<uint32_t>(bits) << 16);
  }
};

// Block conversions between Half and float: the same values as the scalar
// conversions above (round to nearest even; a NaN stays a NaN), with the
// CPU's F16C instructions when it has them, eight values at a time.
void HalfToFloat(const Half* in, float* out, int64_t n);
void FloatToHalf(const float* in, Half* out, int64_t n);
// The same for BFloat16 (plain loops the compiler vectorises).
void HalfToFloat(const BFloat16* in, float* out, int64_t n);
void FloatToHalf(const float* in, BFloat16* out, int64_t n);

}  // namespace ember

#endif  // EMBER_TENSOR_HALF_H_
