// Process-shared synchronization primitives (multiprocessing.Lock, RLock,
// Semaphore, BoundedSemaphore, Event, Condition, Barrier), usable by forked,
// spawned and forkserver children alike.
//
//   ```cpp
//   #include "multiprocessing/process.h"
//   #include "multiprocessing/synchronize.h"
//   #include "tensor/factories.h"
//   namespace mp = ember::multiprocessing;
//   EMBER_ASSIGN_OR_RETURN(mp::Lock lock, mp::Lock::create());
//   ember::Tensor total = ember::zeros({1});
//   EMBER_RETURN_IF_ERROR(mp::share_memory_(total));
//   EMBER_RETURN_IF_ERROR(mp::spawn([&](int rank) -> absl::Status {
//     for (int i = 0; i < 100; ++i) {
//       EMBER_RETURN_IF_ERROR(lock.acquire(absl::Seconds(10)));
//       total.add_(1);  // read-modify-write under the lock
//       EMBER_RETURN_IF_ERROR(lock.release());
//     }
//     return absl::OkStatus();
//   }, /*nprocs=*/2));
//   if (total.item<float>() != 200) return absl::InternalError("an update was lost");
//   ```
//
// Each primitive is a handle on one page of shared memory (a memfd): copies
// share it, a forked child inherits it, and a Value holding it (value.h)
// carries it to a spawned child or through a Queue, as Python pickles its
// multiprocessing primitives for a child.
//
// Mechanisms: Lock and RLock are robust, process-shared pthread mutexes
// (error-checking and recursive); Semaphore, BoundedSemaphore, Event and
// Condition are shared futex words; Barrier is a small state guarded by a
// robust mutex with a futex to sleep on.
//
// Errors instead of hangs (Note [Dead processes] in synchronize.cc):
//   - every blocking call takes a timeout: DeadlineExceeded when it passes;
//   - a Lock or RLock whose owner died while holding it fails every later
//     acquire with Aborted naming the dead process's pid (the data it
//     guarded may be half-written: it is never silently handed on);
//   - release() by a thread that does not hold the lock, acquiring a Lock
//     twice from one thread, over-releasing a BoundedSemaphore, and waiting
//     on or notifying a Condition without its lock are FailedPrecondition;
//   - a Barrier breaks (Aborted, BrokenBarrierError) for every waiter when a
//     party times out, abort() or reset() is called, or a process that
//     waited on it before ends before reaching it.
// Semaphores and Events have no owner: a process that dies holding a
// semaphore's unit is not noticed (as in Python).
//
// Ownership is per thread, as with pthread mutexes: a Lock is released by the
// thread that acquired it (Python's multiprocessing.Lock lets another thread
// or process release it; here that is the FailedPrecondition above).
//
// Thread-safety: every method is thread-safe and process-safe.
#ifndef EMBER_MULTIPROCESSING_SYNCHRONIZE_H_
#define EMBER_MULTIPROCESSING_SYNCHRONIZE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "multiprocessing/value.h"

namespace ember::multiprocessing {

namespace internal {
class SyncPage;  // one shared page (synchronize.cc)
}  // namespace internal

// A mutual-exclusion lock shared between processes; not reentrant.
class Lock {
 public:
  // Errors: ResourceExhausted (descriptors, memory).
  static absl::StatusOr<Lock> create();

  // Waits up to `timeout` (zero: one try) for the lock. DeadlineExceeded
  // naming the holder's pid; Aborted naming the pid of an owner that died
  // holding it; FailedPrecondition when this thread already holds it.
  absl::Status acquire(absl::Duration timeout = absl::InfiniteDuration());
  // FailedPrecondition when this thread does not hold the lock.
  absl::Status release();
  // Whether this thread holds the lock.
  bool is_owned() const;
  // The pid of the process holding the lock, 0 when free (a snapshot).
  pid_t owner() const;

 private:
  Lock() = default;
  friend class Condition;
  friend struct SyncCodec;
  std::shared_ptr<internal::SyncPage> page_;
};

// A reentrant lock: the holding thread may acquire it again, and must release
// it as many times.
class RLock {
 public:
  static absl::StatusOr<RLock> create();
  // As Lock::acquire; acquiring it again from the holding thread succeeds
  // at once.
  absl::Status acquire(absl::Duration timeout = absl::InfiniteDuration());
  // Undoes one acquire. FailedPrecondition when this thread does not hold it.
  absl::Status release();
  bool is_owned() const;
  pid_t owner() const;

 private:
  RLock() = default;
  friend class Condition;
  friend struct SyncCodec;
  std::shared_ptr<internal::SyncPage> page_;
};

// A counter of units: acquire takes one (waiting while there are none),
// release gives units back.
class Semaphore {
 public:
  // InvalidArgument for a value outside [0, 2^31 - 1].
  static absl::StatusOr<Semaphore> create(int64_t value = 1);
  // Waits up to `timeout` for a unit (DeadlineExceeded naming the timeout).
  absl::Status acquire(absl::Duration timeout = absl::InfiniteDuration());
  // Gives back `n` >= 1 units (InvalidArgument otherwise; OutOfRange past
  // 2^31 - 1).
  absl::Status release(int64_t n = 1);
  // The units available now (a snapshot; Python's get_value).
  int64_t get_value() const;

 private:
  Semaphore() = default;
  friend class BoundedSemaphore;
  friend struct SyncCodec;
  std::shared_ptr<internal::SyncPage> page_;
};

// A Semaphore that may never hold more units than it started with.
class BoundedSemaphore {
 public:
  static absl::StatusOr<BoundedSemaphore> create(int64_t value = 1);
  absl::Status acquire(absl::Duration timeout = absl::InfiniteDuration());
  // FailedPrecondition ("released too many times") when the value would
  // exceed the initial one; nothing is released then.
  absl::Status release(int64_t n = 1);
  int64_t get_value() const;

 private:
  BoundedSemaphore() = default;
  friend struct SyncCodec;
  Semaphore sem_;
};

// A flag processes wait on (multiprocessing.Event).
class Event {
 public:
  static absl::StatusOr<Event> create();
  bool is_set() const;
  // Sets the flag and wakes every waiter.
  void set();
  void clear();
  // Returns once the flag is set; DeadlineExceeded when it stays clear for
  // `timeout`.
  absl::Status wait(absl::Duration timeout = absl::InfiniteDuration());

 private:
  Event() = default;
  friend struct SyncCodec;
  std::shared_ptr<internal::SyncPage> page_;
};

// A condition variable bound to a Lock or RLock (multiprocessing.Condition).
class Condition {
 public:
  // With a new RLock (Python's default).
  static absl::StatusOr<Condition> create();
  static absl::StatusOr<Condition> create(const Lock& lock);
  static absl::StatusOr<Condition> create(const RLock& lock);

  // The lock's acquire and release.
  absl::Status acquire(absl::Duration timeout = absl::InfiniteDuration());
  absl::Status release();

  // Releases the lock (every level of an RLock), waits up to `timeout` for a
  // notify, then takes the lock back (waiting for it without a limit, as
  // Python does) and returns: OK when notified, DeadlineExceeded when not.
  // Like std::condition_variable it may return OK without a notify of its
  // own (a notify can wake more than `n` waiters that had not fallen asleep
  // yet): loop on the state, or use wait_for. FailedPrecondition when this
  // thread does not hold the lock; Aborted (and the lock not held) when the
  // lock's owner died.
  absl::Status wait(absl::Duration timeout = absl::InfiniteDuration());
  // Waits until `predicate()` (called with the lock held) is true: OK, or
  // DeadlineExceeded once `timeout` passes with it false.
  absl::Status wait_for(const std::function<bool()>& predicate,
                        absl::Duration timeout = absl::InfiniteDuration());
  // Wakes up to `n` waiters / all waiters. FailedPrecondition when this
  // thread does not hold the lock.
  absl::Status notify(int n = 1);
  absl::Status notify_all();

 private:
  Condition() = default;
  friend struct SyncCodec;
  std::shared_ptr<internal::SyncPage> lock_;  // a Lock's or an RLock's page
  std::shared_ptr<internal::SyncPage> page_;  // the wake-up word
};

// A barrier for a fixed number of parties (multiprocessing.Barrier).
class Barrier {
 public:
  // InvalidArgument unless 1 <= parties <= 2^31 - 1.
  static absl::StatusOr<Barrier> create(int parties);

  // Waits until `parties` callers (threads of any process) are waiting, then
  // returns to each a distinct arrival index in [0, parties). Aborted
  // (BrokenBarrierError) when the barrier is or becomes broken while
  // waiting, with the reason; DeadlineExceeded for the caller whose
  // `timeout` passed, which breaks the barrier for the others.
  absl::StatusOr<int> wait(absl::Duration timeout = absl::InfiniteDuration());
  // Breaks the barrier: current and later waiters get Aborted until reset.
  void abort();
  // Back to the empty, unbroken state; current waiters get Aborted.
  void reset();
  int parties() const;
  int n_waiting() const;  // a snapshot
  bool broken() const;

 private:
  Barrier() = default;
  friend struct SyncCodec;
  std::shared_ptr<internal::SyncPage> page_;
};

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_SYNCHRONIZE_H_
