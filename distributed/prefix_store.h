// PrefixStore: a view of another Store in which every key is silently
// prefixed, so that process groups and jobs (group_name) sharing one store
// cannot see each other's keys (torch.distributed's PrefixStore).
//
//   ```cpp
//   #include "distributed/hash_store.h"
//   #include "distributed/prefix_store.h"
//   namespace dist = ember::distributed;
//   std::shared_ptr<dist::Store> job = std::make_shared<dist::HashStore>();  // any Store
//   auto group = std::make_shared<dist::PrefixStore>("group1", job);
//   EMBER_RETURN_IF_ERROR(group->set("ready", "1"));  // sets "group1/ready" in `job`
//   EMBER_ASSIGN_OR_RETURN(std::string ready, job->get("group1/ready"));
//   ```
//
// Blocking, errors and timeouts are those of the wrapped store; error
// messages name the full (prefixed) keys. NumKeys counts every key of the
// wrapped store, as torch's does. PrefixStores nest ("a/b/key").
//
// Thread-safety: as thread-safe as the wrapped store (all of Ember's are).
#ifndef EMBER_DISTRIBUTED_PREFIX_STORE_H_
#define EMBER_DISTRIBUTED_PREFIX_STORE_H_

#include <memory>
#include <string>
#include <string_view>

#include "distributed/store.h"

namespace ember::distributed {

class PrefixStore : public Store {
 public:
  // Shares ownership of `store`; its keys are "<prefix>/<key>". The wrapped
  // store's default timeout is inherited.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  absl::Status set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                          std::string_view desired) override;
  absl::Status wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> delete_key(std::string_view key) override;
  absl::StatusOr<int64_t> num_keys() override;
  // Forwarded as one call each, so the wrapped store's own (a TcpStore's
  // single message, its atomic append) is used.
  absl::StatusOr<bool> check(absl::Span<const std::string> keys) override;
  absl::Status append(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::vector<std::string>> multi_get(absl::Span<const std::string> keys,
                                                     absl::Duration timeout) override;
  absl::Status multi_set(absl::Span<const std::string> keys,
                         absl::Span<const std::string> values) override;

  using Store::get;
  using Store::multi_get;
  using Store::wait;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying() const { return store_; }

 private:
  std::string Full(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> FullKeys(absl::Span<const std::string> keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> store_;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_PREFIX_STORE_H_
