#include "cuda/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

// `conf` split at the commas outside brackets (roundup_power2_divisions takes
// a bracketed list: "[256:1,512:2]").
std::vector<std::string> SplitOptions(absl::string_view conf) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (char c : conf) {
    if (c == ' ' || c == '\t' || c == '\n') continue;
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

absl::Status BadValue(absl::string_view key, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("PYTORCH_CUDA_ALLOC_CONF: ", key, ":", value,
                                                 " is not valid: ", key, " must be ", expected));
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

int Log2Floor(uint64_t v) { return 63 - __builtin_clzll(v); }

// roundup_power2_divisions' value: one count for every interval, or a list.
absl::Status ParseDivisions(const std::string& value,
                            std::array<size_t, BlockPoolOptions::kRoundupIntervals>& divisions) {
  constexpr absl::string_view kKey = "roundup_power2_divisions";
  auto parse_count = [&](absl::string_view text, size_t& out) -> absl::Status {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(text, &v) || (v != 0 && !IsPowerOfTwo(v)) || v > (1u << 20)) {
      return BadValue(kKey, value, "a power of two (or 0 for none), or a list of them");
    }
    out = static_cast<size_t>(v);
    return absl::OkStatus();
  };
  if (value.empty() || value.front() != '[') {
    size_t all = 0;
    EMBER_RETURN_IF_ERROR(parse_count(value, all));
    divisions.fill(all);
    return absl::OkStatus();
  }
  if (value.back() != ']') return BadValue(kKey, value, "a list closed by ']'");
  const std::string inner = value.substr(1, value.size() - 2);
  int last = -1;
  for (absl::string_view entry : absl::StrSplit(inner, ',')) {
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) {
      return BadValue(kKey, value, "a list of <MiB>:<divisions> entries, e.g. [256:1,512:2,>:4]");
    }
    const absl::string_view interval = entry.substr(0, colon);
    size_t count = 0;
    EMBER_RETURN_IF_ERROR(parse_count(entry.substr(colon + 1), count));
    if (interval == ">") {
      for (int k = last + 1; k < BlockPoolOptions::kRoundupIntervals; ++k) divisions[k] = count;
      last = BlockPoolOptions::kRoundupIntervals - 1;
      continue;
    }
    uint64_t mb = 0;
    if (!absl::SimpleAtoi(interval, &mb) || !IsPowerOfTwo(mb)) {
      return BadValue(kKey, value, "a list whose interval starts are powers of two (MiB) or '>'");
    }
    const int k = std::min(Log2Floor(mb), BlockPoolOptions::kRoundupIntervals - 1);
    if (k <= last) {
      return BadValue(kKey, value, "a list of intervals in increasing order");
    }
    if (last == -1) {
      for (int j = 0; j < k; ++j) divisions[j] = count;
    }
    divisions[k] = count;
    last = k;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(absl::string_view conf) {
  AllocatorConfig config;
  for (const std::string& option : SplitOptions(conf)) {
    if (option.empty()) continue;
    const size_t colon = option.find(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("PYTORCH_CUDA_ALLOC_CONF: option '", option,
                       "' has no value; write key:value pairs separated by commas, e.g. "
                       "\"max_split_size_mb:128,garbage_collection_threshold:0.8\""));
    }
    const std::string key = option.substr(0, colon);
    const std::string value = option.substr(colon + 1);
    if (key == "max_split_size_mb") {
      int64_t mb = 0;
      constexpr int64_t kMinMb = kLargeBuffer >> 20;
      if (!absl::SimpleAtoi(value, &mb) || mb <= kMinMb || mb > (int64_t{1} << 40)) {
        return BadValue(key, value, absl::StrCat("an integer number of MiB greater than ", kMinMb));
      }
      config.options.max_split_size = static_cast<size_t>(mb) << 20;
    } else if (key == "garbage_collection_threshold") {
      double t = 0;
      if (!absl::SimpleAtod(value, &t) || !(t > 0.0 && t < 1.0)) {
        return BadValue(key, value, "a fraction strictly between 0.0 and 1.0");
      }
      config.options.garbage_collection_threshold = t;
    } else if (key == "expandable_segments") {
      if (value == "True") {
        config.ignored.push_back(
            "expandable_segments:True is not supported: Ember's segments are fixed cudaMalloc "
            "allocations (max_split_size_mb limits fragmentation instead)");
      } else if (value != "False") {
        return BadValue(key, value, "True or False");
      }
    } else if (key == "backend") {
      if (value == "cudaMallocAsync") {
        config.ignored.push_back(
            "backend:cudaMallocAsync is not supported: Ember always uses its native caching "
            "allocator");
      } else if (value != "native") {
        return BadValue(key, value, "native or cudaMallocAsync");
      }
    } else if (key == "roundup_power2_divisions") {
      EMBER_RETURN_IF_ERROR(ParseDivisions(value, config.options.roundup_power2_divisions));
    } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_use_background_threads") {
      config.ignored.push_back(
          absl::StrCat(key,
                       " is not supported by Ember's caching allocator and is ignored (its lock "
                       "is held across cudaMalloc; pinned memory comes from cudaHostAlloc)"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "PYTORCH_CUDA_ALLOC_CONF: unrecognized option '", key,
          "'; Ember honours max_split_size_mb, garbage_collection_threshold and "
          "roundup_power2_divisions (and accepts expandable_segments:False and backend:native)"));
    }
  }
  return config;
}

size_t round_size(size_t size) {
  if (size == 0) return 0;
  return size < kMinBlockSize ? kMinBlockSize : RoundUp(size, kMinBlockSize);
}

size_t round_size(size_t size, const BlockPoolOptions& options) {
  if (size <= kMinBlockSize) return round_size(size);
  const int interval = std::clamp(Log2Floor(size) - 20, 0, BlockPoolOptions::kRoundupIntervals - 1);
  const size_t divisions = options.roundup_power2_divisions[interval];
  if (divisions == 0 || size <= kMinBlockSize * divisions) return round_size(size);
  // Between the powers of two around `size`, `divisions` equal steps.
  if (IsPowerOfTwo(size)) return size;
  const size_t floor = size_t{1} << Log2Floor(size);
  const size_t step = floor >> Log2Floor(divisions);
  if (step == 0) return floor << 1;
  const size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
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

BlockPool::BlockPool(BlockPoolBacking backing, BlockPoolOptions options)
    : backing_(std::move(backing)), options_(options) {}

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
  const size_t rounded = round_size(size, options_);
  const bool large = rounded > kSmallSize;
  Block* block = FindFree(rounded, stream, large);
  if (block == nullptr) {
    EMBER_ASSIGN_OR_RETURN(block, AllocateSegmentWithRetries(rounded, stream, large));
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
  if (captures_ > 0 && !block->stream_uses.empty()) {
    deferred_.push_back(block);  // its events are recorded once no capture is underway
    return;
  }
  RecordUsesAndReinsert(block);
}

void BlockPool::RecordUsesAndReinsert(Block* block) {
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

void BlockPool::begin_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  ++captures_;
}

void BlockPool::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  EMBER_INTERNAL_ASSERT(captures_ > 0, "BlockPool::end_capture without begin_capture");
  if (--captures_ > 0) return;
  std::vector<Block*> deferred;
  deferred.swap(deferred_);
  for (Block* block : deferred) RecordUsesAndReinsert(block);
}

void BlockPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  if (captures_ > 0) return;  // cudaFree cannot run during a capture
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

void BlockPool::set_memory_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_limit_ = bytes;
}

size_t BlockPool::memory_limit() {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_limit_;
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
  ++lookups_;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  const size_t max_split = options_.max_split_size;
  // An oversize block serves no request below max_split_size, and a larger
  // request only when it wastes less than kLargeBuffer.
  if (size < max_split && (*it)->size >= max_split) return nullptr;
  if (size >= max_split && (*it)->size >= size + kLargeBuffer) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

absl::StatusOr<Block*> BlockPool::AllocateSegmentWithRetries(size_t request, Stream stream,
                                                             bool large) {
  const size_t size = segment_size(request);
  if (options_.garbage_collection_threshold > 0 && captures_ == 0) GarbageCollect();
  absl::StatusOr<Block*> block = AllocateSegment(size, stream, large);
  if (!absl::IsResourceExhausted(block.status())) return block;
  if (captures_ > 0) {
    // Releasing memory (cudaFree) and waiting for events cannot happen while
    // a capture is underway: the request fails as out of memory.
    ++stats_.num_ooms;
    return block;
  }
  if (large && ReleaseOversizeBlocks(size, stream)) {
    block = AllocateSegment(size, stream, large);
    if (!absl::IsResourceExhausted(block.status())) return block;
  }
  // Blocks freed while still used on other streams may be all that stands in
  // the way: wait for their streams, then release every wholly free segment.
  SynchronizePending();
  ReleaseFreeSegments();
  ++stats_.num_alloc_retries;
  block = AllocateSegment(size, stream, large);
  if (absl::IsResourceExhausted(block.status())) ++stats_.num_ooms;
  return block;
}

bool BlockPool::ReleaseOversizeBlocks(size_t size, Stream stream) {
  const size_t max_split = options_.max_split_size;
  if (max_split == ~size_t{0}) return false;
  Block key;
  key.stream = stream;
  key.size = std::max(size, max_split);
  auto it = large_.lower_bound(&key);
  if (it != large_.end() && (*it)->stream == stream && (*it)->prev == nullptr &&
      (*it)->next == nullptr) {
    ReleaseSegment(*it);
    return true;
  }
  // No single block is large enough: release oversize ones, largest first.
  size_t released = 0;
  std::vector<Block*> victims;
  while (released < key.size && it != large_.begin()) {
    --it;
    Block* b = *it;
    if (b->stream != stream || b->size < max_split) break;
    if (b->prev != nullptr || b->next != nullptr) continue;
    victims.push_back(b);
    released += b->size;
  }
  if (released < key.size) return false;
  for (Block* b : victims) ReleaseSegment(b);
  return true;
}

void BlockPool::SynchronizePending() {
  if (pending_.empty() || !backing_.synchronize_event) return;
  ++stats_.num_sync_all_streams;
  for (const PendingEvent& pending : pending_) backing_.synchronize_event(pending.event);
  ProcessEvents();
}

void BlockPool::GarbageCollect() {
  if (memory_limit_ == ~size_t{0}) return;
  const auto threshold = static_cast<int64_t>(options_.garbage_collection_threshold *
                                              static_cast<double>(memory_limit_));
  if (stats_.reserved_bytes <= threshold) return;
  const int64_t target = stats_.reserved_bytes - threshold;
  int64_t reclaimed = 0;
  // Whole cached segments of the large pool, oldest (longest unused) first:
  // each round frees those at least as old as the average of what is left.
  std::vector<Block*> candidates;
  for (Block* b : large_) {
    if (b->prev == nullptr && b->next == nullptr) candidates.push_back(b);
  }
  while (reclaimed < target && !candidates.empty()) {
    double total_age = 0;
    for (const Block* b : candidates) total_age += static_cast<double>(lookups_ - b->freed_at);
    const double average = total_age / static_cast<double>(candidates.size());
    std::vector<Block*> younger;
    for (Block* b : candidates) {
      if (static_cast<double>(lookups_ - b->freed_at) >= average) {
        reclaimed += static_cast<int64_t>(b->size);
        ReleaseSegment(b);
      } else {
        younger.push_back(b);
      }
    }
    candidates.swap(younger);
  }
}

void BlockPool::ReleaseSegment(Block* head) {
  PoolOf(head).erase(head);
  segments_.erase(std::find(segments_.begin(), segments_.end(), head));
  backing_.free(head->ptr, head->size);
  stats_.reserved_bytes -= static_cast<int64_t>(head->size);
  if (head->size >= options_.max_split_size) --stats_.oversize_segments;
  --stats_.segment;
  ++stats_.num_device_free;
  delete head;
}

absl::StatusOr<Block*> BlockPool::AllocateSegment(size_t size, Stream stream, bool large) {
  if (memory_limit_ != ~size_t{0} &&
      static_cast<size_t>(stats_.reserved_bytes) + size > memory_limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a new segment of ", size, " bytes would take the reserved bytes (", stats_.reserved_bytes,
        ") past the allowed ", memory_limit_, " (the per-process memory fraction)"));
  }
  absl::StatusOr<void*> memory = backing_.allocate(size);
  if (!memory.ok()) return memory.status();
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
  if (size >= options_.max_split_size) ++stats_.oversize_segments;
  return block;
}

void BlockPool::MaybeSplit(Block* block, size_t size) {
  const size_t remaining = block->size - size;
  if (block->large_pool ? (size >= options_.max_split_size || remaining <= kSmallSize)
                        : remaining < kMinBlockSize) {
    return;
  }
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
  block->freed_at = lookups_;
  pool.insert(block);
}

void BlockPool::ProcessEvents() {
  if (captures_ > 0) return;  // no event is queried during a capture
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
    if (head->size >= options_.max_split_size) --stats_.oversize_segments;
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
