#include "distributed/tcp/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::distributed::tcp {

absl::StatusOr<SharedSegment> SharedSegment::Create(const char* name, size_t bytes) {
  Fd fd(static_cast<int>(syscall(SYS_memfd_create, name, MFD_CLOEXEC)));
  if (!fd.valid()) {
    return absl::UnavailableError(absl::StrCat("memfd_create failed: ", strerror(errno)));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("ftruncate of a ", bytes, "-byte memfd failed: ", strerror(errno)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("mmap of a ", bytes, "-byte shared segment failed: ", strerror(errno)));
  }
  return SharedSegment(std::move(fd), base, bytes);
}

absl::StatusOr<SharedSegment> SharedSegment::Open(const std::string& locator, size_t bytes,
                                                  const std::string& what) {
  std::vector<std::string> parts = absl::StrSplit(locator, ':');
  int pid = 0, remote_fd = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pid) ||
      !absl::SimpleAtoi(parts[1], &remote_fd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed shared-memory locator '", locator, "' for ", what));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", remote_fd);
  Fd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", what, " ", path, ": ", strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " holds ", st.st_size,
                                                      " bytes where ", bytes, " were expected"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("mmap of ", what, " ", path, " failed: ", strerror(errno)));
  }
  return SharedSegment(std::move(fd), base, bytes);
}

SharedSegment::~SharedSegment() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) munmap(base_, bytes_);
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

std::string SharedSegment::Locator() const { return absl::StrCat(getpid(), ":", fd_.get()); }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ember::distributed::tcp
