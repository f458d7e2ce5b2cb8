// FileLock: an exclusive advisory lock (flock) on a lock file, so that
// concurrent loaders (e.g. the ranks of a DDP job sharing one hub directory)
// fetch a repository or a checkpoint once instead of racing.
//
//   ```cpp
//   #include <filesystem>
//   #include "hub/file_lock.h"
//   std::string dir = std::filesystem::temp_directory_path();  // e.g. the hub directory
//   EMBER_ASSIGN_OR_RETURN(ember::hub::FileLock lock,
//                          ember::hub::FileLock::acquire(dir + "/x.lock", absl::Minutes(10)));
//   // ... exclusive until `lock` is destroyed
//   ```
//
// The kernel drops the lock when its holder exits, so a crashed loader never
// leaves a stale lock behind. A holder deletes the lock file as it lets go,
// so none is left after the work is done (Note [Removing lock files] in
// file_lock.cc says why that stays safe for waiters); only a holder that died
// leaves its empty file, which the next loader reuses.
//
// Thread-safety: a FileLock is move-only; distinct FileLock objects on the
// same path exclude each other across threads and processes.
#ifndef EMBER_HUB_FILE_LOCK_H_
#define EMBER_HUB_FILE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ember::hub {

class FileLock {
 public:
  // Blocks until the lock on `path` (created if missing) is held, polling,
  // for at most `timeout`. Errors: DeadlineExceeded naming the path after
  // `timeout`; Internal when the file cannot be opened.
  static absl::StatusOr<FileLock> acquire(const std::string& path, absl::Duration timeout);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();  // deletes the lock file, then releases the lock

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Release();
  int fd_ = -1;
  std::string path_;
  bool held_ = false;  // the flock is held on the file linked at path_
};

}  // namespace ember::hub

#endif  // EMBER_HUB_FILE_LOCK_H_
