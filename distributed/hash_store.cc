#include "distributed/hash_store.h"

#include <vector>

#include "distributed/store_util.h"
#include "tensor/status_macros.h"

namespace ember::distributed {

absl::Status HashStore::set(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  data_.insert_or_assign(std::string(key), std::string(value));
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::get(std::string_view key, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto is_set = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return data_.contains(key); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&is_set), timeout)) {
    return internal::MissingKeysError("HashStore", {std::string(key)}, timeout);
  }
  return data_.find(key)->second;
}

absl::StatusOr<int64_t> HashStore::add(std::string_view key, int64_t delta) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    EMBER_ASSIGN_OR_RETURN(value, internal::ParseCounter(key, it->second));
  }
  EMBER_ASSIGN_OR_RETURN(value, internal::AddToCounter(key, value, delta));
  data_.insert_or_assign(std::string(key), std::to_string(value));
  return value;
}

absl::StatusOr<std::string> HashStore::compare_set(std::string_view key, std::string_view expected,
                                                  std::string_view desired) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return std::string(expected);
    data_.emplace(std::string(key), std::string(desired));
    return std::string(desired);
  }
  if (it->second == expected) it->second = std::string(desired);
  return it->second;
}

absl::Status HashStore::wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& key : keys) EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  auto all_set = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const std::string& key : keys) {
      if (!data_.contains(key)) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(&all_set), timeout)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!data_.contains(key)) missing.push_back(key);
  }
  return internal::MissingKeysError("HashStore", missing, timeout);
}

absl::StatusOr<bool> HashStore::check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  for (const std::string& key : keys) {
    if (!data_.contains(key)) return false;
  }
  return true;
}

absl::Status HashStore::append(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) it = data_.emplace(std::string(key), std::string()).first;
  it->second.append(value);
  return absl::OkStatus();
}

absl::StatusOr<bool> HashStore::delete_key(std::string_view key) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  data_.erase(it);
  return true;
}

absl::StatusOr<int64_t> HashStore::num_keys() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(data_.size());
}

}  // namespace ember::distributed
