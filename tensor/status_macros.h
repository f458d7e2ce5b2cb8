// The project's RETURN_IF_ERROR / ASSIGN_OR_RETURN pair for absl::Status code
// (Abseil 20220623 ships neither).
//
//   absl::StatusOr<Config> Load(const std::string& path) {
//     EMBER_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
//     EMBER_RETURN_IF_ERROR(Validate(text));
//     return Parse(text);
//   }
#ifndef EMBER_TENSOR_STATUS_MACROS_H_
#define EMBER_TENSOR_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define EMBER_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    ::absl::Status ember_status_ = (expr);             \
    if (!ember_status_.ok()) [[unlikely]]              \
      return ember_status_;                            \
  } while (0)

#define EMBER_STATUS_CONCAT_INNER_(a, b) a##b
#define EMBER_STATUS_CONCAT_(a, b) EMBER_STATUS_CONCAT_INNER_(a, b)

#define EMBER_ASSIGN_OR_RETURN(lhs, expr) \
  EMBER_ASSIGN_OR_RETURN_IMPL_(           \
      EMBER_STATUS_CONCAT_(ember_statusor_, __LINE__), lhs, expr)

#define EMBER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) [[unlikely]]                        \
    return std::move(statusor).status();                  \
  lhs = std::move(statusor).value()

#endif  // EMBER_TENSOR_STATUS_MACROS_H_
