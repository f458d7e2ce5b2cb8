// The project's RETURN_IF_ERROR / ASSIGN_OR_RETURN pair for absl::Status code
// (Abseil 20220623 ships neither).
//
//   ```cpp
//   #include "absl/status/statusor.h"
//   #include "absl/strings/numbers.h"
//   #include "tensor/status_macros.h"
//   auto parse_port = [](absl::string_view text) -> absl::StatusOr<int> {
//     int port = 0;
//     if (!absl::SimpleAtoi(text, &port)) return absl::InvalidArgumentError("not a number");
//     return port;
//   };
//   auto check_port = [&](absl::string_view text) -> absl::Status {
//     EMBER_ASSIGN_OR_RETURN(int port, parse_port(text));  // returns parse_port's error
//     if (port < 1 || port > 65535) return absl::OutOfRangeError("port out of range");
//     return absl::OkStatus();
//   };
//   EMBER_RETURN_IF_ERROR(check_port("29500"));
//   if (check_port("http").ok()) return absl::InternalError("\"http\" parsed as a port");
//   ```
#ifndef EMBER_TENSOR_STATUS_MACROS_H_
#define EMBER_TENSOR_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define EMBER_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::absl::Status ember_status_ = (expr); \
    if (!ember_status_.ok()) [[unlikely]]  \
      return ember_status_;                \
  } while (0)

#define EMBER_STATUS_CONCAT_INNER_(a, b) a##b
#define EMBER_STATUS_CONCAT_(a, b) EMBER_STATUS_CONCAT_INNER_(a, b)

#define EMBER_ASSIGN_OR_RETURN(lhs, expr) \
  EMBER_ASSIGN_OR_RETURN_IMPL_(EMBER_STATUS_CONCAT_(ember_statusor_, __LINE__), lhs, expr)

#define EMBER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) [[unlikely]]                        \
    return std::move(statusor).status();                  \
  lhs = std::move(statusor).value()

#endif  // EMBER_TENSOR_STATUS_MACROS_H_
