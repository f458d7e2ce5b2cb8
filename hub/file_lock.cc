#include "hub/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

// Note [Removing lock files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A holder unlinks the lock file while it still holds the flock, then closes
// it. A waiter that had opened the same file gets the flock on a file that is
// no longer at `path`, and a loader arriving after the unlink creates a new
// file there; both would then "hold" the lock at once. So after every
// successful flock the holder checks that the descriptor's file is still the
// one linked at `path` (same device and inode); if not, it closes it and
// starts again on whatever file `path` names now. At any moment at most one
// process holds a flock on the file linked at `path`, and that one alone may
// proceed (and later unlink it).

namespace ember::hub {

absl::StatusOr<FileLock> FileLock::acquire(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(10);
  while (true) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot open lock file ", path, ": ", std::strerror(errno)));
    }
    FileLock lock(fd, path);
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        return absl::InternalError(absl::StrCat("cannot lock ", path, ": ", std::strerror(errno)));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("timed out after ", absl::FormatDuration(timeout), " waiting for ", path,
                         ": another loader is fetching into the same hub directory"));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(200));
    }
    struct stat held, linked;
    if (fstat(fd, &held) == 0 && stat(path.c_str(), &linked) == 0 && held.st_dev == linked.st_dev &&
        held.st_ino == linked.st_ino) {
      lock.held_ = true;
      return lock;
    }
    // The previous holder removed the file as it let go: try the current one.
  }
}

FileLock::FileLock(FileLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      held_(std::exchange(other.held_, false)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

void FileLock::Release() {
  if (held_) unlink(path_.c_str());  // while still held: Note [Removing lock files]
  if (fd_ >= 0) close(fd_);          // closing the last descriptor releases the flock
  fd_ = -1;
  held_ = false;
}

FileLock::~FileLock() { Release(); }

}  // namespace ember::hub
