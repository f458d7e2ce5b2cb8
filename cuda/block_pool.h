// BlockPool: the device-independent core of the CUDA caching allocator
// (cuda/caching_allocator.h) and the pinned host allocator
// (cuda/host_allocator.h). It carves blocks out of large segments obtained
// from a backing source, keeps freed blocks for reuse by later requests of
// the same stream, and returns memory to the source only when asked
// (empty_cache) or when the source runs out. Note [CUDA caching allocator]
// in caching_allocator.h says how the pieces fit together.
//
//   ```cpp
//   #include <cstdlib>
//   #include "cuda/block_pool.h"
//   #include "tensor/status_macros.h"
//   ember::cuda::BlockPoolBacking backing;
//   backing.allocate = [](size_t n) -> absl::StatusOr<void*> { return std::malloc(n); };
//   backing.free = [](void* p, size_t) { std::free(p); };
//   ember::cuda::BlockPool pool(std::move(backing));
//   ember::Stream stream;  // only its identity matters to the pool
//   EMBER_ASSIGN_OR_RETURN(ember::cuda::Block* a, pool.allocate(1000, stream));
//   pool.free(a);  // cached: the next request of this stream reuses it
//   EMBER_ASSIGN_OR_RETURN(ember::cuda::Block* b, pool.allocate(1000, stream));
//   if (pool.memory_stats().num_device_alloc != 1) return absl::InternalError("not reused");
//   pool.free(b);
//   ```
//
// Sizes (as torch's CUDA caching allocator): requests are rounded up to a
// multiple of kMinBlockSize (512 bytes). Requests of at most kSmallSize (1 MiB)
// come from the small pool, whose segments are kSmallBuffer (2 MiB); larger
// ones from the large pool, whose segments are kLargeBuffer (20 MiB) for
// requests under kMinLargeAlloc (10 MiB) and the request rounded up to
// kRoundLarge (2 MiB) above. A request takes the smallest cached block of its
// pool and stream that fits (best fit); what is left over is split off as a
// free block when it is at least kMinBlockSize (small pool) or more than
// kSmallSize (large pool). A freed block merges with free neighbours of its
// segment.
//
// Streams: a block belongs to the stream it was allocated on and, once
// freed, is reused only by requests of that stream, whose work is ordered
// after the block's earlier uses. record_stream(block, s) says the block is
// also used on stream `s`; when such a block is freed, the pool records an
// event on every such stream (BlockPoolBacking::record_event) and keeps the
// block out of reuse until all of them have completed (polled at every
// allocate, empty_cache and snapshot).
//
// Out of memory (torch's order): when no cached block fits and the backing
// source fails with kResourceExhausted, the pool first releases cached
// oversize blocks (see max_split_size below) and retries; then it waits for
// every block still pending on record_stream events
// (BlockPoolBacking::synchronize_event), returns those blocks to the cache,
// releases every wholly free cached segment and retries once more; if that
// fails too, allocate returns the source's kResourceExhausted status.
//
// Options (BlockPoolOptions; PYTORCH_CUDA_ALLOC_CONF spells them, see
// ParseAllocatorConfig): max_split_size keeps blocks of at least that size
// whole (a request below it is never served from one, a request above it only
// from one less than kLargeBuffer bigger), so big segments do not fragment;
// garbage_collection_threshold, with a memory limit set (set_memory_limit,
// torch's set_per_process_memory_fraction), returns the oldest cached whole
// segments to the source before a new segment is obtained while more than
// that fraction of the limit is reserved.
//
// Thread-safety: thread-safe; every member takes the pool's mutex, and the
// backing source's functions are called with it held.
#ifndef EMBER_CUDA_BLOCK_POOL_H_
#define EMBER_CUDA_BLOCK_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/stream.h"

namespace ember::cuda {

inline constexpr size_t kMinBlockSize = 512;                // Rounding granularity.
inline constexpr size_t kSmallSize = size_t{1} << 20;       // Largest small-pool request.
inline constexpr size_t kSmallBuffer = size_t{2} << 20;     // Small-pool segment size.
inline constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // Below: kLargeBuffer segments.
inline constexpr size_t kLargeBuffer = size_t{20} << 20;
inline constexpr size_t kRoundLarge = size_t{2} << 20;  // Large segments round to this.

struct BlockPoolOptions;

// `size` rounded up to the block granularity (0 stays 0; kMinBlockSize at least
// otherwise), or, under `options.roundup_power2_divisions`, as torch rounds
// it: up to the next of `divisions` equal steps between the powers of two
// around it (a request of 1.1 MiB with 4 divisions takes 1.25 MiB), for
// requests larger than kMinBlockSize times the divisions.
size_t round_size(size_t size);
size_t round_size(size_t size, const BlockPoolOptions& options);
// The size of the segment the pool obtains for a request of `size` (already
// rounded) that no cached block holds.
size_t segment_size(size_t size);

// Where a pool's memory comes from, and how it learns that work queued on a
// stream has passed a point. The event functions may be left empty when no
// block is ever record_stream'd to another stream.
struct BlockPoolBacking {
  // `size` fresh bytes (cudaMalloc); kResourceExhausted when out of memory.
  std::function<absl::StatusOr<void*>(size_t size)> allocate;
  // Returns memory from `allocate` (cudaFree).
  std::function<void(void* ptr, size_t size)> free;
  // A marker of the point the work queued on `stream` has reached (a
  // recorded event), released by release_event.
  std::function<absl::StatusOr<void*>(Stream stream)> record_event;
  // True when the work queued before the marker has finished.
  std::function<bool(void* event)> query_event;
  std::function<void(void* event)> release_event;
  // Blocks the calling thread until the work queued before the marker has
  // finished (cudaEventSynchronize). Called only when out of memory; when
  // empty, blocks pending on events are not waited for.
  std::function<void(void* event)> synchronize_event;
};

// The tunable parts of the caching policy (torch's CUDAAllocatorConfig).
struct BlockPoolOptions {
  // Blocks of at least this many bytes are never split (max_split_size_mb).
  size_t max_split_size = ~size_t{0};
  // In (0, 1): with a memory limit, reclaim cached segments while reserved
  // bytes exceed this fraction of it (garbage_collection_threshold); 0: off.
  double garbage_collection_threshold = 0;
  // Divisions per size interval: interval k holds requests of [2^k, 2^(k+1))
  // MiB (the first also everything below 1 MiB, the last everything from
  // 32 GiB); 0 rounds to kMinBlockSize (roundup_power2_divisions).
  static constexpr int kRoundupIntervals = 16;
  std::array<size_t, kRoundupIntervals> roundup_power2_divisions{};
};

// PYTORCH_CUDA_ALLOC_CONF, parsed: the options Ember honours and a line for
// each option torch knows that Ember does not act on.
struct AllocatorConfig {
  BlockPoolOptions options;
  std::vector<std::string> ignored;
};

// Parses `conf` as torch does ("key:value,key:value"; spaces ignored).
// Honoured: max_split_size_mb (an integer > 20, in MiB),
// garbage_collection_threshold (strictly between 0 and 1) and
// roundup_power2_divisions (a power of two, or 0, for every size; or a list
// "[256:1,512:2,>:4]" of power-of-two MiB interval starts and their
// divisions, ">" for every interval after the last one named, the first
// value also covering the intervals below it). Known to torch but not acted
// on here, each listed in `ignored` naming the key and why:
// expandable_segments:True (Ember's segments are fixed allocations;
// expandable_segments:False is the default and silent), backend:cudaMallocAsync
// (backend:native is silent), release_lock_on_cudamalloc, pinned_use_cuda_host_register,
// pinned_num_register_threads, pinned_use_background_threads. Anything else,
// or a malformed value, is kInvalidArgument naming the key and value.
absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(absl::string_view conf);

// One block of a segment. Owned by the pool; callers read ptr, size and
// stream of a block allocate returned, until they free it.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;            // Rounded size.
  size_t requested_size = 0;  // What the caller asked for (0 when free).
  Stream stream;              // Allocated on, and reused for, this stream.
  bool allocated = false;
  bool large_pool = false;
  int pending_events = 0;           // Events outstanding after a free.
  std::vector<Stream> stream_uses;  // Other streams the block is used on.
  Block* prev = nullptr;            // Neighbours in the segment.
  Block* next = nullptr;
  uint64_t freed_at = 0;  // The pool's lookup count when it was last cached (its age).
};

// Counters named after torch.cuda.memory_stats() keys (their ".all.current"
// and ".all.peak" values). Bytes are rounded block and segment sizes.
struct MemoryStats {
  int64_t allocated_bytes = 0;       // In blocks handed out and not freed.
  int64_t peak_allocated_bytes = 0;  // Most allocated_bytes since the last reset.
  int64_t reserved_bytes = 0;        // In segments held from the backing source.
  int64_t peak_reserved_bytes = 0;
  int64_t requested_bytes = 0;       // What callers asked for, before rounding.
  int64_t allocation = 0;            // Blocks handed out and not freed.
  int64_t segment = 0;               // Segments held.
  int64_t num_alloc_retries = 0;     // Backing allocations retried after releasing the cache.
  int64_t num_ooms = 0;              // Requests that failed out of memory.
  int64_t num_device_alloc = 0;      // Backing allocations (cudaMalloc calls).
  int64_t num_device_free = 0;       // Backing frees (cudaFree calls).
  int64_t num_sync_all_streams = 0;  // Waits for pending events when out of memory.
  int64_t oversize_segments = 0;     // Segments of at least max_split_size held.
};

// torch.cuda.memory_snapshot()'s view of one block.
struct BlockInfo {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  bool allocated = false;     // Handed out ("active_allocated").
  bool pending_free = false;  // Freed, waiting for recorded stream uses ("active_pending_free").
};

// One segment, its blocks in address order.
struct SegmentInfo {
  uintptr_t address = 0;
  size_t total_size = 0;
  size_t allocated_size = 0;  // Sum of its allocated blocks.
  Stream stream;
  bool large_pool = false;  // segment_type "large" (else "small").
  std::vector<BlockInfo> blocks;
};

class BlockPool {
 public:
  explicit BlockPool(BlockPoolBacking backing, BlockPoolOptions options = {});
  // Returns every segment to the backing source and releases pending
  // events. Blocks still handed out become invalid.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `size` bytes for work on `stream`; a null block for
  // size 0. Errors: the backing source's (kResourceExhausted after the retry
  // described above).
  absl::StatusOr<Block*> allocate(size_t size, Stream stream);
  // Hands `block` (from allocate, not yet freed; null is ignored) back for
  // reuse, recording events first when it was used on other streams. A stream
  // whose event cannot be recorded is reported on stderr and the block is
  // never reused (safe over fast).
  void free(Block* block);
  // Marks `block` (handed out) as used on `stream` too: when freed, it is
  // reused only after the work queued on `stream` by then has finished. A
  // no-op for the block's own stream.
  void record_stream(Block* block, Stream stream);

  // Returns every cached segment none of whose blocks is handed out or
  // waiting on events to the backing source. Does nothing while a capture is
  // underway.
  void empty_cache();
  // Note [Allocating during a capture]
  // Between begin_capture and end_capture (they nest: a CUDA graph capture
  // is underway on the pool's device, cuda/graphs.h) the pool calls nothing
  // a capture forbids: it queries and records no events (a freed block used
  // on other streams is set aside until the last end_capture, then freed as
  // usual), and returns no memory to the source: empty_cache does nothing
  // and a request no cached block or new segment can serve fails as out of
  // memory at once, without the release-and-wait retries. New segments are
  // still obtained (cudaMalloc is allowed during a capture).
  void begin_capture();
  void end_capture();
  MemoryStats memory_stats();
  // Sets the peaks to the current values.
  void reset_peak_memory_stats();
  std::vector<SegmentInfo> snapshot();
  // Caps reserved bytes (torch's set_per_process_memory_fraction): a segment
  // that would take them past `bytes` is not requested, as if the source were
  // out of memory. ~size_t{0}: no cap.
  void set_memory_limit(size_t bytes);
  size_t memory_limit();

 private:
  // Orders the free blocks of a pool by stream, then size, then address.
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BlockLess>;
  struct PendingEvent {
    void* event;
    Block* block;
  };

  FreeSet& PoolOf(const Block* block) { return block->large_pool ? large_ : small_; }
  Block* FindFree(size_t size, Stream stream, bool large);
  absl::StatusOr<Block*> AllocateSegment(size_t size, Stream stream, bool large);
  // The out-of-memory steps in the header comment, before giving up.
  absl::StatusOr<Block*> AllocateSegmentWithRetries(size_t request, Stream stream, bool large);
  // Frees cached oversize whole segments of `stream` to make room for `size`
  // bytes; true when it freed enough.
  bool ReleaseOversizeBlocks(size_t size, Stream stream);
  // Waits for every pending event and caches the blocks they held.
  void SynchronizePending();
  // Returns aged cached whole large segments while over the GC threshold.
  void GarbageCollect();
  // Returns the segment `head` (a wholly idle segment) to the source.
  void ReleaseSegment(Block* head);
  // Splits `block` to `size` when the rest is worth keeping.
  void MaybeSplit(Block* block, size_t size);
  // Puts a freed block back into its pool, merged with free neighbours.
  void Reinsert(Block* block);
  void ProcessEvents();
  // Records the events of a freed block's other streams, or reinserts it.
  void RecordUsesAndReinsert(Block* block);
  void ReleaseFreeSegments();
  void AddAllocated(int64_t bytes, int64_t requested);

  BlockPoolBacking backing_;
  const BlockPoolOptions options_;
  std::mutex mu_;
  size_t memory_limit_ = ~size_t{0};
  uint64_t lookups_ = 0;  // FindFree calls: the clock of block ages.
  FreeSet small_;
  FreeSet large_;
  std::vector<Block*> segments_;  // The first block of every segment.
  std::vector<PendingEvent> pending_;
  int captures_ = 0;              // begin_capture calls not yet ended
  std::vector<Block*> deferred_;  // freed during a capture, their events not yet recorded
  MemoryStats stats_;
};

}  // namespace ember::cuda

#endif  // EMBER_CUDA_BLOCK_POOL_H_
