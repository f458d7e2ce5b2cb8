#include "distributed/tcp/shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::distributed::tcp {

// One direction. Head and tail count bytes ever written/read; they sit on
// separate cache lines so that writer and reader do not share one.
struct ShmChannel::Ring {
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> space_seq;       // futex word: bumped when the reader frees room
  std::atomic<uint32_t> writer_sleeping;
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> data_seq;        // futex word: bumped when the writer publishes
  std::atomic<uint32_t> reader_sleeping;
  char pad[64 - 16];
};
static_assert(sizeof(ShmChannel::Ring) == 128);

namespace {

constexpr size_t kControlBytes = 4096;  // both Ring blocks, page aligned
constexpr size_t kPublishBytes = 64 << 10;  // writer publishes its head this often
constexpr int kSpins = 400;
constexpr int kYields = 200;
constexpr absl::Duration kSleepSlice = absl::Milliseconds(50);

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Wakes the sleeper flagged by `sleeping` after a store it should see.
void Notify(std::atomic<uint32_t>& sleeping, std::atomic<uint32_t>& seq) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_relaxed)) {
    sleeping.store(0, std::memory_order_relaxed);
    seq.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&seq);
  }
}

// Spins, yields, then sleeps on `seq` until ready() or `until`. Returns
// whether ready() held. `on_slice` runs after each sleep slice (liveness).
template <typename Ready, typename OnSlice>
absl::StatusOr<bool> WaitUntil(Ready ready, std::atomic<uint32_t>& sleeping,
                               std::atomic<uint32_t>& seq, absl::Time until,
                               const std::atomic<bool>& interrupted, OnSlice on_slice) {
  for (int i = 0; i < kSpins; ++i) {
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

}  // namespace

std::string ProcessState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return "exited";
  size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return "unknown";
  switch (line[paren + 2]) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible I/O";
    case 'T': return "stopped";
    case 't': return "stopped by a debugger";
    case 'Z':
    case 'X': return "exited";
    default: return "unknown";
  }
}

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Create(
    const ShmChannelOptions& options) {
  if (options.ring_bytes == 0 || options.ring_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory ring size ", options.ring_bytes, " is not a positive multiple of 4096"));
  }
  Fd fd(static_cast<int>(syscall(SYS_memfd_create, "ember-tcp-ring", 0)));
  if (!fd.valid()) {
    return absl::UnavailableError(absl::StrCat("memfd_create failed: ", strerror(errno)));
  }
  const size_t bytes = kControlBytes + 2 * options.ring_bytes;
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("ftruncate of a ", bytes, "-byte memfd failed: ", strerror(errno)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("mmap of the ring failed: ", strerror(errno)));
  }
  // A fresh memfd is zero-filled: both rings start empty.
  return std::unique_ptr<ShmChannel>(
      new ShmChannel(std::move(fd), base, bytes, options.ring_bytes, true, options));
}

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Open(const std::string& locator,
                                                             const ShmChannelOptions& options) {
  std::vector<std::string> parts = absl::StrSplit(locator, ':');
  int pid = 0, remote_fd = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pid) ||
      !absl::SimpleAtoi(parts[1], &remote_fd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed shared-memory locator '", locator, "'"));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", remote_fd);
  Fd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::UnavailableError(
        absl::StrCat("cannot open rank ", options.peer_rank, "'s ring ", path, ": ",
                     strerror(errno)));
  }
  const size_t bytes = kControlBytes + 2 * options.ring_bytes;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("mmap of ", path, " failed: ", strerror(errno)));
  }
  return std::unique_ptr<ShmChannel>(
      new ShmChannel(std::move(fd), base, bytes, options.ring_bytes, false, options));
}

ShmChannel::ShmChannel(Fd fd, void* base, size_t map_bytes, size_t ring_bytes, bool creator,
                       const ShmChannelOptions& options)
    : fd_(std::move(fd)),
      base_(base),
      map_bytes_(map_bytes),
      capacity_(ring_bytes),
      options_(options) {
  Ring* rings = static_cast<Ring*>(base);
  char* data = static_cast<char*>(base) + kControlBytes;
  out_ = creator ? &rings[0] : &rings[1];
  in_ = creator ? &rings[1] : &rings[0];
  out_data_ = creator ? data : data + ring_bytes;
  in_data_ = creator ? data + ring_bytes : data;
}

ShmChannel::~ShmChannel() { munmap(base_, map_bytes_); }

std::string ShmChannel::Locator() const { return absl::StrCat(getpid(), ":", fd_.get()); }

absl::Status ShmChannel::CheckPeerAlive() const {
  if (options_.peer_pid <= 0 || options_.peer_pid == getpid()) return absl::OkStatus();
  const std::string state = ProcessState(options_.peer_pid);
  if (state != "exited") return absl::OkStatus();
  return absl::UnavailableError("the peer process has exited");
}

absl::Status ShmChannel::Write(const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  uint64_t head = out_->head.load(std::memory_order_relaxed);
  while (n > 0) {
    uint64_t tail = out_->tail.load(std::memory_order_acquire);
    if (head - tail == capacity_) {
      auto has_room = [&] {
        return out_->tail.load(std::memory_order_acquire) + capacity_ != head;
      };
      absl::StatusOr<bool> ready =
          WaitUntil(has_room, out_->writer_sleeping, out_->space_seq, deadline, interrupted_,
                    [this] { return CheckPeerAlive(); });
      if (!ready.ok()) return ready.status();
      if (!*ready) {
        return absl::DeadlineExceededError(
            absl::StrCat("timed out writing to rank ", options_.peer_rank,
                         ", which stopped reading (process ",
                         options_.peer_pid > 0 ? ProcessState(options_.peer_pid) : "unknown",
                         ")"));
      }
      continue;
    }
    const size_t offset = head % capacity_;
    const size_t k = std::min({n, static_cast<size_t>(capacity_ - (head - tail)),
                               capacity_ - offset, kPublishBytes});
    std::memcpy(out_data_ + offset, p, k);
    head += k;
    p += k;
    n -= k;
    out_->head.store(head, std::memory_order_release);
    Notify(out_->reader_sleeping, out_->data_seq);
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const char>> ShmChannel::Peek(size_t min_bytes, absl::Duration wait) {
  const uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  auto available = [&] { return in_->head.load(std::memory_order_acquire) - tail; };
  if (available() < min_bytes) {
    auto ready = [&] {
      return available() >= min_bytes || woken_.load(std::memory_order_relaxed);
    };
    absl::StatusOr<bool> ok = WaitUntil(ready, in_->reader_sleeping, in_->data_seq,
                                        absl::Now() + wait, interrupted_,
                                        [this] { return CheckPeerAlive(); });
    if (!ok.ok()) return ok.status();
    if (woken_.exchange(false) && available() < min_bytes) return absl::Span<const char>();
    if (!*ok) {
      absl::Status alive = CheckPeerAlive();
      if (!alive.ok()) return alive;
      return absl::Span<const char>();
    }
  }
  const size_t offset = tail % capacity_;
  const size_t n = std::min(static_cast<size_t>(available()), capacity_ - offset);
  return absl::Span<const char>(in_data_ + offset, n);
}

void ShmChannel::Consume(size_t n) {
  if (n == 0) return;
  in_->tail.store(in_->tail.load(std::memory_order_relaxed) + n, std::memory_order_release);
  Notify(in_->writer_sleeping, in_->space_seq);
}

void ShmChannel::Wake() {
  woken_.store(true);
  in_->data_seq.fetch_add(1);
  FutexWakeAll(&in_->data_seq);
}

void ShmChannel::Interrupt() {
  interrupted_.store(true);
  // Wake this side's sleepers; they see `interrupted_` and return.
  in_->data_seq.fetch_add(1);
  FutexWakeAll(&in_->data_seq);
  out_->space_seq.fetch_add(1);
  FutexWakeAll(&out_->space_seq);
}

}  // namespace ember::distributed::tcp
