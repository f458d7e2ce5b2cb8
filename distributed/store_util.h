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

// kInvalidArgument unless multi_set has one value per key.
absl::Status CheckOneValuePerKey(size_t keys, size_t values);

// The counter held at `key` (its value `value` must be a decimal integer, as
// Add writes it); kDataLoss naming the key otherwise.
absl::StatusOr<int64_t> ParseCounter(std::string_view key, std::string_view value);

// `value` + `delta`, the new value of the counter at `key`; kOutOfRange naming
// the key, the value and the amount when the sum leaves int64 (the caller then
// leaves the value as it was).
absl::StatusOr<int64_t> AddToCounter(std::string_view key, int64_t value, int64_t delta);

// `key` as error messages show it: whole up to kKeyShownBytes, otherwise its
// beginning and its length ("abc... (1048576 bytes)").
inline constexpr size_t kKeyShownBytes = 100;
std::string KeyForMessage(std::string_view key);

// kDeadlineExceeded: "<store>: timed out after <timeout> waiting for keys
// [a, b]". `store` names the store (e.g. "FileStore /tmp/x"); empty leaves
// the prefix out. However many and however long the keys, the message stays
// short: beyond kMissingKeysShown keys it names the first ones and the count
// ("waiting for 1000 keys [k0, ..., k7, and 992 more]"), and long keys are
// cut as KeyForMessage does.
inline constexpr size_t kMissingKeysShown = 8;
absl::Status MissingKeysError(std::string_view store, absl::Span<const std::string> missing,
                              absl::Duration timeout);

}  // namespace ember::distributed::internal

#endif  // EMBER_DISTRIBUTED_STORE_UTIL_H_
