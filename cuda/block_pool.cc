#include "cuda/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"
#include "tensor/status_macros.h"

namespace ember::cuda {
namespace {

// Requests above this cannot be rounded to a segment without overflowing.
constexpr size_t kMaxRequest = size_t{1} << 62;

size_t RoundUp(size_t size, size_t multiple) { return (size + multiple - 1) / multiple * multiple; }

auto StreamKey(const Stream& s) {
  return std::make_tuple(static_cast<int>(s.device().type()), s.device().index(), s.id());
}

// Freed and not waiting for events: in its pool, free to merge.
bool IsIdle(const Block* block) {
  return block != nullptr && !block->allocated && block->pending_events == 0;
}

}  // namespace

size_t round_size(size_t size) {
  if (size == 0) return 0;
  return size < kMinBlockSize ? kMinBlockSize : RoundUp(size, kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(size, kRoundLarge);
}

bool BlockPool::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return StreamKey(a->stream) < StreamKey(b->stream);
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

BlockPool::BlockPool(BlockPoolBacking backing) : backing_(std::move(backing)) {}

BlockPool::~BlockPool() {
  for (const PendingEvent& pending : pending_) backing_.release_event(pending.event);
  for (Block* head : segments_) {
    void* base = head->ptr;
    size_t total = 0;
    for (Block* b = head; b != nullptr;) {
      total += b->size;
      delete std::exchange(b, b->next);
    }
    backing_.free(base, total);
  }
}

absl::StatusOr<Block*> BlockPool::allocate(size_t size, Stream stream) {
  if (size == 0) return nullptr;
  if (size > kMaxRequest) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                     " bytes: the request exceeds ", kMaxRequest,
                                                     " bytes, more than any device holds"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEvents();
  const size_t rounded = round_size(size);
  const bool large = rounded > kSmallSize;
  Block* block = FindFree(rounded, stream, large);
  if (block == nullptr) {
    EMBER_ASSIGN_OR_RETURN(block, AllocateSegment(segment_size(rounded), stream, large));
  }
  MaybeSplit(block, rounded);
  block->allocated = true;
  block->requested_size = size;
  AddAllocated(static_cast<int64_t>(block->size), static_cast<int64_t>(size));
  return block;
}

void BlockPool::free(Block* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  EMBER_INTERNAL_ASSERT(block->allocated, "BlockPool::free of a block that is not allocated");
  block->allocated = false;
  AddAllocated(-static_cast<int64_t>(block->size), -static_cast<int64_t>(block->requested_size));
  block->requested_size = 0;
  for (const Stream& use : block->stream_uses) {
    absl::StatusOr<void*> event =
        backing_.record_event ? backing_.record_event(use)
                              : absl::UnimplementedError("the pool's backing records no events");
    if (!event.ok()) {
      std::fprintf(stderr,
                   "ember: the caching allocator could not record an event on stream %lld of %s "
                   "for a freed block of %zu bytes (%s); the block is not reused\n",
                   static_cast<long long>(use.id()), use.device().str().c_str(), block->size,
                   std::string(event.status().message()).c_str());
      ++block->pending_events;  // Never completes: the block stays out of reuse.
      continue;
    }
    pending_.push_back({*event, block});
    ++block->pending_events;
  }
  block->stream_uses.clear();
  if (block->pending_events == 0) Reinsert(block);
}

void BlockPool::record_stream(Block* block, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  EMBER_INTERNAL_ASSERT(block->allocated, "BlockPool::record_stream of a freed block");
  if (stream == block->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
}

void BlockPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEvents();
  ReleaseFreeSegments();
}

MemoryStats BlockPool::memory_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BlockPool::reset_peak_memory_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

std::vector<SegmentInfo> BlockPool::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEvents();
  std::vector<SegmentInfo> segments;
  segments.reserve(segments_.size());
  for (const Block* head : segments_) {
    SegmentInfo& segment = segments.emplace_back();
    segment.address = reinterpret_cast<uintptr_t>(head->ptr);
    segment.stream = head->stream;
    segment.large_pool = head->large_pool;
    for (const Block* b = head; b != nullptr; b = b->next) {
      segment.total_size += b->size;
      if (b->allocated) segment.allocated_size += b->size;
      segment.blocks.push_back(BlockInfo{.address = reinterpret_cast<uintptr_t>(b->ptr),
                                         .size = b->size,
                                         .requested_size = b->requested_size,
                                         .allocated = b->allocated,
                                         .pending_free = !b->allocated && b->pending_events > 0});
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
  return segments;
}

Block* BlockPool::FindFree(size_t size, Stream stream, bool large) {
  FreeSet& pool = large ? large_ : small_;
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

absl::StatusOr<Block*> BlockPool::AllocateSegment(size_t size, Stream stream, bool large) {
  absl::StatusOr<void*> memory = backing_.allocate(size);
  if (absl::IsResourceExhausted(memory.status())) {
    // Cached segments of other sizes or streams may be what stands in the way.
    ReleaseFreeSegments();
    ++stats_.num_alloc_retries;
    memory = backing_.allocate(size);
  }
  if (!memory.ok()) {
    if (absl::IsResourceExhausted(memory.status())) ++stats_.num_ooms;
    return memory.status();
  }
  auto* block = new Block;
  block->ptr = *memory;
  block->size = size;
  block->stream = stream;
  block->large_pool = large;
  segments_.push_back(block);
  stats_.reserved_bytes += static_cast<int64_t>(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.segment;
  ++stats_.num_device_alloc;
  return block;
}

void BlockPool::MaybeSplit(Block* block, size_t size) {
  const size_t remaining = block->size - size;
  if (block->large_pool ? remaining <= kSmallSize : remaining < kMinBlockSize) return;
  auto* rest = new Block;
  rest->ptr = static_cast<char*>(block->ptr) + size;
  rest->size = remaining;
  rest->stream = block->stream;
  rest->large_pool = block->large_pool;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  PoolOf(rest).insert(rest);
}

void BlockPool::Reinsert(Block* block) {
  FreeSet& pool = PoolOf(block);
  // Merge into the lower neighbour, so that a segment's first block stays its
  // first block (segments_ points at it).
  if (IsIdle(block->prev)) {
    Block* prev = block->prev;
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (IsIdle(block->next)) {
    Block* next = block->next;
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
}

void BlockPool::ProcessEvents() {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingEvent pending = pending_[i];
    if (!backing_.query_event(pending.event)) {
      pending_[kept++] = pending;
      continue;
    }
    backing_.release_event(pending.event);
    if (--pending.block->pending_events == 0) Reinsert(pending.block);
  }
  pending_.resize(kept);
}

void BlockPool::ReleaseFreeSegments() {
  size_t kept = 0;
  for (Block* head : segments_) {
    // A segment is wholly free when its first block spans it and is idle.
    if (!IsIdle(head) || head->next != nullptr) {
      segments_[kept++] = head;
      continue;
    }
    PoolOf(head).erase(head);
    backing_.free(head->ptr, head->size);
    stats_.reserved_bytes -= static_cast<int64_t>(head->size);
    --stats_.segment;
    ++stats_.num_device_free;
    delete head;
  }
  segments_.resize(kept);
}

void BlockPool::AddAllocated(int64_t bytes, int64_t requested) {
  stats_.allocated_bytes += bytes;
  stats_.requested_bytes += requested;
  stats_.allocation += bytes > 0 ? 1 : -1;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
}

}  // namespace ember::cuda
