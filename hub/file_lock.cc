#include "hub/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ember::hub {

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path,
                                           absl::Duration timeout) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open lock file ", path,
                                            ": ", std::strerror(errno)));
  }
  FileLock lock(fd);
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(10);
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("cannot lock ", path, ": ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", absl::FormatDuration(timeout), " waiting for ",
          path, ": another loader is fetching into the same hub directory"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
  return lock;
}

FileLock::FileLock(FileLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace ember::hub
