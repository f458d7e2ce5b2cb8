// Error reporting for the tensor layer.
//
// Rule for this layer (see tensor/README.md): tensor math composes in
// expressions, so a user's mistake (bad shape, dtype, dim, device string) throws
// `ember::Error` with a message naming the values involved, as PyTorch throws
// c10::Error. Internal invariants use EMBER_INTERNAL_ASSERT, which aborts:
// reaching one is a bug in Ember, not in the caller.
//
//   ```cpp
//   #include "tensor/error.h"
//   #include "tensor/factories.h"
//   ember::Tensor a = ember::ones({3});
//   try {
//     EMBER_CHECK(a.dim() == 2, "mm: expected a 2-D tensor, got ", a.dim(), "-D");
//   } catch (const ember::Error& e) {
//     std::string message = e.what();  // "mm: expected a 2-D tensor, got 1-D"
//   }
//   ```
//
// Thread-safe.
#ifndef EMBER_TENSOR_ERROR_H_
#define EMBER_TENSOR_ERROR_H_

#include <sstream>
#include <stdexcept>
#include <string>

namespace ember {

// The exception every tensor-layer user error throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace internal {
// Concatenates anything with an operator<< (numbers, strings, string_views,
// Dtype, Device, ...).
template <typename... Args>
std::string Concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void ThrowError(std::string message);
[[noreturn]] void AssertFailed(const char* file, int line, const char* cond,
                               const std::string& message);
}  // namespace internal

}  // namespace ember

// Throws ember::Error built by concatenating args (operator<<) unless `cond` holds.
#define EMBER_CHECK(cond, ...)                                               \
  do {                                                                       \
    if (!(cond)) [[unlikely]] {                                              \
      ::ember::internal::ThrowError(::ember::internal::Concat(__VA_ARGS__)); \
    }                                                                        \
  } while (0)

// Throws ember::Error built by concatenating args (operator<<).
#define EMBER_FAIL(...) ::ember::internal::ThrowError(::ember::internal::Concat(__VA_ARGS__))

// Aborts with file, line and message: for invariants only Ember can break.
#define EMBER_INTERNAL_ASSERT(cond, ...)                                          \
  do {                                                                            \
    if (!(cond)) [[unlikely]] {                                                   \
      ::ember::internal::AssertFailed(__FILE__, __LINE__, #cond,                  \
                                      ::ember::internal::Concat("" __VA_ARGS__)); \
    }                                                                             \
  } while (0)

#endif  // EMBER_TENSOR_ERROR_H_
