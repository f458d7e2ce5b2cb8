#include "tensor/half.h"

#include <immintrin.h>

namespace ember {
namespace {

__attribute__((target("f16c,avx"))) void HalfToFloatF16c(const Half* in, float* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

__attribute__((target("f16c,avx"))) void FloatToHalfF16c(const float* in, Half* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = Half(in[i]);
}

bool HasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

}  // namespace

void HalfToFloat(const Half* in, float* out, int64_t n) {
  if (HasF16c()) return HalfToFloatF16c(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

void FloatToHalf(const float* in, Half* out, int64_t n) {
  if (HasF16c()) return FloatToHalfF16c(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = Half(in[i]);
}

void HalfToFloat(const BFloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = internal::BitsFloat(static_cast<uint32_t>(in[i].bits) << 16);
  }
}

void FloatToHalf(const float* in, BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = internal::FloatToBFloat16Bits(in[i]);
}

}  // namespace ember
