#include "distributed/tcp/shm_segment.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::distributed::tcp {

std::string LocatorOf(const SharedMapping& mapping) {
  return absl::StrCat(getpid(), ":", mapping.fd());
}

absl::StatusOr<SharedMapping> OpenLocator(const std::string& locator, size_t bytes,
                                          const std::string& what) {
  std::vector<std::string> parts = absl::StrSplit(locator, ':');
  int pid = 0, remote_fd = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pid) ||
      !absl::SimpleAtoi(parts[1], &remote_fd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed shared-memory locator '", locator, "' for ", what));
  }
  return SharedMapping::open_process_fd(pid, remote_fd, bytes, what);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ember::distributed::tcp
