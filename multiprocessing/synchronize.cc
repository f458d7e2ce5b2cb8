#include "multiprocessing/synchronize.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "multiprocessing/message.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

// Note [Dead processes]
// A process can die anywhere, holding anything; a primitive shared with it
// must then fail loudly rather than hang or hand on half-written state.
//   - Lock / RLock: robust pthread mutexes. The kernel marks a robust mutex
//     whose owning thread ended, and the next locker gets EOWNERDEAD. That
//     locker records the owner's pid (kept in the page by every acquire) and
//     unlocks without pthread_mutex_consistent, which makes the mutex
//     permanently unusable (ENOTRECOVERABLE): that acquire and every later
//     one fail with Aborted naming the dead pid. Whatever the lock guarded
//     may be half-updated; a new Lock is the way on.
//   - Semaphore, Event, Condition: futex words. A dead process is simply no
//     longer on the futex's wait queue, so wake-ups go to the living.
//   - Barrier: its few fields are guarded by a robust mutex (a death inside
//     that short section breaks the barrier); each party's pid is recorded
//     with the generation it last reached. Waiters look every 50 ms for a
//     recorded party that has ended (gone, or a zombie) without reaching the
//     current generation, and break the barrier naming it. A party that never
//     reached the barrier before it died is not known to it: the waiters'
//     timeouts are what end their wait then.
// Every blocking call takes a timeout; a timed-out Barrier wait breaks the
// barrier for the others, as threading.Barrier does.

namespace internal {

enum class SyncKind : uint32_t {
  kLock = 1,
  kRLock,
  kSemaphore,
  kBoundedSemaphore,
  kEvent,
  kCondition,
  kBarrier,
};

// One page of shared memory: a memfd mapped MAP_SHARED, starting with a
// header that names what it holds.
class SyncPage {
 public:
  struct Header {
    uint32_t magic;
    SyncKind kind;
  };
  static constexpr uint32_t kMagic = 0x434e5953;  // "SYNC"

  // A new zeroed page of `size` bytes holding `kind`.
  static absl::StatusOr<std::shared_ptr<SyncPage>> Create(SyncKind kind, size_t size,
                                                          const char* what) {
    base::UniqueFd fd(::memfd_create(what, MFD_CLOEXEC));
    if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": cannot create its shared page: ", std::strerror(errno),
                       errno == EMFILE ? "; raise the descriptor limit (ulimit -n)" : ""));
    }
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<SyncPage> page, Map(std::move(fd), size, what));
    page->header()->magic = kMagic;
    page->header()->kind = kind;
    return page;
  }

  // The page of a received descriptor, checked to hold `kind`.
  static absl::StatusOr<std::shared_ptr<SyncPage>> Open(base::UniqueFd fd, SyncKind kind,
                                                        size_t size, const char* what) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || st.st_size != static_cast<off_t>(size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed message: a ", what, "'s shared page has the wrong size"));
    }
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<SyncPage> page, Map(std::move(fd), size, what));
    if (page->header()->magic != kMagic || page->header()->kind != kind) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed message: the shared page sent as a ", what, " is not one"));
    }
    return page;
  }

  ~SyncPage() {
    if (addr_ != nullptr) ::munmap(addr_, size_);
  }

  Header* header() { return static_cast<Header*>(addr_); }
  template <typename T>
  T* as() {
    return static_cast<T*>(addr_);
  }
  int fd() const { return fd_.get(); }
  SyncKind kind() { return header()->kind; }

 private:
  static absl::StatusOr<std::shared_ptr<SyncPage>> Map(base::UniqueFd fd, size_t size,
                                                       const char* what) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": mmap: ", std::strerror(errno)));
    }
    auto page = std::shared_ptr<SyncPage>(new SyncPage);
    page->fd_ = std::move(fd);
    page->addr_ = p;
    page->size_ = size;
    return page;
  }
  SyncPage() = default;

  base::UniqueFd fd_;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace internal

using internal::SyncKind;
using internal::SyncPage;

namespace {

// --- Identity, cached per thread ------------------------------------------

struct Self {
  pid_t pid = 0;
  pid_t tid = 0;
};
thread_local Self t_self;

const Self& Me() {
  if (t_self.tid == 0) {
    static const bool registered = [] {
      // The forking thread is the child's only thread: it gets a new pid
      // and tid there.
      ::pthread_atfork(nullptr, nullptr, [] { t_self = Self(); });
      return true;
    }();
    (void)registered;
    t_self.pid = ::getpid();
    t_self.tid = static_cast<pid_t>(::syscall(SYS_gettid));
  }
  return t_self;
}

// Whether process `pid` has ended (gone, or a zombie not yet reaped).
bool ProcessEnded(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

// --- Futexes (process-shared: no FUTEX_PRIVATE_FLAG) ----------------------

uint32_t* Word(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint32_t>::is_always_lock_free);

absl::Time DeadlineOf(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

// Sleeps while *word == expected, until woken or `deadline`. False when the
// deadline has passed.
bool FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (deadline != absl::InfiniteFuture()) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    ts = absl::ToTimespec(left);
    tsp = &ts;
  }
  ::syscall(SYS_futex, Word(word), FUTEX_WAIT, expected, tsp, nullptr, 0);
  return true;
}

void FutexWake(std::atomic<uint32_t>* word, int n) {
  ::syscall(SYS_futex, Word(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

// --- Lock and RLock -------------------------------------------------------

struct MutexPage {
  SyncPage::Header header;
  pthread_mutex_t mu;
  std::atomic<int32_t> owner_pid;   // 0 while free
  std::atomic<int32_t> owner_tid;   // 0 while free
  int32_t depth;                    // acquires by the owner (RLock), under mu
  std::atomic<int32_t> dead_owner;  // set once an owner died holding it (-1: pid unknown)
};

const char* MutexName(SyncPage& page) { return page.kind() == SyncKind::kRLock ? "RLock" : "Lock"; }

absl::StatusOr<std::shared_ptr<SyncPage>> CreateMutex(SyncKind kind) {
  const char* name = kind == SyncKind::kRLock ? "RLock" : "Lock";
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<SyncPage> page,
                         SyncPage::Create(kind, sizeof(MutexPage), name));
  MutexPage* m = page->as<MutexPage>();
  pthread_mutexattr_t attr;
  ::pthread_mutexattr_init(&attr);
  ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  ::pthread_mutexattr_settype(
      &attr, kind == SyncKind::kRLock ? PTHREAD_MUTEX_RECURSIVE : PTHREAD_MUTEX_ERRORCHECK);
  const int r = ::pthread_mutex_init(&m->mu, &attr);
  ::pthread_mutexattr_destroy(&attr);
  if (r != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": pthread_mutex_init: ", std::strerror(r)));
  }
  return page;
}

absl::Status DeadOwner(const char* name, int32_t pid) {
  return absl::AbortedError(absl::StrCat(
      name, ": ", pid > 0 ? absl::StrCat("process ", pid) : std::string("a process (pid unknown)"),
      " died while holding this lock, so what it guarded may be half-updated; the lock cannot be "
      "acquired any more (create a new one)"));
}

// Why pthread_mutex_*lock returned `r` != 0, as a Status; the slow path,
// out of line so that the common one stays small.
[[gnu::noinline, gnu::cold]] absl::Status AcquireFailed(SyncPage& page, int r,
                                                        absl::Duration timeout) {
  MutexPage* m = page.as<MutexPage>();
  const char* name = MutexName(page);
  switch (r) {
    case EOWNERDEAD: {  // Note [Dead processes]
      const int32_t dead = m->owner_pid.load();
      m->dead_owner.store(dead > 0 ? dead : -1);
      m->owner_pid.store(0);
      m->owner_tid.store(0);
      m->depth = 0;
      ::pthread_mutex_unlock(&m->mu);  // not made consistent: unusable from now on
      return DeadOwner(name, dead);
    }
    case ENOTRECOVERABLE:
      return DeadOwner(name, m->dead_owner.load());
    case EBUSY:
    case ETIMEDOUT:
      return absl::DeadlineExceededError(
          absl::StrCat(name, ".acquire: still held by process ", m->owner_pid.load(), " after ",
                       absl::FormatDuration(std::max(timeout, absl::ZeroDuration()))));
    case EDEADLK:
      return absl::FailedPreconditionError(
          absl::StrCat(name,
                       ".acquire: this thread already holds the lock, and a Lock is not "
                       "reentrant (use RLock to acquire it again)"));
    case EAGAIN:
      return absl::ResourceExhaustedError(
          absl::StrCat(name, ".acquire: the maximum recursion depth is reached"));
    default:
      return absl::InternalError(absl::StrCat(name, ".acquire: ", std::strerror(r)));
  }
}

[[gnu::noinline]] int TimedLock(pthread_mutex_t* mu, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return ::pthread_mutex_trylock(mu);
  timespec abs{};
  ::clock_gettime(CLOCK_MONOTONIC, &abs);
  const timespec add = absl::ToTimespec(timeout);
  abs.tv_sec += add.tv_sec;
  abs.tv_nsec += add.tv_nsec;
  if (abs.tv_nsec >= 1000000000) {
    abs.tv_sec += 1;
    abs.tv_nsec -= 1000000000;
  }
  return ::pthread_mutex_clocklock(mu, CLOCK_MONOTONIC, &abs);
}

absl::Status MutexAcquire(SyncPage& page, absl::Duration timeout) {
  MutexPage* m = page.as<MutexPage>();
  const int r = timeout == absl::InfiniteDuration() ? ::pthread_mutex_lock(&m->mu)
                                                    : TimedLock(&m->mu, timeout);
  if (r != 0) [[unlikely]] {
    return AcquireFailed(page, r, timeout);
  }
  const Self& me = Me();
  m->owner_pid.store(me.pid, std::memory_order_relaxed);
  m->owner_tid.store(me.tid, std::memory_order_relaxed);
  ++m->depth;
  return absl::OkStatus();
}

bool MutexOwned(SyncPage& page) {
  MutexPage* m = page.as<MutexPage>();
  const Self& me = Me();
  return m->owner_tid.load(std::memory_order_relaxed) == me.tid &&
         m->owner_pid.load(std::memory_order_relaxed) == me.pid;
}

[[gnu::noinline, gnu::cold]] absl::Status NotHeld(SyncPage& page) {
  const int32_t owner = page.as<MutexPage>()->owner_pid.load();
  return absl::FailedPreconditionError(absl::StrCat(
      MutexName(page), ".release: this thread does not hold the lock (",
      owner == 0 ? std::string("nobody does")
                 : absl::StrCat("process ", owner, owner == Me().pid ? ", another thread," : "",
                                " holds it"),
      ")"));
}

absl::Status MutexRelease(SyncPage& page) {
  MutexPage* m = page.as<MutexPage>();
  if (!MutexOwned(page)) [[unlikely]] {
    return NotHeld(page);
  }
  if (--m->depth == 0) {
    m->owner_pid.store(0, std::memory_order_relaxed);
    m->owner_tid.store(0, std::memory_order_relaxed);
  }
  const int r = ::pthread_mutex_unlock(&m->mu);
  if (r != 0) [[unlikely]] {
    return absl::InternalError(absl::StrCat(MutexName(page), ".release: ", std::strerror(r)));
  }
  return absl::OkStatus();
}

// --- Semaphore --------------------------------------------------------------

struct SemaphorePage {
  SyncPage::Header header;
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
  uint32_t bound;  // BoundedSemaphore's initial value; 0: unbounded
};

constexpr int64_t kMaxSemaphoreValue = INT_MAX;

absl::StatusOr<std::shared_ptr<SyncPage>> CreateSemaphore(SyncKind kind, int64_t value) {
  const char* name = kind == SyncKind::kBoundedSemaphore ? "BoundedSemaphore" : "Semaphore";
  if (value < 0 || value > kMaxSemaphoreValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": value must be in [0, ", kMaxSemaphoreValue, "], got ", value));
  }
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<SyncPage> page,
                         SyncPage::Create(kind, sizeof(SemaphorePage), name));
  SemaphorePage* s = page->as<SemaphorePage>();
  s->value.store(static_cast<uint32_t>(value));
  s->bound = kind == SyncKind::kBoundedSemaphore ? static_cast<uint32_t>(value) : 0;
  return page;
}

absl::Status SemaphoreAcquire(SyncPage& page, absl::Duration timeout, const char* name) {
  SemaphorePage* s = page.as<SemaphorePage>();
  const absl::Time deadline = DeadlineOf(timeout);
  while (true) {
    uint32_t v = s->value.load();
    while (v > 0) {
      if (s->value.compare_exchange_weak(v, v - 1)) return absl::OkStatus();
    }
    s->waiters.fetch_add(1);
    const bool in_time = FutexWait(&s->value, 0, deadline);
    s->waiters.fetch_sub(1);
    if (!in_time) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, ".acquire: no unit became free within ",
                       absl::FormatDuration(std::max(timeout, absl::ZeroDuration()))));
    }
  }
}

absl::Status SemaphoreRelease(SyncPage& page, int64_t n, const char* name) {
  SemaphorePage* s = page.as<SemaphorePage>();
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".release: n must be >= 1, got ", n));
  }
  uint32_t v = s->value.load();
  while (true) {
    const int64_t next = static_cast<int64_t>(v) + n;
    if (s->bound != 0 && next > s->bound) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, ".release: released too many times (the value would be ", next,
                       ", above its initial ", s->bound, ")"));
    }
    if (next > kMaxSemaphoreValue) {
      return absl::OutOfRangeError(absl::StrCat(name, ".release: the value would be ", next,
                                                ", above ", kMaxSemaphoreValue));
    }
    if (s->value.compare_exchange_weak(v, static_cast<uint32_t>(next))) break;
  }
  if (s->waiters.load() > 0) FutexWake(&s->value, static_cast<int>(std::min<int64_t>(n, INT_MAX)));
  return absl::OkStatus();
}

// --- Event and Condition ------------------------------------------------------

struct WordPage {
  SyncPage::Header header;
  std::atomic<uint32_t> word;  // Event: the flag; Condition: the notify count
};

// --- Barrier -------------------------------------------------------------------

constexpr int kMaxRecordedParties = 64;
constexpr absl::Duration kBarrierCheckInterval = absl::Milliseconds(50);

struct BarrierPage {
  SyncPage::Header header;
  pthread_mutex_t mu;  // robust; guards everything below but `wake`
  std::atomic<int32_t> mu_owner;
  uint32_t parties;
  uint32_t count;              // arrived in the current generation
  uint64_t generation;         // advances when a generation passes or breaks
  uint64_t passed;             // the last generation that passed (~0: none)
  uint32_t broken;             // until reset
  char reason[256];            // why it broke
  std::atomic<uint32_t> wake;  // bumped at every advance (the futex word)
  struct Party {
    int32_t pid;
    uint64_t reached;  // the generation it last reached
  } recorded[kMaxRecordedParties];
};

// Holds a Barrier's mutex; a process that died holding it breaks the barrier.
class BarrierGuard {
 public:
  explicit BarrierGuard(BarrierPage* b);
  ~BarrierGuard() {
    b_->mu_owner.store(0);
    ::pthread_mutex_unlock(&b_->mu);
  }

 private:
  BarrierPage* b_;
};

// Advances `b` to the next generation, broken for its waiters with `why`
// (they read b->reason). Holds b->mu.
void BreakLocked(BarrierPage* b, const std::string& why, bool stay_broken) {
  std::snprintf(b->reason, sizeof(b->reason), "%s", why.c_str());
  b->broken = stay_broken ? 1 : 0;
  if (b->count > 0) {
    b->count = 0;
    ++b->generation;
  }
  b->wake.fetch_add(1);
  FutexWake(&b->wake, INT_MAX);
}

BarrierGuard::BarrierGuard(BarrierPage* b) : b_(b) {
  const int r = ::pthread_mutex_lock(&b->mu);
  if (r == EOWNERDEAD) {  // Note [Dead processes]
    ::pthread_mutex_consistent(&b->mu);
    BreakLocked(
        b, absl::StrCat("process ", b->mu_owner.load(), " died while updating the barrier's state"),
        /*stay_broken=*/true);
  }
  b->mu_owner.store(Me().pid);
}

absl::Status Broken(const char* reason) {
  return absl::AbortedError(absl::StrCat("Barrier is broken (BrokenBarrierError): ", reason));
}

void RecordArrival(BarrierPage* b, pid_t pid) {
  int free_slot = -1;
  for (int i = 0; i < kMaxRecordedParties; ++i) {
    if (b->recorded[i].pid == pid) {
      b->recorded[i].reached = b->generation;
      return;
    }
    if (b->recorded[i].pid == 0 && free_slot < 0) free_slot = i;
  }
  if (free_slot >= 0) b->recorded[free_slot] = {pid, b->generation};
}

// A recorded party that ended without reaching the current generation, or 0.
pid_t EndedParty(BarrierPage* b) {
  for (int i = 0; i < kMaxRecordedParties; ++i) {
    BarrierPage::Party& p = b->recorded[i];
    if (p.pid != 0 && p.reached != b->generation && ProcessEnded(p.pid)) {
      const pid_t pid = p.pid;
      p.pid = 0;
      return pid;
    }
  }
  return 0;
}

}  // namespace

// --- Value codecs -------------------------------------------------------------

struct SyncCodec {
  static std::shared_ptr<SyncPage> PageOf(const Value& v) {
    if (const Lock* l = v.get_if<Lock>()) return l->page_;
    if (const RLock* l = v.get_if<RLock>()) return l->page_;
    if (const Semaphore* s = v.get_if<Semaphore>()) return s->page_;
    if (const BoundedSemaphore* s = v.get_if<BoundedSemaphore>()) return s->sem_.page_;
    if (const Event* e = v.get_if<Event>()) return e->page_;
    if (const Barrier* b = v.get_if<Barrier>()) return b->page_;
    return nullptr;
  }

  static absl::StatusOr<std::string> Encode(const Value& value, std::vector<int>& fds) {
    if (const Condition* c = value.get_if<Condition>()) {
      fds.push_back(c->lock_->fd());
      fds.push_back(c->page_->fd());
      return std::string(1, c->lock_->kind() == SyncKind::kRLock ? 'r' : 'l');
    }
    std::shared_ptr<SyncPage> page = PageOf(value);
    if (page == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot send a ", std::string(value.kind()), " that was never created"));
    }
    fds.push_back(page->fd());
    return std::string();
  }

  template <typename T>
  static absl::StatusOr<Value> DecodeOne(std::vector<base::UniqueFd> fds, SyncKind kind,
                                         size_t size, const char* what) {
    T t;
    std::shared_ptr<SyncPage>* slot;
    if constexpr (std::is_same_v<T, BoundedSemaphore>) {
      slot = &t.sem_.page_;
    } else {
      slot = &t.page_;
    }
    EMBER_ASSIGN_OR_RETURN(*slot, SyncPage::Open(std::move(fds[0]), kind, size, what));
    return Value(std::move(t));
  }

  static absl::StatusOr<Value> DecodeCondition(std::vector<base::UniqueFd> fds,
                                               std::string_view state) {
    if (state.size() != 1 || (state[0] != 'r' && state[0] != 'l')) {
      return absl::InvalidArgumentError("malformed message: a condition's state is not valid");
    }
    Condition c;
    const bool recursive = state[0] == 'r';
    EMBER_ASSIGN_OR_RETURN(
        c.lock_, SyncPage::Open(std::move(fds[0]), recursive ? SyncKind::kRLock : SyncKind::kLock,
                                sizeof(MutexPage), "condition's lock"));
    EMBER_ASSIGN_OR_RETURN(c.page_, SyncPage::Open(std::move(fds[1]), SyncKind::kCondition,
                                                   sizeof(WordPage), "condition"));
    return Value(std::move(c));
  }

  static bool Register() {
    auto one = [](ChannelKind kind, auto decode) {
      RegisterChannelCodec(kind, {.encode = &SyncCodec::Encode, .decode = decode, .fds = 1});
    };
    one(ChannelKind::kLock, [](std::vector<base::UniqueFd> fds, std::string_view) {
      return DecodeOne<Lock>(std::move(fds), SyncKind::kLock, sizeof(MutexPage), "lock");
    });
    one(ChannelKind::kRLock, [](std::vector<base::UniqueFd> fds, std::string_view) {
      return DecodeOne<RLock>(std::move(fds), SyncKind::kRLock, sizeof(MutexPage), "rlock");
    });
    one(ChannelKind::kSemaphore, [](std::vector<base::UniqueFd> fds, std::string_view) {
      return DecodeOne<Semaphore>(std::move(fds), SyncKind::kSemaphore, sizeof(SemaphorePage),
                                  "semaphore");
    });
    one(ChannelKind::kBoundedSemaphore, [](std::vector<base::UniqueFd> fds, std::string_view) {
      return DecodeOne<BoundedSemaphore>(std::move(fds), SyncKind::kBoundedSemaphore,
                                         sizeof(SemaphorePage), "bounded_semaphore");
    });
    one(ChannelKind::kEvent, [](std::vector<base::UniqueFd> fds, std::string_view) {
      return DecodeOne<Event>(std::move(fds), SyncKind::kEvent, sizeof(WordPage), "event");
    });
    one(ChannelKind::kBarrier, [](std::vector<base::UniqueFd> fds, std::string_view) {
      return DecodeOne<Barrier>(std::move(fds), SyncKind::kBarrier, sizeof(BarrierPage), "barrier");
    });
    RegisterChannelCodec(
        ChannelKind::kCondition,
        {.encode = &SyncCodec::Encode, .decode = &SyncCodec::DecodeCondition, .fds = 2});
    return true;
  }
};

namespace {
const bool kCodecsRegistered = SyncCodec::Register();
}  // namespace

// --- Lock, RLock ------------------------------------------------------------------

absl::StatusOr<Lock> Lock::create() {
  (void)kCodecsRegistered;
  Lock l;
  EMBER_ASSIGN_OR_RETURN(l.page_, CreateMutex(SyncKind::kLock));
  return l;
}
absl::Status Lock::acquire(absl::Duration timeout) { return MutexAcquire(*page_, timeout); }
absl::Status Lock::release() { return MutexRelease(*page_); }
bool Lock::is_owned() const { return MutexOwned(*page_); }
pid_t Lock::owner() const { return page_->as<MutexPage>()->owner_pid.load(); }

absl::StatusOr<RLock> RLock::create() {
  (void)kCodecsRegistered;
  RLock l;
  EMBER_ASSIGN_OR_RETURN(l.page_, CreateMutex(SyncKind::kRLock));
  return l;
}
absl::Status RLock::acquire(absl::Duration timeout) { return MutexAcquire(*page_, timeout); }
absl::Status RLock::release() { return MutexRelease(*page_); }
bool RLock::is_owned() const { return MutexOwned(*page_); }
pid_t RLock::owner() const { return page_->as<MutexPage>()->owner_pid.load(); }

// --- Semaphore, BoundedSemaphore -------------------------------------------------

absl::StatusOr<Semaphore> Semaphore::create(int64_t value) {
  (void)kCodecsRegistered;
  Semaphore s;
  EMBER_ASSIGN_OR_RETURN(s.page_, CreateSemaphore(SyncKind::kSemaphore, value));
  return s;
}
absl::Status Semaphore::acquire(absl::Duration timeout) {
  return SemaphoreAcquire(*page_, timeout, "Semaphore");
}
absl::Status Semaphore::release(int64_t n) { return SemaphoreRelease(*page_, n, "Semaphore"); }
int64_t Semaphore::get_value() const { return page_->as<SemaphorePage>()->value.load(); }

absl::StatusOr<BoundedSemaphore> BoundedSemaphore::create(int64_t value) {
  (void)kCodecsRegistered;
  BoundedSemaphore s;
  EMBER_ASSIGN_OR_RETURN(s.sem_.page_, CreateSemaphore(SyncKind::kBoundedSemaphore, value));
  return s;
}
absl::Status BoundedSemaphore::acquire(absl::Duration timeout) {
  return SemaphoreAcquire(*sem_.page_, timeout, "BoundedSemaphore");
}
absl::Status BoundedSemaphore::release(int64_t n) {
  return SemaphoreRelease(*sem_.page_, n, "BoundedSemaphore");
}
int64_t BoundedSemaphore::get_value() const { return sem_.get_value(); }

// --- Event -------------------------------------------------------------------------

absl::StatusOr<Event> Event::create() {
  (void)kCodecsRegistered;
  Event e;
  EMBER_ASSIGN_OR_RETURN(e.page_, SyncPage::Create(SyncKind::kEvent, sizeof(WordPage), "Event"));
  return e;
}
bool Event::is_set() const { return page_->as<WordPage>()->word.load() != 0; }
void Event::set() {
  WordPage* w = page_->as<WordPage>();
  w->word.store(1);
  FutexWake(&w->word, INT_MAX);
}
void Event::clear() { page_->as<WordPage>()->word.store(0); }
absl::Status Event::wait(absl::Duration timeout) {
  WordPage* w = page_->as<WordPage>();
  const absl::Time deadline = DeadlineOf(timeout);
  while (w->word.load() == 0) {
    if (!FutexWait(&w->word, 0, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("Event.wait: not set within ",
                       absl::FormatDuration(std::max(timeout, absl::ZeroDuration()))));
    }
  }
  return absl::OkStatus();
}

// --- Condition -------------------------------------------------------------------

absl::StatusOr<Condition> Condition::create() {
  EMBER_ASSIGN_OR_RETURN(RLock lock, RLock::create());
  return create(lock);
}

absl::StatusOr<Condition> Condition::create(const Lock& lock) {
  Condition c;
  c.lock_ = lock.page_;
  EMBER_ASSIGN_OR_RETURN(c.page_,
                         SyncPage::Create(SyncKind::kCondition, sizeof(WordPage), "Condition"));
  return c;
}

absl::StatusOr<Condition> Condition::create(const RLock& lock) {
  Condition c;
  c.lock_ = lock.page_;
  EMBER_ASSIGN_OR_RETURN(c.page_,
                         SyncPage::Create(SyncKind::kCondition, sizeof(WordPage), "Condition"));
  return c;
}

absl::Status Condition::acquire(absl::Duration timeout) { return MutexAcquire(*lock_, timeout); }
absl::Status Condition::release() { return MutexRelease(*lock_); }

absl::Status Condition::wait(absl::Duration timeout) {
  if (!MutexOwned(*lock_)) {
    return absl::FailedPreconditionError(
        "Condition.wait: this thread does not hold the condition's lock; acquire it first");
  }
  WordPage* w = page_->as<WordPage>();
  MutexPage* m = lock_->as<MutexPage>();
  const absl::Time deadline = DeadlineOf(timeout);
  // Read under the lock: a notify after the release changes it, so the
  // sleep below cannot miss it.
  const uint32_t seen = w->word.load();
  const int32_t depth = m->depth;
  for (int32_t i = 0; i < depth; ++i) EMBER_RETURN_IF_ERROR(MutexRelease(*lock_));
  bool notified = true;
  while (w->word.load() == seen) {
    if (!FutexWait(&w->word, seen, deadline)) {
      notified = w->word.load() != seen;
      break;
    }
  }
  for (int32_t i = 0; i < depth; ++i) {
    EMBER_RETURN_IF_ERROR(MutexAcquire(*lock_, absl::InfiniteDuration()));
  }
  if (!notified) {
    return absl::DeadlineExceededError(
        absl::StrCat("Condition.wait: not notified within ",
                     absl::FormatDuration(std::max(timeout, absl::ZeroDuration()))));
  }
  return absl::OkStatus();
}

absl::Status Condition::wait_for(const std::function<bool()>& predicate, absl::Duration timeout) {
  const absl::Time deadline = DeadlineOf(timeout);
  while (!predicate()) {
    const absl::Duration left = deadline == absl::InfiniteFuture()
                                    ? absl::InfiniteDuration()
                                    : std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::Status s = wait(left);
    if (absl::IsDeadlineExceeded(s)) {
      if (predicate()) return absl::OkStatus();
      return absl::DeadlineExceededError(
          absl::StrCat("Condition.wait_for: the predicate stayed false for ",
                       absl::FormatDuration(std::max(timeout, absl::ZeroDuration()))));
    }
    EMBER_RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

absl::Status Condition::notify(int n) {
  if (!MutexOwned(*lock_)) {
    return absl::FailedPreconditionError(
        "Condition.notify: this thread does not hold the condition's lock; acquire it first");
  }
  if (n < 1) return absl::OkStatus();
  WordPage* w = page_->as<WordPage>();
  w->word.fetch_add(1);
  FutexWake(&w->word, n);
  return absl::OkStatus();
}

absl::Status Condition::notify_all() { return notify(INT_MAX); }

// --- Barrier ------------------------------------------------------------------------

absl::StatusOr<Barrier> Barrier::create(int parties) {
  (void)kCodecsRegistered;
  if (parties < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Barrier: parties must be >= 1, got ", parties));
  }
  Barrier b;
  EMBER_ASSIGN_OR_RETURN(b.page_,
                         SyncPage::Create(SyncKind::kBarrier, sizeof(BarrierPage), "Barrier"));
  BarrierPage* p = b.page_->as<BarrierPage>();
  pthread_mutexattr_t attr;
  ::pthread_mutexattr_init(&attr);
  ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int r = ::pthread_mutex_init(&p->mu, &attr);
  ::pthread_mutexattr_destroy(&attr);
  if (r != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Barrier: pthread_mutex_init: ", std::strerror(r)));
  }
  p->parties = static_cast<uint32_t>(parties);
  p->passed = ~uint64_t{0};
  return b;
}

absl::StatusOr<int> Barrier::wait(absl::Duration timeout) {
  BarrierPage* b = page_->as<BarrierPage>();
  const pid_t me = Me().pid;
  const absl::Time deadline = DeadlineOf(timeout);
  uint64_t generation;
  int index;
  uint32_t wake;
  {
    BarrierGuard guard(b);
    if (b->broken) return Broken(b->reason);
    generation = b->generation;
    index = static_cast<int>(b->count++);
    RecordArrival(b, me);
    if (b->count == b->parties) {  // the last to arrive lets everyone through
      b->count = 0;
      b->passed = b->generation++;
      b->wake.fetch_add(1);
      FutexWake(&b->wake, INT_MAX);
      return index;
    }
    wake = b->wake.load();
  }
  while (true) {
    const absl::Time until = std::min(deadline, absl::Now() + kBarrierCheckInterval);
    FutexWait(&b->wake, wake, until);
    BarrierGuard guard(b);
    if (b->generation != generation) {
      if (b->passed == generation) return index;
      return Broken(b->reason);
    }
    if (pid_t ended = EndedParty(b); ended != 0) {
      BreakLocked(
          b, absl::StrCat("process ", ended, ", a party of this barrier, ended before reaching it"),
          /*stay_broken=*/true);
      return Broken(b->reason);
    }
    if (absl::Now() >= deadline) {
      const std::string why =
          absl::StrCat("process ", me, " timed out after ", absl::FormatDuration(timeout), " with ",
                       b->count, " of ", b->parties, " parties waiting");
      BreakLocked(b, why, /*stay_broken=*/true);
      return absl::DeadlineExceededError(
          absl::StrCat("Barrier.wait: ", why, "; the barrier is now broken"));
    }
    wake = b->wake.load();
  }
}

void Barrier::abort() {
  BarrierPage* b = page_->as<BarrierPage>();
  BarrierGuard guard(b);
  BreakLocked(b, absl::StrCat("process ", Me().pid, " called abort()"), /*stay_broken=*/true);
}

void Barrier::reset() {
  BarrierPage* b = page_->as<BarrierPage>();
  BarrierGuard guard(b);
  BreakLocked(b, absl::StrCat("process ", Me().pid, " called reset() while it was waited on"),
              /*stay_broken=*/false);
}

int Barrier::parties() const { return static_cast<int>(page_->as<BarrierPage>()->parties); }

int Barrier::n_waiting() const {
  BarrierPage* b = page_->as<BarrierPage>();
  BarrierGuard guard(b);
  return static_cast<int>(b->count);
}

bool Barrier::broken() const {
  BarrierPage* b = page_->as<BarrierPage>();
  BarrierGuard guard(b);
  return b->broken != 0;
}

}  // namespace ember::multiprocessing
