// UniqueFd: the move-only owner of one file descriptor.
//
//   ```cpp
//   #include <fcntl.h>
//   #include <unistd.h>
//   #include "base/unique_fd.h"
//   ember::base::UniqueFd fd(open("/dev/null", O_WRONLY | O_CLOEXEC));
//   if (fd.get() < 0) return absl::UnavailableError("cannot open /dev/null");
//   if (write(fd.get(), "x", 1) != 1) return absl::DataLossError("short write");
//   // closed when `fd` goes out of scope
//   ```
//
// Thread-compatible.
#ifndef EMBER_BASE_UNIQUE_FD_H_
#define EMBER_BASE_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace ember::base {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  // Closes the current descriptor (if any) and owns `fd`.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace ember::base

#endif  // EMBER_BASE_UNIQUE_FD_H_
