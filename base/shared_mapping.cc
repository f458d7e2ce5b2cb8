#include "base/shared_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::base {

absl::Status reserve_pages(int fd, size_t bytes, absl::string_view what) {
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size ", what, " to ", bytes, " bytes: ", std::strerror(errno)));
  }
  // Reserve every page now: a full tmpfs fails here, not as SIGBUS later.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", bytes, " bytes of shared memory for ", what, ": ", std::strerror(err),
        err == ENOSPC ? "; free space in /dev/shm (or memory) or raise its size" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> map_shared(int fd, size_t bytes, absl::string_view what) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", bytes, " bytes of ", what, ": ", std::strerror(errno)));
  }
  return base;
}

absl::StatusOr<SharedMapping> SharedMapping::create_memfd(const char* name, size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory '", name, "' of 0 bytes"));
  }
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC));
  if (!fd.valid()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memfd_create('", name, "'): ", std::strerror(errno),
        errno == EMFILE || errno == ENFILE ? "; raise the open-file limit (ulimit -n)" : ""));
  }
  const std::string what = absl::StrCat("memfd '", name, "'");
  if (absl::Status s = reserve_pages(fd.get(), bytes, what); !s.ok()) return s;
  absl::StatusOr<void*> base = map_shared(fd.get(), bytes, what);
  if (!base.ok()) return base.status();
  return SharedMapping(std::move(fd), *base, bytes);
}

absl::StatusOr<SharedMapping> SharedMapping::open_process_fd(pid_t pid, int fd, size_t bytes,
                                                             absl::string_view what) {
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  UniqueFd opened(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!opened.valid()) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", what, " at ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(opened.get(), &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    return absl::FailedPreconditionError(absl::StrCat(what, " at ", path, " holds ", st.st_size,
                                                      " bytes where ", bytes, " were expected"));
  }
  absl::StatusOr<void*> base = map_shared(opened.get(), bytes, absl::StrCat(what, " at ", path));
  if (!base.ok()) return base.status();
  return SharedMapping(std::move(opened), *base, bytes);
}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SharedMapping::unmap() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

}  // namespace ember::base
