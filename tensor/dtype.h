// Element types and PyTorch's type-promotion rules.
//
//   ```cpp
//   #include "tensor/dtype.h"
//   ember::Dtype d = ember::promote_types(ember::kInt32, ember::kFloat16);
//   // d == kFloat16; dtype_name(d) == "float16"
//   size_t bytes = ember::VisitDtype(d, [&]<typename T>() { return sizeof(T); });
//   if (bytes != 2) return absl::InternalError("float16 is not 2 bytes");  // T is ember::Half
//   ```
//
// Promotion follows torch.promote_types: bool < integral < floating point
// categories; within a category the wider type wins; uint8 with int8 gives
// int16; float16 with bfloat16 gives float32. ResultTypeState implements
// torch.result_type, where dimensioned tensors outrank zero-dim tensors, which
// outrank plain numbers, unless a lower-priority operand is of a higher
// category. Pure functions; thread-safe.
#ifndef EMBER_TENSOR_DTYPE_H_
#define EMBER_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "tensor/half.h"

namespace ember {

enum class Dtype : int8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
};

inline constexpr int kNumDtypes = 10;
inline constexpr Dtype kFloat32 = Dtype::kFloat32;
inline constexpr Dtype kFloat64 = Dtype::kFloat64;
inline constexpr Dtype kFloat16 = Dtype::kFloat16;
inline constexpr Dtype kBFloat16 = Dtype::kBFloat16;
inline constexpr Dtype kInt64 = Dtype::kInt64;
inline constexpr Dtype kInt32 = Dtype::kInt32;
inline constexpr Dtype kInt16 = Dtype::kInt16;
inline constexpr Dtype kInt8 = Dtype::kInt8;
inline constexpr Dtype kUInt8 = Dtype::kUInt8;
inline constexpr Dtype kBool = Dtype::kBool;

// Every dtype, in enum order (handy for tests that sweep dtypes).
inline constexpr Dtype kAllDtypes[kNumDtypes] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64,
                                                 kInt32,   kInt16,   kInt8,    kUInt8,    kBool};

// Bytes per element.
size_t element_size(Dtype dtype);
// "float32", "int64", ... as PyTorch spells them after "torch.".
std::string_view dtype_name(Dtype dtype);
std::ostream& operator<<(std::ostream& os, Dtype dtype);

bool is_floating_point(Dtype dtype);
// Integral types; bool counts only when `include_bool`.
bool is_integral(Dtype dtype, bool include_bool = false);

// torch.promote_types(a, b).
Dtype promote_types(Dtype a, Dtype b);

// The default floating dtype (torch.get_default_dtype()): float32.
inline constexpr Dtype kDefaultFloatDtype = kFloat32;

// torch.result_type over a sequence of operands, fed one at a time.
class ResultTypeState {
 public:
  void AddTensor(Dtype dtype, bool zero_dim);
  // A plain number: float, integer or bool category.
  void AddScalar(Dtype category);
  Dtype Result() const;

 private:
  // kNone marks an unset slot.
  static constexpr int kNone = -1;
  int dim_ = kNone;
  int zero_dim_ = kNone;
  int wrapped_ = kNone;
};

// Maps C++ element types to dtypes and back.
template <typename T>
struct DtypeOf;
template <Dtype D>
struct CppTypeOf;

#define EMBER_DEFINE_DTYPE_PAIR(cpp, dt)      \
  template <>                                 \
  struct DtypeOf<cpp> {                       \
    static constexpr Dtype value = Dtype::dt; \
  };                                          \
  template <>                                 \
  struct CppTypeOf<Dtype::dt> {               \
    using type = cpp;                         \
  };
EMBER_DEFINE_DTYPE_PAIR(float, kFloat32)
EMBER_DEFINE_DTYPE_PAIR(double, kFloat64)
EMBER_DEFINE_DTYPE_PAIR(Half, kFloat16)
EMBER_DEFINE_DTYPE_PAIR(BFloat16, kBFloat16)
EMBER_DEFINE_DTYPE_PAIR(int64_t, kInt64)
EMBER_DEFINE_DTYPE_PAIR(int32_t, kInt32)
EMBER_DEFINE_DTYPE_PAIR(int16_t, kInt16)
EMBER_DEFINE_DTYPE_PAIR(int8_t, kInt8)
EMBER_DEFINE_DTYPE_PAIR(uint8_t, kUInt8)
EMBER_DEFINE_DTYPE_PAIR(bool, kBool)
#undef EMBER_DEFINE_DTYPE_PAIR

template <typename T>
inline constexpr Dtype kDtypeOf = DtypeOf<T>::value;

// The type arithmetic on T is carried out in: float for the 16-bit floats,
// T itself otherwise.
template <typename T>
using OpMath = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

// Converts one element between any two dtypes' C++ types, as copy_ does:
// to bool is "!= 0"; 16-bit floats go through float.
template <typename D, typename S>
inline D CastTo(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    return static_cast<OpMath<S>>(s) != OpMath<S>(0);
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(static_cast<float>(static_cast<OpMath<S>>(s)));
  } else {
    return static_cast<D>(static_cast<OpMath<S>>(s));
  }
}

namespace internal {
[[noreturn]] void ThrowUnsupportedDtype(const char* op, Dtype dtype);
}

// Calls `f.template operator()<T>()` with T the C++ type of `dtype`:
//   VisitDtype(kInt8, [&]<typename T>() { return sizeof(T); });
template <typename F>
decltype(auto) VisitDtype(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat32:
      return f.template operator()<float>();
    case Dtype::kFloat64:
      return f.template operator()<double>();
    case Dtype::kFloat16:
      return f.template operator()<Half>();
    case Dtype::kBFloat16:
      return f.template operator()<BFloat16>();
    case Dtype::kInt64:
      return f.template operator()<int64_t>();
    case Dtype::kInt32:
      return f.template operator()<int32_t>();
    case Dtype::kInt16:
      return f.template operator()<int16_t>();
    case Dtype::kInt8:
      return f.template operator()<int8_t>();
    case Dtype::kUInt8:
      return f.template operator()<uint8_t>();
    case Dtype::kBool:
      return f.template operator()<bool>();
  }
  internal::ThrowUnsupportedDtype("VisitDtype", dtype);
}

// As VisitDtype, for the floating point dtypes only; others throw an error
// naming `op` and the dtype.
template <typename F>
decltype(auto) VisitFloatingDtype(Dtype dtype, const char* op, F&& f) {
  switch (dtype) {
    case Dtype::kFloat32:
      return f.template operator()<float>();
    case Dtype::kFloat64:
      return f.template operator()<double>();
    case Dtype::kFloat16:
      return f.template operator()<Half>();
    case Dtype::kBFloat16:
      return f.template operator()<BFloat16>();
    default:
      internal::ThrowUnsupportedDtype(op, dtype);
  }
}

}  // namespace ember

#endif  // EMBER_TENSOR_DTYPE_H_
