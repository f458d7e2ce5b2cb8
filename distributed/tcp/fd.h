// Fd: a move-only owner of a file descriptor (sockets, memfds, listeners);
// closes it when destroyed. Thread-compatible.
#ifndef EMBER_DISTRIBUTED_TCP_FD_H_
#define EMBER_DISTRIBUTED_TCP_FD_H_

#include <unistd.h>

#include <utility>

namespace ember::distributed::tcp {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_FD_H_
