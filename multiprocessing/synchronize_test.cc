// Lock, RLock, Semaphore, BoundedSemaphore, Event, Condition and Barrier
// between real processes, under every start method (the children get the
// primitives by fork, or as arguments of a spawned or forkserver child),
// including owners and parties that die.
#include "multiprocessing/synchronize.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "multiprocessing/queue.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {
namespace {

using ::testing::HasSubstr;

class SpawnedChildEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { maybe_run_spawned_child(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SpawnedChildEnvironment);

constexpr absl::Duration kLong = absl::Seconds(30);

// --- Entry points the children run ----------------------------------------

// args: lock, counter (int64 tensor), iterations. A read, a pause and a
// write per step: without the lock, increments are lost.
absl::Status LockIncrementEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Lock lock, args[0].as<Lock>());
  EMBER_ASSIGN_OR_RETURN(Tensor counter, args[1].as<Tensor>());
  EMBER_ASSIGN_OR_RETURN(int64_t iterations, args[2].as<int64_t>());
  int64_t* p = counter.data_ptr<int64_t>();
  for (int64_t i = 0; i < iterations; ++i) {
    EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
    const int64_t v = *p;
    if (i % 16 == 0) ::sched_yield();
    *p = v + 1;
    EMBER_RETURN_IF_ERROR(lock.release());
  }
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("lock_increment", LockIncrementEntry);

// args: lock, held (Event). Takes the lock, says so, and dies holding it.
absl::Status HoldAndDieEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Lock lock, args[0].as<Lock>());
  EMBER_ASSIGN_OR_RETURN(Event held, args[1].as<Event>());
  EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
  held.set();
  ::raise(SIGKILL);
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("hold_and_die", HoldAndDieEntry);

// The same with an RLock taken twice.
absl::Status HoldRLockAndDieEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(RLock lock, args[0].as<RLock>());
  EMBER_ASSIGN_OR_RETURN(Event held, args[1].as<Event>());
  EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
  EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
  held.set();
  std::_Exit(0);
}
EMBER_REGISTER_ENTRY_POINT("hold_rlock_and_die", HoldRLockAndDieEntry);

// args: lock, held, go (Events). Holds the lock until `go` is set.
absl::Status HoldUntilEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Lock lock, args[0].as<Lock>());
  EMBER_ASSIGN_OR_RETURN(Event held, args[1].as<Event>());
  EMBER_ASSIGN_OR_RETURN(Event go, args[2].as<Event>());
  EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
  held.set();
  EMBER_RETURN_IF_ERROR(go.wait(kLong));
  return lock.release();
}
EMBER_REGISTER_ENTRY_POINT("hold_until", HoldUntilEntry);

// args: lock (held by the parent). Releasing it here must fail.
absl::Status ReleaseForeignEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Lock lock, args[0].as<Lock>());
  CHILD_CHECK(!lock.is_owned());
  CHILD_CHECK(lock.owner() == ::getppid() || lock.owner() > 0);
  absl::Status s = lock.release();
  CHILD_CHECK(absl::IsFailedPrecondition(s));
  CHILD_CHECK(s.message().find("does not hold the lock") != std::string_view::npos);
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("release_foreign", ReleaseForeignEntry);

// args: event, queue. Waits for the event, then puts its pid.
absl::Status EventWaitEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Event event, args[0].as<Event>());
  EMBER_ASSIGN_OR_RETURN(Queue q, args[1].as<Queue>());
  EMBER_RETURN_IF_ERROR(event.wait(kLong));
  return q.put(Value(static_cast<int64_t>(::getpid())), kLong);
}
EMBER_REGISTER_ENTRY_POINT("event_wait", EventWaitEntry);

// args: semaphore, units. Releases them one at a time.
absl::Status SemaphoreReleaseEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Semaphore sem, args[0].as<Semaphore>());
  EMBER_ASSIGN_OR_RETURN(int64_t units, args[1].as<int64_t>());
  for (int64_t i = 0; i < units; ++i) EMBER_RETURN_IF_ERROR(sem.release());
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("semaphore_release", SemaphoreReleaseEntry);

// args: bounded semaphore (value 2), inside (int64 tensor [now, max]), lock.
// Holds a unit for a moment, recording how many holders there are at once.
absl::Status BoundedHolderEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(BoundedSemaphore sem, args[0].as<BoundedSemaphore>());
  EMBER_ASSIGN_OR_RETURN(Tensor inside, args[1].as<Tensor>());
  EMBER_ASSIGN_OR_RETURN(Lock lock, args[2].as<Lock>());
  int64_t* p = inside.data_ptr<int64_t>();
  for (int i = 0; i < 5; ++i) {
    EMBER_RETURN_IF_ERROR(sem.acquire(kLong));
    EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
    p[1] = std::max(p[1], ++p[0]);
    EMBER_RETURN_IF_ERROR(lock.release());
    absl::SleepFor(absl::Milliseconds(5));
    EMBER_RETURN_IF_ERROR(lock.acquire(kLong));
    --p[0];
    EMBER_RETURN_IF_ERROR(lock.release());
    EMBER_RETURN_IF_ERROR(sem.release());
  }
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("bounded_holder", BoundedHolderEntry);

// args: condition, box (int64 tensor), queue. Waits until the box is
// non-zero and puts what it holds.
absl::Status ConditionConsumerEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Condition cond, args[0].as<Condition>());
  EMBER_ASSIGN_OR_RETURN(Tensor box, args[1].as<Tensor>());
  EMBER_ASSIGN_OR_RETURN(Queue q, args[2].as<Queue>());
  volatile int64_t* p = box.data_ptr<int64_t>();
  EMBER_RETURN_IF_ERROR(cond.acquire(kLong));
  EMBER_RETURN_IF_ERROR(cond.wait_for([&] { return *p != 0; }, kLong));
  const int64_t got = *p;
  EMBER_RETURN_IF_ERROR(cond.release());
  return q.put(Value(got), kLong);
}
EMBER_REGISTER_ENTRY_POINT("condition_consumer", ConditionConsumerEntry);

// args: barrier, rounds, queue, round after which to die (-1: none). Puts
// [round, index] per round passed.
absl::Status BarrierRoundsEntry(int rank, absl::Span<const Value> args) {
  EMBER_ASSIGN_OR_RETURN(Barrier barrier, args[0].as<Barrier>());
  EMBER_ASSIGN_OR_RETURN(int64_t rounds, args[1].as<int64_t>());
  EMBER_ASSIGN_OR_RETURN(Queue q, args[2].as<Queue>());
  EMBER_ASSIGN_OR_RETURN(int64_t die_after, args[3].as<int64_t>());
  for (int64_t r = 0; r < rounds; ++r) {
    EMBER_ASSIGN_OR_RETURN(int index, barrier.wait(kLong));
    EMBER_RETURN_IF_ERROR(q.put(Value(Value::List{r, index}), kLong));
    if (r == die_after) ::raise(SIGKILL);
  }
  return absl::OkStatus();
}
EMBER_REGISTER_ENTRY_POINT("barrier_rounds", BarrierRoundsEntry);

// --- Helpers -----------------------------------------------------------------

class SynchronizeTest : public ::testing::TestWithParam<std::string> {
 protected:
  absl::StatusOr<Process> Start(const std::string& entry, std::vector<Value> args, int rank = 0) {
    EMBER_ASSIGN_OR_RETURN(Context ctx, get_context(GetParam()));
    return ctx.process(entry, std::move(args), rank);
  }
};
INSTANTIATE_TEST_SUITE_P(EveryStartMethod, SynchronizeTest,
                         ::testing::Values("fork", "spawn", "forkserver"),
                         [](const auto& info) { return info.param; });

// Joins `p`; "" when it succeeded, else how it ended and its message.
std::string JoinFailure(Process& p) {
  absl::StatusOr<ExitStatus> e = p.join(kLong);
  if (!e.ok()) return std::string(e.status().message());
  if (e->ok()) return "";
  return absl::StrCat(e->str(), ": ", p.error_message());
}

// --- Lock and RLock ------------------------------------------------------------

TEST_P(SynchronizeTest, LockSerializesReadModifyWriteAcrossProcesses) {
  absl::StatusOr<Lock> lock = Lock::create();
  ASSERT_TRUE(lock.ok()) << lock.status();
  Tensor counter = zeros({1}, TensorOptions().dtype(Dtype::kInt64));
  ASSERT_TRUE(share_memory_(counter).ok());
  std::vector<Process> children;
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<Process> p =
        Start("lock_increment", {Value(*lock), Value(counter), Value(int64_t{2000})}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    children.push_back(*std::move(p));
  }
  for (Process& p : children) EXPECT_EQ(JoinFailure(p), "");
  EXPECT_EQ(counter.data_ptr<int64_t>()[0], 6000);
  EXPECT_EQ(lock->owner(), 0);
}

TEST_P(SynchronizeTest, DeadOwnerIsReportedWithItsPidNotAHang) {
  absl::StatusOr<Lock> lock = Lock::create();
  absl::StatusOr<Event> held = Event::create();
  ASSERT_TRUE(lock.ok() && held.ok());
  absl::StatusOr<Process> p = Start("hold_and_die", {Value(*lock), Value(*held)});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(held->wait(kLong).ok());
  absl::StatusOr<ExitStatus> end = p->join(kLong);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->signal, SIGKILL);
  const std::string pid = absl::StrCat("process ", p->pid(), " died while holding this lock");
  absl::Status first = lock->acquire(absl::Seconds(10));
  EXPECT_TRUE(absl::IsAborted(first)) << first;
  EXPECT_THAT(first.message(), HasSubstr(pid));
  // Never silently handed on: every later acquire says the same.
  absl::Status again = lock->acquire(absl::Seconds(10));
  EXPECT_TRUE(absl::IsAborted(again)) << again;
  EXPECT_THAT(again.message(), HasSubstr(pid));
  EXPECT_FALSE(lock->is_owned());
}

TEST_P(SynchronizeTest, DeadOwnerOfAnRLockHeldTwiceIsReported) {
  absl::StatusOr<RLock> lock = RLock::create();
  absl::StatusOr<Event> held = Event::create();
  ASSERT_TRUE(lock.ok() && held.ok());
  absl::StatusOr<Process> p = Start("hold_rlock_and_die", {Value(*lock), Value(*held)});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(held->wait(kLong).ok());
  ASSERT_TRUE(p->join(kLong).ok());
  absl::Status s = lock->acquire(absl::Seconds(10));
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("RLock: process ", p->pid(), " died")));
}

TEST_P(SynchronizeTest, AcquireTimesOutNamingTheHolderThenSucceedsOnceReleased) {
  absl::StatusOr<Lock> lock = Lock::create();
  absl::StatusOr<Event> held = Event::create(), go = Event::create();
  ASSERT_TRUE(lock.ok() && held.ok() && go.ok());
  absl::StatusOr<Process> p = Start("hold_until", {Value(*lock), Value(*held), Value(*go)});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(held->wait(kLong).ok());
  absl::Status s = lock->acquire(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("still held by process ", p->pid())));
  s = lock->acquire(absl::ZeroDuration());
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  go->set();
  EXPECT_TRUE(lock->acquire(kLong).ok());
  EXPECT_TRUE(lock->is_owned());
  EXPECT_EQ(lock->owner(), ::getpid());
  EXPECT_TRUE(lock->release().ok());
  EXPECT_EQ(JoinFailure(*p), "");
}

TEST_P(SynchronizeTest, ReleasingALockHeldByAnotherProcessFails) {
  absl::StatusOr<Lock> lock = Lock::create();
  ASSERT_TRUE(lock.ok());
  ASSERT_TRUE(lock->acquire().ok());
  absl::StatusOr<Process> p = Start("release_foreign", {Value(*lock)});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(JoinFailure(*p), "");
  EXPECT_TRUE(lock->is_owned());  // still ours
  EXPECT_TRUE(lock->release().ok());
}

TEST(LockTest, MisuseInOneProcessIsAnError) {
  absl::StatusOr<Lock> lock = Lock::create();
  ASSERT_TRUE(lock.ok());
  absl::Status s = lock->release();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("nobody does"));
  ASSERT_TRUE(lock->acquire().ok());
  s = lock->acquire(absl::Seconds(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("use RLock"));
  // Another thread of this process does not hold it either.
  absl::Status from_thread;
  std::thread([&] { from_thread = lock->release(); }).join();
  EXPECT_TRUE(absl::IsFailedPrecondition(from_thread)) << from_thread;
  EXPECT_THAT(from_thread.message(), HasSubstr("another thread"));
  EXPECT_TRUE(lock->release().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(lock->release()));
}

TEST(LockTest, RLockIsReentrantAndCountsItsReleases) {
  absl::StatusOr<RLock> lock = RLock::create();
  ASSERT_TRUE(lock.ok());
  ASSERT_TRUE(lock->acquire().ok());
  ASSERT_TRUE(lock->acquire(absl::ZeroDuration()).ok());
  EXPECT_TRUE(lock->release().ok());
  EXPECT_TRUE(lock->is_owned());
  absl::Status other;
  std::thread([&] { other = lock->acquire(absl::Milliseconds(50)); }).join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(other)) << other;
  EXPECT_TRUE(lock->release().ok());
  EXPECT_FALSE(lock->is_owned());
  EXPECT_TRUE(absl::IsFailedPrecondition(lock->release()));
}

// --- Semaphores ------------------------------------------------------------------

TEST_P(SynchronizeTest, SemaphoreUnitsReleasedByChildrenReachTheParent) {
  absl::StatusOr<Semaphore> sem = Semaphore::create(0);
  ASSERT_TRUE(sem.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(sem->acquire(absl::Milliseconds(50))));
  std::vector<Process> children;
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<Process> p =
        Start("semaphore_release", {Value(*sem), Value(int64_t{3})}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    children.push_back(*std::move(p));
  }
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(sem->acquire(kLong).ok()) << "unit " << i;
  for (Process& p : children) EXPECT_EQ(JoinFailure(p), "");
  EXPECT_EQ(sem->get_value(), 0);
  absl::Status s = sem->acquire(absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST_P(SynchronizeTest, BoundedSemaphoreAdmitsAtMostItsValue) {
  absl::StatusOr<BoundedSemaphore> sem = BoundedSemaphore::create(2);
  absl::StatusOr<Lock> lock = Lock::create();
  ASSERT_TRUE(sem.ok() && lock.ok());
  Tensor inside = zeros({2}, TensorOptions().dtype(Dtype::kInt64));
  ASSERT_TRUE(share_memory_(inside).ok());
  std::vector<Process> children;
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<Process> p =
        Start("bounded_holder", {Value(*sem), Value(inside), Value(*lock)}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    children.push_back(*std::move(p));
  }
  for (Process& p : children) EXPECT_EQ(JoinFailure(p), "");
  EXPECT_EQ(inside.data_ptr<int64_t>()[0], 0);
  EXPECT_GE(inside.data_ptr<int64_t>()[1], 1);
  EXPECT_LE(inside.data_ptr<int64_t>()[1], 2);
  EXPECT_EQ(sem->get_value(), 2);
}

TEST(SemaphoreTest, MisuseIsAnError) {
  EXPECT_TRUE(absl::IsInvalidArgument(Semaphore::create(-1).status()));
  EXPECT_THAT(Semaphore::create(int64_t{1} << 40).status().message(), HasSubstr("1099511627776"));
  absl::StatusOr<BoundedSemaphore> bounded = BoundedSemaphore::create(1);
  ASSERT_TRUE(bounded.ok());
  absl::Status s = bounded->release();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("released too many times"));
  EXPECT_EQ(bounded->get_value(), 1);
  absl::StatusOr<Semaphore> sem = Semaphore::create(0);
  ASSERT_TRUE(sem.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(sem->release(0)));
  EXPECT_TRUE(sem->release(2).ok());
  EXPECT_EQ(sem->get_value(), 2);
}

// --- Event -----------------------------------------------------------------------

TEST_P(SynchronizeTest, EventWakesEveryWaitingChild) {
  absl::StatusOr<Event> event = Event::create();
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(event.ok() && q.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(event->wait(absl::Milliseconds(30))));
  std::vector<Process> children;
  std::set<int64_t> pids;
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<Process> p = Start("event_wait", {Value(*event), Value(*q)}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    pids.insert(p->pid());
    children.push_back(*std::move(p));
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(q->get(absl::Milliseconds(200)).status()));
  event->set();
  EXPECT_TRUE(event->is_set());
  std::set<int64_t> woke;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Value> v = q->get(kLong);
    ASSERT_TRUE(v.ok()) << v.status();
    woke.insert(v->as<int64_t>().value());
  }
  EXPECT_EQ(woke, pids);
  for (Process& p : children) EXPECT_EQ(JoinFailure(p), "");
  event->clear();
  EXPECT_FALSE(event->is_set());
}

// --- Condition -------------------------------------------------------------------

TEST_P(SynchronizeTest, ConditionNotifyAllWakesChildrenWaitingForAState) {
  absl::StatusOr<Condition> cond = Condition::create();
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(cond.ok() && q.ok());
  Tensor box = zeros({1}, TensorOptions().dtype(Dtype::kInt64));
  ASSERT_TRUE(share_memory_(box).ok());
  std::vector<Process> children;
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<Process> p =
        Start("condition_consumer", {Value(*cond), Value(box), Value(*q)}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    children.push_back(*std::move(p));
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(q->get(absl::Milliseconds(200)).status()));
  ASSERT_TRUE(cond->acquire(kLong).ok());
  box.data_ptr<int64_t>()[0] = 42;
  ASSERT_TRUE(cond->notify_all().ok());
  ASSERT_TRUE(cond->release().ok());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Value> v = q->get(kLong);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->as<int64_t>().value(), 42);
  }
  for (Process& p : children) EXPECT_EQ(JoinFailure(p), "");
}

TEST(ConditionTest, MisuseAndTimeouts) {
  absl::StatusOr<Lock> lock = Lock::create();
  ASSERT_TRUE(lock.ok());
  absl::StatusOr<Condition> cond = Condition::create(*lock);
  ASSERT_TRUE(cond.ok());
  absl::Status s = cond->wait(absl::Milliseconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("acquire it first"));
  EXPECT_TRUE(absl::IsFailedPrecondition(cond->notify()));
  ASSERT_TRUE(cond->acquire().ok());
  s = cond->wait(absl::Milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(lock->is_owned());  // taken back after the timeout
  s = cond->wait_for([] { return false; }, absl::Milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(cond->wait_for([] { return true; }, absl::ZeroDuration()).ok());
  EXPECT_TRUE(cond->release().ok());

  // An RLock held twice is released fully while waiting and held twice after.
  absl::StatusOr<RLock> rlock = RLock::create();
  ASSERT_TRUE(rlock.ok());
  absl::StatusOr<Condition> rcond = Condition::create(*rlock);
  ASSERT_TRUE(rcond.ok());
  ASSERT_TRUE(rlock->acquire().ok());
  ASSERT_TRUE(rlock->acquire().ok());
  bool other_got_it = false;
  std::thread other([&] {
    if (rlock->acquire(kLong).ok()) {
      other_got_it = true;
      (void)rcond->notify();
      (void)rlock->release();
    }
  });
  EXPECT_TRUE(rcond->wait_for([&] { return other_got_it; }, kLong).ok());
  other.join();
  EXPECT_TRUE(rlock->release().ok());
  EXPECT_TRUE(rlock->release().ok());
  EXPECT_FALSE(rlock->is_owned());
}

// --- Barrier ---------------------------------------------------------------------

TEST_P(SynchronizeTest, BarrierLetsAllPartiesThroughWithDistinctIndices) {
  absl::StatusOr<Barrier> barrier = Barrier::create(3);
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(barrier.ok() && q.ok());
  std::vector<Process> children;
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<Process> p = Start(
        "barrier_rounds", {Value(*barrier), Value(int64_t{3}), Value(*q), Value(int64_t{-1})}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    children.push_back(*std::move(p));
  }
  std::vector<std::set<int64_t>> indices(3);
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<int> index = barrier->wait(kLong);
    ASSERT_TRUE(index.ok()) << index.status();
    indices[r].insert(*index);
  }
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<Value> v = q->get(kLong);
    ASSERT_TRUE(v.ok()) << v.status();
    indices[v->list()[0].as<int64_t>().value()].insert(v->list()[1].as<int64_t>().value());
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(indices[r], (std::set<int64_t>{0, 1, 2})) << "round " << r;
  for (Process& p : children) EXPECT_EQ(JoinFailure(p), "");
  EXPECT_EQ(barrier->n_waiting(), 0);
  EXPECT_FALSE(barrier->broken());
}

TEST_P(SynchronizeTest, APartyThatDiesBreaksTheBarrierForTheOthers) {
  absl::StatusOr<Barrier> barrier = Barrier::create(3);
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(barrier.ok() && q.ok());
  // Rank 1 dies after the first round; rank 0 would wait a long time for it.
  std::vector<Process> children;
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<Process> p = Start(
        "barrier_rounds",
        {Value(*barrier), Value(int64_t{2}), Value(*q), Value(int64_t{rank == 1 ? 0 : -1})}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    children.push_back(*std::move(p));
  }
  ASSERT_TRUE(barrier->wait(kLong).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<int> second = barrier->wait(kLong);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_TRUE(absl::IsAborted(second.status())) << second.status();
  const std::string dead =
      absl::StrCat("process ", children[1].pid(), ", a party of this barrier, ended");
  EXPECT_THAT(second.status().message(), HasSubstr("BrokenBarrierError"));
  EXPECT_THAT(second.status().message(), HasSubstr(dead));
  EXPECT_THAT(JoinFailure(children[0]), HasSubstr(dead));
  EXPECT_THAT(JoinFailure(children[1]), HasSubstr("SIGKILL"));
  EXPECT_TRUE(barrier->broken());
  barrier->reset();
  EXPECT_FALSE(barrier->broken());
}

TEST_P(SynchronizeTest, ATimedOutPartyBreaksTheBarrierForTheOthers) {
  absl::StatusOr<Barrier> barrier = Barrier::create(3);
  absl::StatusOr<Queue> q = Queue::create();
  ASSERT_TRUE(barrier.ok() && q.ok());
  absl::StatusOr<Process> p = Start(
      "barrier_rounds", {Value(*barrier), Value(int64_t{1}), Value(*q), Value(int64_t{-1})});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(testing::WaitUntil([&] { return barrier->n_waiting() == 1; }, kLong));
  absl::StatusOr<int> mine = barrier->wait(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(mine.status())) << mine.status();
  EXPECT_THAT(mine.status().message(), HasSubstr("the barrier is now broken"));
  const std::string failure = JoinFailure(*p);
  EXPECT_THAT(failure, HasSubstr("BrokenBarrierError"));
  EXPECT_THAT(failure, HasSubstr(absl::StrCat("process ", ::getpid(), " timed out")));
  EXPECT_TRUE(absl::IsAborted(barrier->wait(absl::Seconds(1)).status()));
}

TEST(BarrierTest, AbortResetAndBadParties) {
  EXPECT_TRUE(absl::IsInvalidArgument(Barrier::create(0).status()));
  absl::StatusOr<Barrier> barrier = Barrier::create(2);
  ASSERT_TRUE(barrier.ok());
  EXPECT_EQ(barrier->parties(), 2);
  absl::StatusOr<int> waiter_result;
  std::thread waiter([&] { waiter_result = barrier->wait(kLong); });
  ASSERT_TRUE(testing::WaitUntil([&] { return barrier->n_waiting() == 1; }, kLong));
  barrier->abort();
  waiter.join();
  EXPECT_TRUE(absl::IsAborted(waiter_result.status())) << waiter_result.status();
  EXPECT_THAT(waiter_result.status().message(), HasSubstr("called abort()"));
  EXPECT_TRUE(absl::IsAborted(barrier->wait(absl::Seconds(1)).status()));
  barrier->reset();
  std::thread other([&] { waiter_result = barrier->wait(kLong); });
  absl::StatusOr<int> mine = barrier->wait(kLong);
  other.join();
  ASSERT_TRUE(mine.ok() && waiter_result.ok());
  EXPECT_EQ(*mine + *waiter_result, 1);  // indices 0 and 1
}

// --- Values ------------------------------------------------------------------------

TEST(SyncValueTest, PrimitivesCrossAQueueAsTheSameObject) {
  absl::StatusOr<Lock> lock = Lock::create();
  absl::StatusOr<Event> event = Event::create();
  absl::StatusOr<Condition> cond = Condition::create();
  absl::StatusOr<SimpleQueue> q = SimpleQueue::create();
  ASSERT_TRUE(lock.ok() && event.ok() && cond.ok() && q.ok());
  ASSERT_TRUE(
      q->put(Value(Value::List{Value(*lock), Value(*event), Value(*cond)}), absl::Seconds(5)).ok());
  absl::StatusOr<Value> v = q->get(absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->list().size(), 3u);
  EXPECT_EQ(v->list()[0].kind(), "lock");
  EXPECT_EQ(v->list()[1].kind(), "event");
  EXPECT_EQ(v->list()[2].kind(), "condition");
  absl::StatusOr<Lock> got = v->list()[0].as<Lock>();
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->acquire().ok());
  EXPECT_TRUE(lock->is_owned());  // the same lock
  EXPECT_TRUE(lock->release().ok());
  v->list()[1].as<Event>()->set();
  EXPECT_TRUE(event->is_set());
  absl::StatusOr<Event> wrong = v->list()[0].as<Event>();
  EXPECT_TRUE(absl::IsInvalidArgument(wrong.status()));
  EXPECT_THAT(wrong.status().message(), HasSubstr("expected a event value, got lock"));
}

}  // namespace
}  // namespace ember::multiprocessing
