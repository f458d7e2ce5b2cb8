#include "distributed/store.h"

#include <utility>

#include "distributed/store_util.h"

namespace ember::distributed {

absl::StatusOr<bool> Store::check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = get(key, absl::ZeroDuration());
    if (absl::IsDeadlineExceeded(value.status())) return false;
    if (!value.ok()) return value.status();
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> Store::multi_get(absl::Span<const std::string> keys,
                                                          absl::Duration timeout) {
  if (absl::Status waited = wait(keys, timeout); !waited.ok()) return waited;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = get(key, timeout);
    if (!value.ok()) return value.status();
    values.push_back(std::move(*value));
  }
  return values;
}

absl::Status Store::multi_set(absl::Span<const std::string> keys,
                              absl::Span<const std::string> values) {
  if (absl::Status counts = internal::CheckOneValuePerKey(keys.size(), values.size());
      !counts.ok())
    return counts;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status set_one = set(keys[i], values[i]); !set_one.ok()) return set_one;
  }
  return absl::OkStatus();
}

}  // namespace ember::distributed
