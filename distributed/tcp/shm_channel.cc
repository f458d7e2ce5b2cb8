#include "distributed/tcp/shm_channel.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "distributed/peer_process.h"

namespace ember::distributed::tcp {

// One direction. Head and tail count bytes ever written/read; they sit on
// separate cache lines so that writer and reader do not share one.
struct ShmChannel::Ring {
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> space_seq;  // futex word: bumped when the reader frees room
  std::atomic<uint32_t> writer_sleeping;
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> data_seq;  // futex word: bumped when the writer publishes
  std::atomic<uint32_t> reader_sleeping;
  char pad[64 - 16];
};
static_assert(sizeof(ShmChannel::Ring) == 128);

namespace {

constexpr size_t kControlBytes = 4096;      // both Ring blocks, page aligned
constexpr size_t kPublishBytes = 64 << 10;  // writer publishes its head this often

}  // namespace

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Create(const ShmChannelOptions& options) {
  if (options.ring_bytes == 0 || options.ring_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory ring size ", options.ring_bytes,
                                                   " is not a positive multiple of 4096"));
  }
  // A fresh segment is zero-filled: both rings start empty.
  auto segment =
      SharedMapping::create_memfd("ember-tcp-ring", kControlBytes + 2 * options.ring_bytes);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<ShmChannel>(new ShmChannel(std::move(*segment), true, options));
}

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Open(const std::string& locator,
                                                             const ShmChannelOptions& options) {
  auto segment = OpenLocator(locator, kControlBytes + 2 * options.ring_bytes,
                             absl::StrCat("rank ", options.peer_rank, "'s ring"));
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<ShmChannel>(new ShmChannel(std::move(*segment), false, options));
}

ShmChannel::ShmChannel(SharedMapping segment, bool creator, const ShmChannelOptions& options)
    : segment_(std::move(segment)), capacity_(options.ring_bytes), options_(options) {
  Ring* rings = reinterpret_cast<Ring*>(segment_.data());
  char* data = segment_.data() + kControlBytes;
  out_ = creator ? &rings[0] : &rings[1];
  in_ = creator ? &rings[1] : &rings[0];
  out_data_ = creator ? data : data + capacity_;
  in_data_ = creator ? data + capacity_ : data;
}

ShmChannel::~ShmChannel() = default;

std::string ShmChannel::Locator() const { return LocatorOf(segment_); }

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
        return absl::DeadlineExceededError(absl::StrCat(
            "timed out writing to rank ", options_.peer_rank, ", which stopped reading (process ",
            options_.peer_pid > 0 ? ProcessState(options_.peer_pid) : "unknown", ")"));
      }
      continue;
    }
    const size_t offset = head % capacity_;
    const size_t k = std::min(
        {n, static_cast<size_t>(capacity_ - (head - tail)), capacity_ - offset, kPublishBytes});
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
    auto ready = [&] { return available() >= min_bytes || woken_.load(std::memory_order_relaxed); };
    absl::StatusOr<bool> ok =
        WaitUntil(ready, in_->reader_sleeping, in_->data_seq, absl::Now() + wait, interrupted_,
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
