// FileStore: a Store kept in one file that every rank can open, on a local
// disk or a shared file system such as NFS (torch.distributed's FileStore).
//
//   ```cpp
//   #include <filesystem>
//   #include "distributed/file_store.h"
//   std::string path = std::filesystem::temp_directory_path() / "job42_store";  // or on NFS
//   EMBER_ASSIGN_OR_RETURN(std::unique_ptr<ember::distributed::FileStore> store,
//                          ember::distributed::FileStore::open(path));
//   EMBER_RETURN_IF_ERROR(store->set("rank1/ready", "1"));
//   ```
//
// The file is created if missing and removed when the last FileStore that
// opened it is destroyed, so a path can be reused by the next job; two jobs
// running at the same time need different paths (or a PrefixStore each).
// See Note [FileStore format and locking].
//
// Blocking: each call takes the file's lock, waiting at most the call's
// timeout (or the store's default timeout) for it; Get and Wait poll the file
// until their keys appear or the timeout passes, giving the lock at least
// 50 ms even when less of the timeout is left (a Get or Wait that cannot
// have it then times out as a missing key, kDeadlineExceeded).
// Errors: kUnavailable when the file cannot be opened, locked, read or
// written (the message names the path and errno); kDataLoss when the file
// holds bytes that are not a FileStore log; others as in store.h.
//
// Thread-safety: thread-safe; any number of FileStore objects, in any number
// of processes and hosts, may share one path.
#ifndef EMBER_DISTRIBUTED_FILE_STORE_H_
#define EMBER_DISTRIBUTED_FILE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "distributed/store.h"

namespace ember::distributed {

class FileStore : public Store {
 public:
  // Opens (creating if needed) the store kept at `path`. Fails with
  // kUnavailable naming the path if it cannot be opened or locked within
  // `timeout`, kDataLoss if it holds something other than a FileStore log.
  static absl::StatusOr<std::unique_ptr<FileStore>> open(
      const std::string& path, absl::Duration timeout = kDefaultStoreTimeout);

  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  absl::Status set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  absl::Status append(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                          std::string_view desired) override;
  absl::Status wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> delete_key(std::string_view key) override;
  absl::StatusOr<int64_t> num_keys() override;

  using Store::get;
  using Store::wait;

  const std::string& path() const { return path_; }

 private:
  class Locked;  // the file's lock, held for one operation

  FileStore(std::string path, int fd);

  // Applies the records appended since the last read to `data_`.
  absl::Status Refresh(bool may_truncate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Append(char kind, std::string_view key, std::string_view value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Locked> Lock(bool exclusive, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `update` on fresh data under the exclusive file lock.
  template <typename F>
  auto Update(F update);

  const std::string path_;
  absl::Mutex mu_;  // serialises this object's use of fd_ and its cache
  int fd_ ABSL_GUARDED_BY(mu_);
  int64_t read_offset_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of the log applied to data_
  int64_t users_ ABSL_GUARDED_BY(mu_) = 0;        // FileStores that have the file open
  bool registered_ ABSL_GUARDED_BY(mu_) = false;  // counted in users_ by Open
  bool use_flock_ ABSL_GUARDED_BY(mu_) = false;   // no OFD locks here
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_FILE_STORE_H_
