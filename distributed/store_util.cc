#include "distributed/store_util.h"

#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::distributed::internal {
namespace {

absl::string_view AbslView(std::string_view bytes) {
  return absl::string_view(bytes.data(), bytes.size());
}

}  // namespace

absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store keys must be non-empty strings");
  return absl::OkStatus();
}

absl::Status CheckOneValuePerKey(size_t keys, size_t values) {
  if (keys == values) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("multi_set: ", keys, " keys but ", values, " values; pass one per key"));
}

absl::StatusOr<int64_t> ParseCounter(std::string_view key, std::string_view value) {
  int64_t counter = 0;
  if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &counter)) {
    return absl::DataLossError(absl::StrCat(
        "Add on key '", KeyForMessage(key), "', whose value '", std::string(value.substr(0, 64)),
        "' is not a decimal integer; use a key that only Add writes"));
  }
  return counter;
}

absl::StatusOr<int64_t> AddToCounter(std::string_view key, int64_t value, int64_t delta) {
  int64_t sum = 0;
  if (!__builtin_add_overflow(value, delta, &sum)) return sum;
  // |delta| as unsigned, so that the most negative delta prints too.
  uint64_t amount =
      delta < 0 ? uint64_t{0} - static_cast<uint64_t>(delta) : static_cast<uint64_t>(delta);
  return absl::OutOfRangeError(
      absl::StrCat("Add on key '", KeyForMessage(key), "': ", value, delta < 0 ? " - " : " + ",
                   amount, " overflows int64 [", std::numeric_limits<int64_t>::min(), ", ",
                   std::numeric_limits<int64_t>::max(),
                   "]; the value is unchanged. Keep counters within int64"));
}

std::string KeyForMessage(std::string_view key) {
  if (key.size() <= kKeyShownBytes) return std::string(key);
  return absl::StrCat(AbslView(key.substr(0, kKeyShownBytes / 2)), "... (", key.size(), " bytes)");
}

absl::Status MissingKeysError(std::string_view store, absl::Span<const std::string> missing,
                              absl::Duration timeout) {
  std::string who = store.empty() ? "" : std::string(store) + ": ";
  std::string count =
      missing.size() > kMissingKeysShown ? absl::StrCat(missing.size(), " keys") : "keys";
  std::string shown = absl::StrJoin(
      missing.subspan(0, kMissingKeysShown), ", ",
      [](std::string* out, const std::string& key) { out->append(KeyForMessage(key)); });
  if (missing.size() > kMissingKeysShown)
    absl::StrAppend(&shown, ", and ", missing.size() - kMissingKeysShown, " more");
  return absl::DeadlineExceededError(absl::StrCat(who, "timed out after ",
                                                  absl::FormatDuration(timeout), " waiting for ",
                                                  count, " [", shown, "]"));
}

}  // namespace ember::distributed::internal
