#include "distributed/gloo/store_adapter.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace ember::distributed::gloo {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  throw ::gloo::IoException(absl::StrCat("gloo rendezvous through the store: ", status.ToString()));
}

}  // namespace

GlooStore::GlooStore(std::shared_ptr<distributed::Store> store, std::string prefix,
                     absl::Duration timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->set(prefix_ + key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->get(prefix_ + key, timeout_);
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(prefix_ + key);
  // gloo passes its context's timeout; never wait beyond the group's.
  const absl::Duration limit = std::min(absl::Milliseconds(timeout.count()), timeout_);
  absl::Status s = store_->wait(full, limit > absl::ZeroDuration() ? limit : timeout_);
  if (!s.ok()) Throw(s);
}

}  // namespace ember::distributed::gloo
