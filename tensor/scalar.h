// Scalar: a plain number (floating, integer or bool) passed to tensor ops, as
// in `t.add(1)`, `t.mul(0.5)`, `full({2}, true)`. It keeps its category, which
// type promotion uses (a float scalar with an int tensor gives float32).
//
// Value type; thread-compatible.
#ifndef EMBER_TENSOR_SCALAR_H_
#define EMBER_TENSOR_SCALAR_H_

#include <cstdint>
#include <string>
#include <type_traits>

#include "tensor/dtype.h"

namespace ember {

class Scalar {
 public:
  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(kBool), i_(v) {}  // NOLINT: implicit by design
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(kInt64), i_(static_cast<int64_t>(v)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(kFloat64), d_(static_cast<double>(v)) {}  // NOLINT
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}       // NOLINT
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}   // NOLINT

  // kFloat64, kInt64 or kBool: the category this number stands for.
  Dtype dtype() const { return kind_; }
  bool is_floating_point() const { return kind_ == kFloat64; }
  bool is_integral() const { return kind_ == kInt64; }
  bool is_bool() const { return kind_ == kBool; }

  // The value converted to T (C++ conversion rules; 16-bit floats via float).
  template <typename T>
  T to() const {
    if (kind_ == kFloat64) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        return T(static_cast<float>(d_));
      } else if constexpr (std::is_same_v<T, bool>) {
        return d_ != 0.0;
      } else {
        return static_cast<T>(d_);
      }
    }
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      return T(static_cast<float>(i_));
    } else if constexpr (std::is_same_v<T, bool>) {
      return i_ != 0;
    } else {
      return static_cast<T>(i_);
    }
  }

  double to_double() const { return to<double>(); }
  int64_t to_int() const { return to<int64_t>(); }
  std::string str() const;

 private:
  Dtype kind_;
  union {
    int64_t i_;
    double d_;
  };
};

}  // namespace ember

#endif  // EMBER_TENSOR_SCALAR_H_
