#include "distributed/store_util.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::distributed::internal {

absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store keys must be non-empty strings");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseCounter(std::string_view key, std::string_view value) {
  int64_t counter = 0;
  if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &counter)) {
    return absl::DataLossError(absl::StrCat("Add on key '", std::string(key), "', whose value '",
                                            std::string(value.substr(0, 64)),
                                            "' is not a decimal integer; use a key that only Add writes"));
  }
  return counter;
}

absl::Status MissingKeysError(std::string_view store, absl::Span<const std::string> missing,
                              absl::Duration timeout) {
  std::string who = store.empty() ? "" : std::string(store) + ": ";
  return absl::DeadlineExceededError(absl::StrCat(who, "timed out after ", absl::FormatDuration(timeout),
                                                  " waiting for keys [", absl::StrJoin(missing, ", "), "]"));
}

}  // namespace ember::distributed::internal
