// Value: what queues and pipes carry: None, a bool, an integer, a double, a
// string, a tensor, or a list of values (nested freely).
//
//   Value msg = Value::List{Value(3), Value("loss"), Value(ember::ones({4}))};
//   absl::StatusOr<ember::Tensor> t = msg.list()[2].as<ember::Tensor>();
//
// Copying a Value copies tensor handles, not their bytes. Thread-compatible.
#ifndef EMBER_MULTIPROCESSING_VALUE_H_
#define EMBER_MULTIPROCESSING_VALUE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tensor/tensor.h"

namespace ember::multiprocessing {

class Value {
 public:
  using List = std::vector<Value>;
  using Variant = std::variant<std::monostate, bool, int64_t, double,
                               std::string, Tensor, List>;

  Value() = default;                             // None
  Value(bool v) : v_(v) {}                       // NOLINT: implicit by design
  Value(int v) : v_(static_cast<int64_t>(v)) {}  // NOLINT
  Value(int64_t v) : v_(v) {}                    // NOLINT
  Value(double v) : v_(v) {}                     // NOLINT
  Value(const char* v) : v_(std::string(v)) {}   // NOLINT
  Value(std::string v) : v_(std::move(v)) {}     // NOLINT
  Value(Tensor v) : v_(std::move(v)) {}          // NOLINT
  Value(List v) : v_(std::move(v)) {}            // NOLINT

  bool is_none() const { return std::holds_alternative<std::monostate>(v_); }
  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(v_);
  }
  // The held T, or null.
  template <typename T>
  const T* get_if() const {
    return std::get_if<T>(&v_);
  }
  // The held T, or InvalidArgument naming what is held instead.
  template <typename T>
  absl::StatusOr<T> as() const {
    if (const T* p = std::get_if<T>(&v_)) return *p;
    return absl::InvalidArgumentError(
        absl::StrCat("expected a ", KindName(Variant(T{}).index()),
                     " value, got ", KindName(v_.index())));
  }
  // The elements of a list (empty for anything else).
  const List& list() const {
    static const List kEmpty;
    const List* l = std::get_if<List>(&v_);
    return l != nullptr ? *l : kEmpty;
  }
  const Variant& variant() const { return v_; }
  // "none", "bool", "int", "double", "string", "tensor" or "list".
  std::string_view kind() const { return KindName(v_.index()); }

 private:
  static const char* KindName(size_t index) {
    constexpr const char* kNames[] = {"none",   "bool",   "int", "double",
                                      "string", "tensor", "list"};
    return kNames[index];
  }
  Variant v_;
};

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_VALUE_H_
