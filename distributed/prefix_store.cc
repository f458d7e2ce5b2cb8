#include "distributed/prefix_store.h"

#include <utility>
#include <vector>

#include "distributed/store_util.h"
#include "tensor/status_macros.h"

namespace ember::distributed {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  set_timeout(store_->timeout());
}

std::string PrefixStore::Full(std::string_view key) const {
  std::string full;
  full.reserve(prefix_.size() + 1 + key.size());
  full.append(prefix_).push_back('/');
  full.append(key);
  return full;
}

// Keys are checked here so that an empty key is an error rather than "<prefix>/".

absl::Status PrefixStore::set(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return store_->set(Full(key), value);
}

absl::StatusOr<std::string> PrefixStore::get(std::string_view key, absl::Duration timeout) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return store_->get(Full(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::add(std::string_view key, int64_t delta) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return store_->add(Full(key), delta);
}

absl::StatusOr<std::string> PrefixStore::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return store_->compare_set(Full(key), expected, desired);
}

absl::Status PrefixStore::wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    full.push_back(Full(key));
  }
  return store_->wait(full, timeout);
}

absl::StatusOr<bool> PrefixStore::delete_key(std::string_view key) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return store_->delete_key(Full(key));
}

absl::StatusOr<int64_t> PrefixStore::num_keys() { return store_->num_keys(); }

absl::StatusOr<std::vector<std::string>> PrefixStore::FullKeys(
    absl::Span<const std::string> keys) const {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) {
    EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
    full.push_back(Full(key));
  }
  return full;
}

absl::StatusOr<bool> PrefixStore::check(absl::Span<const std::string> keys) {
  EMBER_ASSIGN_OR_RETURN(std::vector<std::string> full, FullKeys(keys));
  return store_->check(full);
}

absl::Status PrefixStore::append(std::string_view key, std::string_view value) {
  EMBER_RETURN_IF_ERROR(internal::CheckKey(key));
  return store_->append(Full(key), value);
}

absl::StatusOr<std::vector<std::string>> PrefixStore::multi_get(
    absl::Span<const std::string> keys, absl::Duration timeout) {
  EMBER_ASSIGN_OR_RETURN(std::vector<std::string> full, FullKeys(keys));
  return store_->multi_get(full, timeout);
}

absl::Status PrefixStore::multi_set(absl::Span<const std::string> keys,
                                    absl::Span<const std::string> values) {
  EMBER_ASSIGN_OR_RETURN(std::vector<std::string> full, FullKeys(keys));
  return store_->multi_set(full, values);
}

}  // namespace ember::distributed
