// SharedSegment: one mapping of a shared-memory region that holds storage
// bytes, for both sharing strategies (internal to multiprocessing/).
//
// A region is `capacity` data bytes followed by a 64-byte header whose atomic
// reference count says how many holders the region has across all processes
// (Note [Segment reference counting]). file_descriptor regions are memfds
// (never named, freed by the kernel with their last descriptor or mapping);
// file_system regions are named shm_open objects that the last holder unlinks,
// registered with the shm manager so that they are unlinked even when their
// creator dies.
//
//   absl::StatusOr<std::shared_ptr<SharedSegment>> s =
//       SharedSegment::Acquire(SharingStrategy::kFileSystem, 4096);
//   std::memcpy((*s)->data(), src, 4096);
//
// Thread-safe: the process-wide tables (live segments, received-segment
// dedup, the reuse cache) are guarded by one mutex; a segment's bytes are not
// synchronised.
#ifndef EMBER_MULTIPROCESSING_SHARED_SEGMENT_H_
#define EMBER_MULTIPROCESSING_SHARED_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace ember::multiprocessing {

enum class SharingStrategy { kFileDescriptor, kFileSystem };

// file_system regions are named "<prefix>_<pid>_<counter>_<random>"; the
// prefix ("/ember" unless $EMBER_SHM_PREFIX says otherwise) must be "/" then
// up to 200 of [A-Za-z0-9_.-]. InvalidArgument names a bad prefix.
absl::Status SetRegionNamePrefix(std::string_view prefix);
std::string RegionNamePrefix();

class SharedSegment {
 public:
  // A new region of at least `nbytes` data bytes, its pages reserved up
  // front (posix_fallocate), holding one reference (this mapping's). Reuses a
  // cached region of the same capacity no other process holds any more.
  // Errors: ResourceExhausted when the descriptor limit or /dev/shm is
  // exhausted (the message names the limit or the size), Unavailable when the
  // shm manager cannot be reached (file_system).
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Acquire(SharingStrategy strategy,
                                                                size_t nbytes);
  // Maps a region received as a descriptor or by name, adopting the one
  // reference its message carried. A region this process already maps is
  // mapped once: the existing segment is returned (Note [Dedup]).
  // Errors: InvalidArgument for a descriptor or region that is not an Ember
  // segment, NotFound for a name that no longer exists.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> ImportFd(base::UniqueFd fd);
  static absl::StatusOr<std::shared_ptr<SharedSegment>> ImportName(const std::string& name);

  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  // Unmaps and drops this mapping's reference; the last holder of a
  // file_system region unlinks it.
  ~SharedSegment();

  void* data() const { return base_; }
  size_t capacity() const { return capacity_; }
  SharingStrategy strategy() const { return strategy_; }
  // The memfd (file_descriptor; kept open with the segment) or -1.
  int fd() const { return fd_.get(); }
  // The region's name (file_system) or "".
  const std::string& name() const { return name_; }
  // Holders across all processes (mappings plus messages in flight).
  int64_t refcount() const;

  // Takes one reference for a message about to carry this region.
  void AddMessageReference();
  // Drops a reference taken by AddMessageReference for a message that was
  // never delivered.
  void DropMessageReference();

  // Returns a segment whose storage died to the reuse cache (or frees it).
  static void Recycle(std::shared_ptr<SharedSegment> segment);
  // Frees every cached region this process created and every kept mapping.
  static void EmptyCache();
  // Drops this process's references on every segment it still maps, as its
  // exit would; called on normal exit and by forked children before _exit.
  // Later destruction only unmaps.
  static void ReleaseAllAtExit();
  // fork() for a child that only execs (the spawn start method): the child
  // keeps no mapping past exec, so no reference is taken on its behalf.
  static pid_t ForkToExec();

 private:
  struct Header;
  SharedSegment(SharingStrategy strategy, void* base, size_t capacity, base::UniqueFd fd,
                std::string name, std::string key, bool created_here);
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Create(SharingStrategy strategy,
                                                               size_t capacity);
  // Maps a received region of `size` bytes (or reuses a kept mapping).
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Map(SharingStrategy strategy,
                                                            base::UniqueFd fd, std::string name,
                                                            std::string key, off_t size);
  // Wraps a mapping of a received region, checking its header, and records
  // it in the process-wide tables.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Adopt(SharingStrategy strategy, void* base,
                                                              size_t mapped, base::UniqueFd fd,
                                                              std::string name, std::string key);
  Header* header() const;
  // Drops this mapping's reference (once); true when that was the last
  // reference to a named region, which the caller then unlinks.
  bool Release();

  friend struct SegmentTables;
  SharingStrategy strategy_;
  void* base_;
  size_t capacity_;
  base::UniqueFd fd_;
  std::string name_;
  std::string key_;    // dedup key: "fd:<dev>:<ino>" or "name:<name>"
  pid_t creator_pid_;  // 0 when received
  bool released_ = false;
};

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_SHARED_SEGMENT_H_
