// Store: the key-value store that ranks of a process group rendezvous through
// (torch.distributed's Store), as an abstract interface.
//
//   ```cpp
//   #include "distributed/hash_store.h"
//   #include "distributed/store.h"
//   std::shared_ptr<ember::distributed::Store> store =
//       std::make_shared<ember::distributed::HashStore>();  // TcpStore, FileStore, ...
//   EMBER_RETURN_IF_ERROR(store->set("rank0/addr", "10.0.0.1:29500"));
//   EMBER_ASSIGN_OR_RETURN(std::string addr, store->get("rank0/addr"));
//   EMBER_ASSIGN_OR_RETURN(int64_t arrived, store->add("arrived", 1));
//   if (arrived != 1) return absl::InternalError("the counter did not start at 0");
//   ```
//
// Values are arbitrary bytes held in std::string. Keys are non-empty strings.
// Every call that can block takes a timeout; calls without one use the
// store's default timeout(), which starts at kDefaultStoreTimeout (as
// torch.distributed's default of 300 s) and can be changed with
// set_timeout().
//
// Errors (absl::Status):
//   kDeadlineExceeded  - Get/Wait: a key did not appear in time; the message
//                        names the missing keys (beyond 8, the first 8 and
//                        the count; long keys cut short) and the timeout.
//   kInvalidArgument   - an empty key.
//   kUnavailable       - the store's server or file cannot be reached.
//   kDataLoss          - a malformed reply, or a value of the wrong kind (Add
//                        on a key that does not hold a decimal integer).
//   kOutOfRange        - Add: the sum would leave int64; the message names the
//                        key, its value and the amount, and the value is kept.
//
// Thread-safety: implementations are thread-safe; one Store may be shared by
// the threads of a process.
#ifndef EMBER_DISTRIBUTED_STORE_H_
#define EMBER_DISTRIBUTED_STORE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ember::distributed {

inline constexpr absl::Duration kDefaultStoreTimeout = absl::Seconds(300);

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any earlier value; wakes waiters.
  virtual absl::Status set(std::string_view key, std::string_view value) = 0;

  // The value of `key`, waiting up to `timeout` for it to be set.
  virtual absl::StatusOr<std::string> get(std::string_view key, absl::Duration timeout) = 0;
  absl::StatusOr<std::string> get(std::string_view key) { return get(key, timeout()); }

  // Adds `delta` to the integer stored at `key` (a missing key counts as 0)
  // and returns the new value. Values written by Add are decimal strings, so
  // Get returns them as text, as in torch.
  virtual absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) = 0;

  // Atomically: if the value of `key` equals `expected` (or the key is absent
  // and `expected` is empty), sets it to `desired`. Returns the value now
  // stored (`desired` on success, the current value otherwise).
  virtual absl::StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                                  std::string_view desired) = 0;

  // Waits until every key in `keys` is set, up to `timeout`.
  virtual absl::Status wait(absl::Span<const std::string> keys, absl::Duration timeout) = 0;
  absl::Status wait(absl::Span<const std::string> keys) { return wait(keys, timeout()); }

  // Deletes `key`; returns whether it existed.
  virtual absl::StatusOr<bool> delete_key(std::string_view key) = 0;

  // The number of keys stored.
  virtual absl::StatusOr<int64_t> num_keys() = 0;

  // torch's extended Store API. check, multi_get and multi_set are built here
  // from the calls above (so every store has them); a store that can do
  // better overrides them (TcpStore sends each as one message). append must
  // be atomic, which no combination of the calls above is (two appends of
  // equal bytes look alike to compare_set), so each store defines it.

  // Whether every key in `keys` is set now, without waiting (torch's check).
  virtual absl::StatusOr<bool> check(absl::Span<const std::string> keys);

  // Appends `value` to the value of `key` (a missing key is set to `value`).
  virtual absl::Status append(std::string_view key, std::string_view value) = 0;

  // The values of `keys`, in order, waiting up to `timeout` for all of them.
  virtual absl::StatusOr<std::vector<std::string>> multi_get(absl::Span<const std::string> keys,
                                                             absl::Duration timeout);
  absl::StatusOr<std::vector<std::string>> multi_get(absl::Span<const std::string> keys) {
    return multi_get(keys, timeout());
  }

  // Sets keys[i] to values[i]; kInvalidArgument when the counts differ.
  virtual absl::Status multi_set(absl::Span<const std::string> keys,
                                 absl::Span<const std::string> values);

  // The default timeout of the calls above that take none.
  absl::Duration timeout() const { return timeout_; }
  void set_timeout(absl::Duration timeout) { timeout_ = timeout; }

 private:
  absl::Duration timeout_ = kDefaultStoreTimeout;
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_STORE_H_
