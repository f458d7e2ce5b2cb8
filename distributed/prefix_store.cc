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

}  // namespace ember::distributed
