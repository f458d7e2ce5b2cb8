// Helpers shared by the Store implementations so that every store checks keys,
// parses counters and words its timeout errors the same way. Internal to
// distributed/.
#ifndef EMBER_DISTRIBUTED_STORE_UTIL_H_
#define EMBER_DISTRIBUTED_STORE_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ember::distributed::internal {

// kInvalidArgument for an empty key.
absl::Status CheckKey(std::string_view key);

// The counter held at `key` (its value `value` must be a decimal integer, as
// Add writes it); kDataLoss naming the key otherwise.
absl::StatusOr<int64_t> ParseCounter(std::string_view key, std::string_view value);

// kDeadlineExceeded: "<store>: timed out after <timeout> waiting for keys
// [a, b]". `store` names the store (e.g. "FileStore /tmp/x"); empty leaves
// the prefix out.
absl::Status MissingKeysError(std::string_view store, absl::Span<const std::string> missing,
                              absl::Duration timeout);

}  // namespace ember::distributed::internal

#endif  // EMBER_DISTRIBUTED_STORE_UTIL_H_
