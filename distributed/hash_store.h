// HashStore: a Store held in the memory of one process, for ranks that run as
// threads (gloo's HashStore, torch's HashStore).
//
//   ```cpp
//   #include <thread>
//   #include "distributed/hash_store.h"
//   auto store = std::make_shared<ember::distributed::HashStore>();
//   std::thread peer([&] { store->set("ready", "1").IgnoreError(); });
//   absl::Status ready = store->wait({"ready"}, absl::Seconds(5));
//   peer.join();
//   EMBER_RETURN_IF_ERROR(ready);
//   ```
//
// Get and Wait block (on a condition variable, not by polling) until the keys
// are set or the timeout passes; the kDeadlineExceeded error names the missing
// keys. No call fails otherwise, except kInvalidArgument for an empty key,
// kDataLoss for Add on a value that is not a decimal integer and kOutOfRange
// for an Add that would leave int64 (the value is then unchanged).
//
// Thread-safety: thread-safe; share one HashStore between the threads of a
// process (usually through std::shared_ptr<Store>).
#ifndef EMBER_DISTRIBUTED_HASH_STORE_H_
#define EMBER_DISTRIBUTED_HASH_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "distributed/store.h"

namespace ember::distributed {

class HashStore : public Store {
 public:
  HashStore() = default;

  absl::Status set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                          std::string_view desired) override;
  absl::Status wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> delete_key(std::string_view key) override;
  absl::StatusOr<int64_t> num_keys() override;

  using Store::get;
  using Store::wait;

  absl::StatusOr<bool> check(absl::Span<const std::string> keys) override;
  absl::Status append(std::string_view key, std::string_view value) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_HASH_STORE_H_
