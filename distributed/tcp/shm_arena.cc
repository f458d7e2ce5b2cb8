#include "distributed/tcp/shm_arena.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/reduce.h"
#include "tensor/status_macros.h"

namespace ember::distributed::tcp {

// A rank's counters sit on their own cache lines: peers poll them while the
// owner works on the next chunk.
struct ShmArena::Control {
  alignas(64) std::atomic<uint64_t> published;  // chunks ever published (step 1)
  alignas(64) std::atomic<uint64_t> reduced;    // ... reduced (step 2)
  alignas(64) std::atomic<uint64_t> collected;  // ... collected (step 3)
  // The latest all_reduce announced: its sequence number + 1, stored last.
  alignas(64) std::atomic<uint64_t> announced;
  std::atomic<uint64_t> nbytes;
  std::atomic<uint64_t> base;  // `collected` when it began
  std::atomic<uint32_t> dtype;
  std::atomic<uint32_t> op;
  std::atomic<uint32_t> here;  // 1: it runs in the arena; 0: over the rings
  std::atomic<uint32_t> broken;
  alignas(64) std::atomic<uint32_t> bell;  // futex word, bumped when sleepers wait
  std::atomic<uint32_t> sleeping;
};

namespace {

constexpr size_t kControlBytes = 4096;
static_assert(sizeof(ShmArena::Control) <= kControlBytes);

// A chunk is at most about 1 MiB (cache-sized) and a portion at most
// 128 KiB: 2 ranks move 256 KiB chunks, which measured as fast as 512 KiB
// ones at 64 MiB and faster at 4 MiB (BENCHMARKS.md).
size_t PortionBytesFor(int size) {
  const size_t target = (size_t{1} << 20) / static_cast<size_t>(size);
  return std::clamp<size_t>(target / 4096 * 4096, 32 << 10, 128 << 10);
}

size_t SegmentBytes(int size, size_t portion) {
  return kControlBytes + ShmArena::kDepth * (static_cast<size_t>(size) + 1) * portion;
}

absl::Status WithWhat(const std::string& what, const absl::Status& status) {
  if (status.ok() || absl::StartsWith(status.message(), what)) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

std::string Describe(size_t nbytes, uint32_t dtype, uint32_t op) {
  return absl::StrCat("all_reduce of ", nbytes, " bytes of ",
                      std::string(dtype_name(static_cast<Dtype>(dtype))), " (",
                      reduce_op_name(static_cast<ReduceOp>(op)), ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(int rank, int size) {
  if (size < 2 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory arena: rank ", rank, " of ", size, " is invalid"));
  }
  const size_t portion = PortionBytesFor(size);
  auto segment = SharedMapping::create_memfd("ember-tcp-arena", SegmentBytes(size, portion));
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<ShmArena>(new ShmArena(rank, size, portion, std::move(*segment)));
}

ShmArena::ShmArena(int rank, int size, size_t portion_bytes, SharedMapping segment)
    : rank_(rank), size_(size), portion_bytes_(portion_bytes), segments_(size) {
  segments_[rank] = std::move(segment);
}

std::string ShmArena::Locator() const { return LocatorOf(segments_[rank_]); }

absl::Status ShmArena::Attach(int peer, const std::string& locator) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory arena: cannot attach rank ", peer, " (group of ", size_, ")"));
  }
  auto segment = OpenLocator(locator, SegmentBytes(size_, portion_bytes_),
                             absl::StrCat("rank ", peer, "'s all_reduce arena"));
  if (!segment.ok()) return segment.status();
  segments_[peer] = std::move(*segment);
  return absl::OkStatus();
}

ShmArena::Control& ShmArena::control(int r) const {
  return *reinterpret_cast<Control*>(segments_[r].data());
}

char* ShmArena::slot(int r, uint64_t chunk) const {
  return segments_[r].data() + kControlBytes + (chunk % kDepth) * size_ * portion_bytes_;
}

char* ShmArena::result_slot(int r, uint64_t chunk) const {
  return segments_[r].data() + kControlBytes + kDepth * size_ * portion_bytes_ +
         (chunk % kDepth) * portion_bytes_;
}

bool ShmArena::Usable() const {
  for (int r = 0; r < size_; ++r) {
    if (control(r).broken.load(std::memory_order_acquire)) return false;
  }
  return true;
}

void ShmArena::Interrupt() {
  interrupted_.store(true);
  for (int r = 0; r < size_; ++r) {
    Control& c = control(r);
    c.bell.fetch_add(1);
    FutexWakeAll(&c.bell);
  }
}

absl::Status ShmArena::Fail(absl::Status status) {
  control(rank_).broken.store(1, std::memory_order_release);
  return status;
}

void ShmArena::Announce(int64_t seq, size_t nbytes, Dtype dtype, ReduceOp op, bool here) {
  Control& me = control(rank_);
  me.nbytes.store(nbytes, std::memory_order_relaxed);
  me.base.store(me.collected.load(std::memory_order_relaxed), std::memory_order_relaxed);
  me.dtype.store(static_cast<uint32_t>(dtype), std::memory_order_relaxed);
  me.op.store(static_cast<uint32_t>(op), std::memory_order_relaxed);
  me.here.store(here ? 1 : 0, std::memory_order_relaxed);
  me.announced.store(static_cast<uint64_t>(seq) + 1, std::memory_order_release);
  Notify(me.sleeping, me.bell);
}

void ShmArena::AnnounceElsewhere(int64_t seq, size_t nbytes, Dtype dtype, ReduceOp op) {
  Announce(seq, nbytes, dtype, op, false);
}

void ShmArena::Advance(std::atomic<uint64_t> Control::*counter, uint64_t value) {
  Control& me = control(rank_);
  (me.*counter).store(value, std::memory_order_release);
  Notify(me.sleeping, me.bell);
}

absl::Status ShmArena::WaitForPeers(const Op& op, std::atomic<uint64_t> Control::*counter,
                                    uint64_t target, const char* step) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Control& c = control(p);
    auto ready = [&] { return (c.*counter).load(std::memory_order_acquire) >= target; };
    if (ready()) continue;
    // Spinning pays only while the peer runs on another core at the same
    // time; when it does not (more ranks than free cores), every spin is
    // time taken from the peer. The budget halves after a wait that spinning
    // did not end and grows back after one it did.
    int spun = 0;
    while (spun < spin_budget_ && !ready()) {
      CpuRelax();
      ++spun;
    }
    if (ready()) {
      spin_budget_ = std::min(kMaxSpins, spin_budget_ + spin_budget_ / 4 + 1);
      continue;
    }
    spin_budget_ = std::max(kMinSpins, spin_budget_ / 2);
    auto on_slice = [&]() -> absl::Status {
      if (c.broken.load(std::memory_order_acquire)) {
        return absl::AbortedError(
            absl::StrCat(op.describe(p), " gave up on this shared-memory all_reduce"));
      }
      return op.failure ? op.failure() : absl::OkStatus();
    };
    absl::StatusOr<bool> done =
        WaitUntil(ready, c.sleeping, c.bell, op.deadline, interrupted_, on_slice, /*spins=*/0);
    if (!done.ok()) return Fail(WithWhat(op.what, done.status()));
    if (!*done) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(op.what, ": timed out waiting for ",
                                                           op.describe(p), " to ", step,
                                                           " in the shared-memory all_reduce")));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmArena::CheckAnnouncements(const Op& op, size_t nbytes, Dtype dtype,
                                          ReduceOp redop) {
  const uint64_t expected = static_cast<uint64_t>(op.seq) + 1;
  EMBER_RETURN_IF_ERROR(WaitForPeers(op, &Control::announced, expected, "join"));
  const Control& me = control(rank_);
  const std::string mine =
      Describe(nbytes, static_cast<uint32_t>(dtype), static_cast<uint32_t>(redop));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const Control& c = control(p);
    const uint64_t seen = c.announced.load(std::memory_order_acquire);
    if (seen != expected) {
      return Fail(
          absl::InternalError(absl::StrCat(op.what, ": rank ", p, " announced collective #",
                                           seen - 1, " in shared memory while this rank runs #",
                                           op.seq, "; the group's collectives are out of order")));
    }
    const std::string theirs =
        Describe(c.nbytes.load(std::memory_order_relaxed), c.dtype.load(std::memory_order_relaxed),
                 c.op.load(std::memory_order_relaxed));
    if (theirs != mine) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat(op.what, ": mismatched collectives: rank ", p, " ran ", theirs,
                       " as collective #", op.seq, " while this rank (", rank_, ") ran ", mine,
                       "; every rank must call the same collectives in the same order")));
    }
    if (!c.here.load(std::memory_order_relaxed)) {
      return Fail(absl::AbortedError(absl::StrCat(
          op.what, ": rank ", p,
          " runs it over the rings because a shared-memory all_reduce failed there earlier;"
          " this one fails, and the group's later all_reduces run over the rings on every rank")));
    }
    if (c.base.load(std::memory_order_relaxed) != me.base.load(std::memory_order_relaxed)) {
      return Fail(absl::InternalError(absl::StrCat(
          op.what, ": rank ", p, "'s shared-memory all_reduce is out of step with this rank's (",
          c.base.load(std::memory_order_relaxed), " chunks against ",
          me.base.load(std::memory_order_relaxed), ") after an earlier failure")));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmArena::AllReduce(const Op& op, char* data, int64_t numel, Dtype dtype,
                                 ReduceOp redop) {
  if (interrupted_.load()) return absl::AbortedError("the process group was aborted");
  // With no chunk to wait on, a fast peer could announce its next op before
  // this rank has read this one's announcement.
  if (numel <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.what, ": the shared-memory all_reduce needs a non-empty buffer"));
  }
  const int n = size_, r = rank_;
  const size_t elem = element_size(dtype);
  Announce(op.seq, static_cast<size_t>(numel) * elem, dtype, redop, true);
  EMBER_RETURN_IF_ERROR(CheckAnnouncements(op, static_cast<size_t>(numel) * elem, dtype, redop));

  const int64_t chunk_numel = static_cast<int64_t>(portion_bytes_ / elem) * n;
  const int64_t chunks = (numel + chunk_numel - 1) / chunk_numel;
  const uint64_t base = control(r).collected.load(std::memory_order_relaxed);
  for (int64_t j = 0; j < chunks; ++j) {
    const uint64_t k = base + static_cast<uint64_t>(j);
    const int64_t m = std::min(chunk_numel, numel - j * chunk_numel);
    char* chunk = data + static_cast<size_t>(j * chunk_numel) * elem;
    // 1. Publish the portions the others reduce, once they are done with
    // this slot's previous chunk.
    if (k >= kDepth) {
      EMBER_RETURN_IF_ERROR(
          WaitForPeers(op, &Control::collected, k + 1 - kDepth, "free a staging slot"));
    }
    char* mine = slot(r, k);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const Segment s = SegmentOf(p, n, m, elem);
      std::memcpy(mine + s.offset, chunk + s.offset, s.nbytes);
    }
    Advance(&Control::published, k + 1);
    // 2. Reduce my portion in rank order.
    EMBER_RETURN_IF_ERROR(WaitForPeers(op, &Control::published, k + 1, "publish its data"));
    const Segment own = SegmentOf(r, n, m, elem);
    const int64_t count = static_cast<int64_t>(own.nbytes / elem);
    auto input = [&](int p) -> const char* {
      return p == r ? chunk + own.offset : slot(p, k) + own.offset;
    };
    char* result = result_slot(r, k);
    ReduceTo(redop, dtype, result, input(0), input(1), count);
    for (int p = 2; p < n; ++p) ReduceInto(redop, dtype, result, input(p), count);
    if (redop == ReduceOp::kAvg) DivideBy(dtype, result, count, n);
    std::memcpy(chunk + own.offset, result, own.nbytes);
    Advance(&Control::reduced, k + 1);
    // 3. Collect the other portions from their owners.
    EMBER_RETURN_IF_ERROR(WaitForPeers(op, &Control::reduced, k + 1, "reduce its portion"));
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const Segment s = SegmentOf(p, n, m, elem);
      std::memcpy(chunk + s.offset, result_slot(p, k), s.nbytes);
    }
    Advance(&Control::collected, k + 1);
  }
  return absl::OkStatus();
}

}  // namespace ember::distributed::tcp
