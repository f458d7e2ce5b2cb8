// Integer arithmetic the elementwise kernels share between the CPU
// (tensor/cpu/) and CUDA (cuda/, compiled by nvcc): signed add, sub, mul and
// neg wrap around (two's complement) as torch's do, instead of being
// undefined behaviour, and integer pow. Dependency-free so that nvcc can
// include it without the tensor headers; EMBER_HOST_DEVICE marks the
// functions for both sides under nvcc.
#ifndef EMBER_TENSOR_INT_MATH_H_
#define EMBER_TENSOR_INT_MATH_H_

#include <type_traits>

#ifdef __CUDACC__
#define EMBER_HOST_DEVICE __host__ __device__
#else
#define EMBER_HOST_DEVICE
#endif

namespace ember::int_math {

template <typename T>
inline constexpr bool kIsSignedInt = std::is_integral_v<T>&& std::is_signed_v<T>;

// Wrapping integer arithmetic (unsigned arithmetic is modular; the conversion
// back is modular since C++20).
template <typename T>
EMBER_HOST_DEVICE inline T WrapAdd(T x, T y) {
  if constexpr (kIsSignedInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
  } else {
    return static_cast<T>(x + y);
  }
}
template <typename T>
EMBER_HOST_DEVICE inline T WrapSub(T x, T y) {
  if constexpr (kIsSignedInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) - static_cast<U>(y)));
  } else {
    return static_cast<T>(x - y);
  }
}
template <typename T>
EMBER_HOST_DEVICE inline T WrapMul(T x, T y) {
  if constexpr (kIsSignedInt<T>) {
    using U = std::make_unsigned_t<T>;
    if constexpr (sizeof(T) < sizeof(int)) {
      return static_cast<T>(static_cast<int>(x) * static_cast<int>(y));
    } else {
      return static_cast<T>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
    }
  } else if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(int)) {
    return static_cast<T>(static_cast<unsigned>(x) * static_cast<unsigned>(y));
  } else {
    return static_cast<T>(x * y);
  }
}
template <typename T>
EMBER_HOST_DEVICE inline T WrapNeg(T x) {
  return WrapSub<T>(T(0), x);
}

// Integer power by squaring; negative exponents give 0 except for bases 1 and
// -1, as torch's tensor ** tensor does.
template <typename T>
EMBER_HOST_DEVICE inline T IntPow(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return (exp % 2 == 0) ? T(1) : T(-1);
      return 0;
    }
  }
  T result = 1;
  while (exp != 0) {
    if (exp & 1) result = WrapMul<T>(result, base);
    exp = static_cast<T>(exp >> 1);
    base = WrapMul<T>(base, base);
  }
  return result;
}

}  // namespace ember::int_math

#endif  // EMBER_TENSOR_INT_MATH_H_
