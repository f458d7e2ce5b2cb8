// The tcp backend's shared segments: memfds (multiprocessing's
// SharedMapping, pages reserved up front) that ranks on one host map
// together, named by a locator, and the way threads of those ranks wait on
// words inside them. The building block of ShmChannel (two rings per pair of
// ranks) and ShmArena (one staging area per rank for all_reduce).
//
//   EMBER_ASSIGN_OR_RETURN(SharedMapping mine, SharedMapping::create_memfd("ember-x", bytes));
//   store->set(key, LocatorOf(mine));                      // "<pid>:<fd>"
//   // another rank on this host:
//   EMBER_ASSIGN_OR_RETURN(SharedMapping theirs, OpenLocator(locator, bytes, "rank 0's x"));
//
// A peer opens the memfd through /proc/<pid>/fd/<n>, which needs no fd
// passing; the creator keeps its fd open for the segment's life. A fresh
// segment is zero-filled.
//
// Waiting (WaitUntil / Notify): spin briefly, yield, then sleep on a futex
// word in the segment; the side that makes progress wakes sleepers only when
// one said it sleeps, so a busy pair never makes a system call.
//
// Thread-safety: the functions are thread-safe.
#ifndef EMBER_DISTRIBUTED_TCP_SHM_SEGMENT_H_
#define EMBER_DISTRIBUTED_TCP_SHM_SEGMENT_H_

#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/shared_mapping.h"

namespace ember::distributed::tcp {

using base::SharedMapping;

// "<pid>:<fd>": how peers on this host find `mapping`.
std::string LocatorOf(const SharedMapping& mapping);
// Maps the `bytes`-byte segment that `locator` names; `what` ("rank 0's
// ring") names it in errors.
absl::StatusOr<SharedMapping> OpenLocator(const std::string& locator, size_t bytes,
                                          const std::string& what);

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Wakes the sleepers flagged by `sleeping` after a store they should see.
inline void Notify(std::atomic<uint32_t>& sleeping, std::atomic<uint32_t>& seq) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_relaxed)) {
    sleeping.store(0, std::memory_order_relaxed);
    seq.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&seq);
  }
}

// Spins, yields, then sleeps on `seq` (in slices of at most 50 ms) until
// ready() or `until`. Returns whether ready() held; kAborted once
// `interrupted` is set; the error of `on_slice`, which runs after each sleep
// slice (liveness checks), when it fails.
// `spins`: CpuRelax() rounds before yielding (callers that adapt it to how
// often spinning pays off pass their own).
template <typename Ready, typename OnSlice>
absl::StatusOr<bool> WaitUntil(Ready ready, std::atomic<uint32_t>& sleeping,
                               std::atomic<uint32_t>& seq, absl::Time until,
                               const std::atomic<bool>& interrupted, OnSlice on_slice,
                               int spins = 400) {
  constexpr int kYields = 200;
  constexpr absl::Duration kSleepSlice = absl::Milliseconds(50);
  for (int i = 0; i < spins; ++i) {
    if (ready()) return true;
    CpuRelax();
  }
  for (int i = 0; i < kYields; ++i) {
    if (ready()) return true;
    sched_yield();
  }
  while (true) {
    if (interrupted.load(std::memory_order_relaxed)) {
      return absl::AbortedError("the process group was aborted");
    }
    const uint32_t seen = seq.load(std::memory_order_acquire);
    sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ready()) {
      sleeping.store(0, std::memory_order_relaxed);
      return true;
    }
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      sleeping.store(0, std::memory_order_relaxed);
      return false;
    }
    FutexWait(&seq, seen, std::min(left, kSleepSlice));
    if (ready()) return true;
    absl::Status alive = on_slice();
    if (!alive.ok()) return alive;
  }
}

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_SHM_SEGMENT_H_
