// SharedMapping: a shared-memory object mapped into this process, the bytes
// under every shared-memory structure Ember builds: storage regions
// (shared_segment.h) and the tcp backend's rings and all_reduce arenas
// (distributed/tcp/). One way to create, size and map them, so that every
// one reserves its pages when it is made: a full tmpfs (/dev/shm, or the
// memory behind memfds) fails there with ResourceExhausted, never as a
// SIGBUS on the first write to a page that could not be backed.
//
//   ```cpp
//   #include "base/shared_mapping.h"
//   namespace base = ember::base;
//   EMBER_ASSIGN_OR_RETURN(base::SharedMapping ring,
//                          base::SharedMapping::create_memfd("ring", 4096));
//   ring.data()[0] = 1;
//   // Another process on this host (here: this one) maps the same bytes by
//   // the creator's pid and descriptor, without passing the descriptor.
//   EMBER_ASSIGN_OR_RETURN(
//       base::SharedMapping peer,
//       base::SharedMapping::open_process_fd(getpid(), ring.fd(), 4096, "the ring"));
//   if (peer.data()[0] != 1) return absl::InternalError("not the same bytes");
//   ```
//
// Thread-safety: SharedMapping is move-only and thread-compatible; the free
// functions are thread-safe.
#ifndef EMBER_BASE_SHARED_MAPPING_H_
#define EMBER_BASE_SHARED_MAPPING_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"

namespace ember::base {

class SharedMapping {
 public:
  // A new zero-filled memfd of `bytes`, every page reserved, mapped read-write;
  // `name` shows in /proc/<pid>/fd. Errors: ResourceExhausted naming the size
  // (no memory to back it, descriptor limit), InvalidArgument for 0 bytes.
  static absl::StatusOr<SharedMapping> create_memfd(const char* name, size_t bytes);
  // Maps the first `bytes` of the object another process on this host holds
  // open as descriptor `fd`, through /proc/<pid>/fd/<fd>. `what` ("rank 0's
  // ring") names it in errors: Unavailable when it cannot be opened (the
  // process is gone, or ptrace rules forbid it), FailedPrecondition when it
  // is shorter than `bytes`.
  static absl::StatusOr<SharedMapping> open_process_fd(pid_t pid, int fd, size_t bytes,
                                                       absl::string_view what);

  SharedMapping() = default;
  ~SharedMapping() { unmap(); }
  SharedMapping(SharedMapping&& other) noexcept { *this = std::move(other); }
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return bytes_; }
  // The descriptor kept open with the mapping (peers open it by pid and fd).
  int fd() const { return fd_.get(); }

 private:
  SharedMapping(UniqueFd fd, void* base, size_t bytes)
      : fd_(std::move(fd)), base_(base), bytes_(bytes) {}
  void unmap();

  UniqueFd fd_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// Sizes the shared-memory object `fd` to `bytes` and reserves every page.
// ResourceExhausted names `what`, the size and, when tmpfs is full, what to
// do about it.
absl::Status reserve_pages(int fd, size_t bytes, absl::string_view what);
// Maps `bytes` of `fd` shared and read-write. ResourceExhausted names `what`.
absl::StatusOr<void*> map_shared(int fd, size_t bytes, absl::string_view what);

}  // namespace ember::base

#endif  // EMBER_BASE_SHARED_MAPPING_H_
