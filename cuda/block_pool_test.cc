#include "cuda/block_pool.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Real host memory behind a pool, with a byte budget past which allocate
// fails as cudaMalloc does when the device is full.
class HostBacking {
 public:
  explicit HostBacking(size_t budget = ~size_t{0}) : budget_(budget) {}

  BlockPoolBacking Make() {
    BlockPoolBacking b;
    b.allocate = [this](size_t size) -> absl::StatusOr<void*> {
      if (fail_with_.has_value()) return *fail_with_;
      if (outstanding_ + size > budget_) {
        return absl::ResourceExhaustedError("host budget exhausted");
      }
      void* p = std::malloc(size);
      if (p == nullptr) return absl::ResourceExhaustedError("malloc failed");
      outstanding_ += size;
      sizes_[p] = size;
      return p;
    };
    b.free = [this](void* p, size_t size) {
      EXPECT_EQ(sizes_.at(p), size) << "freed with another size than allocated";
      sizes_.erase(p);
      outstanding_ -= size;
      std::free(p);
    };
    b.record_event = [this](Stream s) -> absl::StatusOr<void*> {
      ++recorded_;
      ++live_events_;
      return new Marker{s, submitted_[s.id()]};
    };
    b.query_event = [this](void* e) {
      auto* m = static_cast<Marker*>(e);
      return completed_[m->stream.id()] >= m->point;
    };
    b.release_event = [this](void* e) {
      --live_events_;
      delete static_cast<Marker*>(e);
    };
    // Waiting for an event: the host blocks until its stream reaches the
    // marker, i.e. the work before it is finished.
    b.synchronize_event = [this](void* e) {
      auto* m = static_cast<Marker*>(e);
      ++synchronized_;
      completed_[m->stream.id()] = std::max(completed_[m->stream.id()], m->point);
    };
    return b;
  }

  // Streams as opaque ids: work submitted to a stream completes when the
  // test says so, like a kernel still running on a device queue.
  void Submit(Stream s) { ++submitted_[s.id()]; }
  void Finish(Stream s) { completed_[s.id()] = submitted_[s.id()]; }

  size_t outstanding() const { return outstanding_; }
  int recorded() const { return recorded_; }
  int live_events() const { return live_events_; }
  int synchronized() const { return synchronized_; }
  bool finished(Stream s) { return completed_[s.id()] >= submitted_[s.id()]; }
  std::optional<absl::Status> fail_with_;

 private:
  struct Marker {
    Stream stream;
    int64_t point;
  };
  size_t budget_;
  size_t outstanding_ = 0;
  std::map<void*, size_t> sizes_;
  std::map<int64_t, int64_t> submitted_, completed_;
  int recorded_ = 0;
  int live_events_ = 0;
  int synchronized_ = 0;
};

const Stream kS1(Device(DeviceType::kCUDA, 0), 1);
const Stream kS2(Device(DeviceType::kCUDA, 0), 2);

Block* Alloc(BlockPool& pool, size_t size, Stream stream = kS1) {
  absl::StatusOr<Block*> b = pool.allocate(size, stream);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : nullptr;
}

TEST(BlockPoolTest, RoundsRequestsAndSizesSegmentsAsTorch) {
  EXPECT_EQ(round_size(0), 0u);
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(512), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(segment_size(512), kSmallBuffer);
  EXPECT_EQ(segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(segment_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(segment_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(segment_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(segment_size(10 * kMiB + 512), 12 * kMiB);
}

TEST(BlockPoolTest, RoundupPower2DivisionsRoundAsTorch) {
  BlockPoolOptions four;
  four.roundup_power2_divisions.fill(4);
  // Between 1 MiB and 2 MiB, steps of 256 KiB.
  EXPECT_EQ(round_size(kMiB + kMiB / 10, four), kMiB + kMiB / 4);
  EXPECT_EQ(round_size(kMiB + kMiB / 4, four), kMiB + kMiB / 4) << "on a step already";
  // Between 4 MiB and 8 MiB, steps of 1 MiB; powers of two stay.
  EXPECT_EQ(round_size(5 * kMiB + 1, four), 6 * kMiB);
  EXPECT_EQ(round_size(4 * kMiB, four), 4 * kMiB);
  EXPECT_EQ(round_size(3 * kMiB, four), 3 * kMiB);
  // Up to kMinBlockSize x divisions (2048 bytes): plain 512-byte rounding.
  EXPECT_EQ(round_size(1000, four), 1024u);
  EXPECT_EQ(round_size(2048, four), 2048u);
  // Above it, the same steps: 512 bytes between 2 and 4 KiB.
  EXPECT_EQ(round_size(3000, four), 3072u);
  EXPECT_EQ(round_size(5000, four), 5120u);  // Steps of 1 KiB between 4 and 8 KiB.
  // One division: the next power of two; 0: no rounding beyond 512 bytes.
  BlockPoolOptions one;
  one.roundup_power2_divisions.fill(1);
  EXPECT_EQ(round_size(3 * kMiB, one), 4 * kMiB);
  EXPECT_EQ(round_size(3 * kMiB + 1, BlockPoolOptions{}), 3 * kMiB + 512);
  // Per interval: 300 MiB is in the 256 MiB interval.
  BlockPoolOptions mixed;
  mixed.roundup_power2_divisions[8] = 2;
  EXPECT_EQ(round_size(300 * kMiB, mixed), 384 * kMiB);
  EXPECT_EQ(round_size(3 * kMiB + 1, mixed), 3 * kMiB + 512) << "interval 1 has no divisions";
}

TEST(BlockPoolTest, PoolAllocatesRoundedUpBlocks) {
  HostBacking host;
  BlockPoolOptions four;
  four.roundup_power2_divisions.fill(4);
  BlockPool pool(host.Make(), four);
  Block* b = Alloc(pool, 5 * kMiB + 1);
  EXPECT_EQ(b->size, 6 * kMiB);
  EXPECT_EQ(b->requested_size, 5 * kMiB + 1);
  pool.free(b);
}

TEST(BlockPoolTest, ZeroBytesGiveNoBlockAndNoSegment) {
  HostBacking host;
  BlockPool pool(host.Make());
  absl::StatusOr<Block*> b = pool.allocate(0, kS1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, nullptr);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 0);
  pool.free(nullptr);
}

TEST(BlockPoolTest, SmallAndLargeRequestsUseSeparatePools) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* small = Alloc(pool, 1000);
  EXPECT_EQ(small->size, 1024u);
  Block* medium = Alloc(pool, 3 * kMiB);
  Block* big = Alloc(pool, 18 * kMiB);  // More than the 17 MiB left of medium's segment.
  std::vector<SegmentInfo> segments = pool.snapshot();
  ASSERT_EQ(segments.size(), 3u);
  std::map<size_t, bool> large_by_size;
  for (const SegmentInfo& s : segments) large_by_size[s.total_size] = s.large_pool;
  EXPECT_EQ(large_by_size,
            (std::map<size_t, bool>{{2 * kMiB, false}, {18 * kMiB, true}, {20 * kMiB, true}}));
  EXPECT_EQ(host.outstanding(), 40 * kMiB);

  // The free 2 MiB small segment cannot serve a 1.5 MiB (large) request.
  pool.free(small);
  Block* over_small = Alloc(pool, kMiB + kMiB / 2);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 3) << "served from the large segment's rest";
  EXPECT_EQ(pool.snapshot().size(), 3u);
  pool.free(over_small);
  pool.free(medium);
  pool.free(big);
}

TEST(BlockPoolTest, FreedBlockIsReusedWithoutNewBackingAllocation) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 4096);
  void* first = a->ptr;
  std::memset(a->ptr, 0x5a, a->size);
  pool.free(a);
  Block* b = Alloc(pool, 4000);
  EXPECT_EQ(b->ptr, first);
  EXPECT_EQ(b->size, 4096u);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 1);
  pool.free(b);
}

TEST(BlockPoolTest, BestFitTakesTheSmallestCachedBlockThatFits) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 64 << 10);
  Block* sep1 = Alloc(pool, 512);
  Block* b = Alloc(pool, 16 << 10);
  Block* sep2 = Alloc(pool, 512);
  void* b_ptr = b->ptr;
  pool.free(a);
  pool.free(b);
  Block* c = Alloc(pool, 10 << 10);
  EXPECT_EQ(c->ptr, b_ptr) << "the 16 KiB hole fits better than the 64 KiB one";
  for (Block* x : {sep1, sep2, c}) pool.free(x);
}

TEST(BlockPoolTest, SplitBlocksMergeBackIntoOneFreeSegment) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 100 << 10);
  Block* b = Alloc(pool, 200 << 10);
  Block* c = Alloc(pool, 300 << 10);
  // One segment: a, b, c and the free rest, back to back.
  EXPECT_EQ(static_cast<char*>(b->ptr), static_cast<char*>(a->ptr) + a->size);
  EXPECT_EQ(static_cast<char*>(c->ptr), static_cast<char*>(b->ptr) + b->size);
  std::memset(a->ptr, 1, a->size);
  std::memset(b->ptr, 2, b->size);
  std::memset(c->ptr, 3, c->size);
  EXPECT_EQ(static_cast<unsigned char*>(a->ptr)[a->size - 1], 1);
  EXPECT_EQ(static_cast<unsigned char*>(b->ptr)[b->size - 1], 2);

  std::vector<SegmentInfo> s = pool.snapshot();
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].blocks.size(), 4u);
  EXPECT_EQ(s[0].allocated_size, 600u << 10);
  EXPECT_EQ(s[0].blocks[3].size, 2 * kMiB - (600 << 10));
  EXPECT_FALSE(s[0].blocks[3].allocated);

  pool.free(b);  // Neighbours a and c are in use: no merge.
  s = pool.snapshot();
  ASSERT_EQ(s[0].blocks.size(), 4u);
  EXPECT_FALSE(s[0].blocks[1].allocated);
  pool.free(a);  // Merges with b.
  s = pool.snapshot();
  ASSERT_EQ(s[0].blocks.size(), 3u);
  EXPECT_EQ(s[0].blocks[0].size, 300u << 10);
  pool.free(c);  // Merges with both sides: the whole segment again.
  s = pool.snapshot();
  ASSERT_EQ(s[0].blocks.size(), 1u);
  EXPECT_EQ(s[0].blocks[0].size, 2 * kMiB);
  EXPECT_EQ(s[0].allocated_size, 0u);

  pool.empty_cache();
  EXPECT_TRUE(pool.snapshot().empty());
  EXPECT_EQ(host.outstanding(), 0u);
  EXPECT_EQ(pool.memory_stats().num_device_free, 1);
}

TEST(BlockPoolTest, LargeBlocksSplitOnlyWhenTheRestExceedsOneMiB) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 19 * kMiB + 512);  // Rest of the 20 MiB segment: < 1 MiB.
  EXPECT_EQ(a->size, 20 * kMiB);
  Block* b = Alloc(pool, 2 * kMiB);  // Rest 18 MiB: split.
  EXPECT_EQ(b->size, 2 * kMiB);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 2);
  pool.free(a);
  pool.free(b);
}

TEST(BlockPoolTest, FreedBlockIsNotReusedByAnotherStream) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 4096, kS1);
  void* a_ptr = a->ptr;
  pool.free(a);
  Block* b = Alloc(pool, 4096, kS2);
  EXPECT_NE(b->ptr, a_ptr);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 2) << "stream 2 gets its own segment";
  Block* c = Alloc(pool, 4096, kS1);
  EXPECT_EQ(c->ptr, a_ptr);
  pool.free(b);
  pool.free(c);
}

TEST(BlockPoolTest, RecordStreamKeepsBlockUntilThatStreamsWorkFinishes) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 4096, kS1);
  void* a_ptr = a->ptr;
  pool.record_stream(a, kS1);  // Its own stream: nothing to wait for.
  pool.record_stream(a, kS2);
  pool.record_stream(a, kS2);  // Once is enough.
  host.Submit(kS2);            // A kernel on stream 2 still reads the block.
  pool.free(a);
  EXPECT_EQ(host.recorded(), 1);
  EXPECT_EQ(pool.memory_stats().allocated_bytes, 0);

  std::vector<SegmentInfo> s = pool.snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].blocks[0].pending_free);
  EXPECT_FALSE(s[0].blocks[0].allocated);

  Block* b = Alloc(pool, 4096, kS1);
  EXPECT_NE(b->ptr, a_ptr) << "reused while stream 2 may still use it";
  pool.empty_cache();  // The pending block's segment is not released either.
  EXPECT_EQ(pool.memory_stats().num_device_free, 0);

  host.Finish(kS2);
  Block* c = Alloc(pool, 4096, kS1);
  EXPECT_EQ(c->ptr, a_ptr);
  EXPECT_EQ(host.live_events(), 0);
  pool.free(b);
  pool.free(c);
  s = pool.snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].blocks.size(), 1u) << "merged back into one free segment";
}

TEST(BlockPoolTest, BlockWhoseEventCannotBeRecordedIsNeverReused) {
  HostBacking host;
  BlockPoolBacking backing = host.Make();
  backing.record_event = [](Stream) -> absl::StatusOr<void*> {
    return absl::FailedPreconditionError("no such stream");
  };
  BlockPool pool(std::move(backing));
  Block* a = Alloc(pool, 4096);
  void* a_ptr = a->ptr;
  pool.record_stream(a, kS2);
  pool.free(a);
  Block* b = Alloc(pool, 4096);
  EXPECT_NE(b->ptr, a_ptr);
  EXPECT_TRUE(pool.snapshot()[0].blocks[0].pending_free);
  pool.free(b);
}

TEST(BlockPoolTest, EmptyCacheReleasesOnlyWhollyFreeSegments) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* held = Alloc(pool, 1000);
  Block* other = Alloc(pool, 12 * kMiB);
  Block* freed_in_held_segment = Alloc(pool, 1000);
  pool.free(other);
  pool.free(freed_in_held_segment);
  EXPECT_EQ(pool.memory_stats().reserved_bytes, static_cast<int64_t>(14 * kMiB));
  pool.empty_cache();
  MemoryStats stats = pool.memory_stats();
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(stats.segment, 1);
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(host.outstanding(), 2 * kMiB);
  std::memset(held->ptr, 7, held->size);  // Still valid memory.
  pool.free(held);
  pool.empty_cache();
  EXPECT_EQ(host.outstanding(), 0u);
}

TEST(BlockPoolTest, StatsTrackCurrentAndPeakUntilReset) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 1000);
  Block* b = Alloc(pool, 3 * kMiB);
  MemoryStats s = pool.memory_stats();
  EXPECT_EQ(s.allocated_bytes, static_cast<int64_t>(1024 + 3 * kMiB));
  EXPECT_EQ(s.requested_bytes, static_cast<int64_t>(1000 + 3 * kMiB));
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(22 * kMiB));
  EXPECT_EQ(s.allocation, 2);
  EXPECT_EQ(s.segment, 2);
  EXPECT_EQ(s.num_device_alloc, 2);
  pool.free(b);
  s = pool.memory_stats();
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.peak_allocated_bytes, static_cast<int64_t>(1024 + 3 * kMiB));
  EXPECT_EQ(s.allocation, 1);
  pool.reset_peak_memory_stats();
  s = pool.memory_stats();
  EXPECT_EQ(s.peak_allocated_bytes, 1024);
  EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(22 * kMiB));
  pool.empty_cache();
  pool.reset_peak_memory_stats();
  EXPECT_EQ(pool.memory_stats().peak_reserved_bytes, static_cast<int64_t>(2 * kMiB));
  pool.free(a);
}

TEST(BlockPoolTest, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  HostBacking host(/*budget=*/24 * kMiB);
  BlockPool pool(host.Make());
  pool.free(Alloc(pool, 12 * kMiB));  // 12 MiB cached.
  Block* b = Alloc(pool, 14 * kMiB);  // 12 + 14 > 24: fits only after the release.
  ASSERT_NE(b, nullptr);
  MemoryStats s = pool.memory_stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(14 * kMiB));

  absl::StatusOr<Block*> too_much = pool.allocate(14 * kMiB, kS1);
  ASSERT_FALSE(too_much.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(too_much.status())) << too_much.status();
  EXPECT_EQ(pool.memory_stats().num_ooms, 1);
  EXPECT_EQ(pool.memory_stats().num_alloc_retries, 2);
  std::memset(b->ptr, 1, b->size);  // The held block is untouched.
  pool.free(b);
  Block* again = Alloc(pool, 14 * kMiB);
  EXPECT_NE(again, nullptr) << "served from the cache again";
  pool.free(again);
}

// Note [Allocating during a capture]: no event is recorded or queried, no
// memory returned, until the last capture ends; then the set-aside blocks
// are freed as usual.
TEST(BlockPoolTest, DuringACaptureNoEventIsTouchedAndNoMemoryReturned) {
  HostBacking host(/*budget=*/24 * kMiB);
  BlockPool pool(host.Make());
  Block* shared = Alloc(pool, kMiB / 2);  // a 2 MiB small segment
  pool.record_stream(shared, kS2);
  host.Submit(kS2);
  pool.free(Alloc(pool, 12 * kMiB));  // 12 MiB cached
  pool.begin_capture();
  pool.begin_capture();  // captures nest
  pool.free(shared);
  EXPECT_EQ(host.recorded(), 0) << "an event recorded during a capture";
  // Neither the release of the cached 12 MiB nor a wait: out of memory now.
  absl::StatusOr<Block*> big = pool.allocate(14 * kMiB, kS1);
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  EXPECT_EQ(pool.memory_stats().num_alloc_retries, 0);
  EXPECT_EQ(pool.memory_stats().num_device_free, 0);
  pool.empty_cache();
  EXPECT_EQ(pool.memory_stats().num_device_free, 0);
  Block* small = Alloc(pool, kMiB);  // the small segment's free rest still serves
  ASSERT_NE(small, nullptr);
  pool.end_capture();
  EXPECT_EQ(host.recorded(), 0) << "the outer capture is still underway";
  pool.end_capture();
  EXPECT_EQ(host.recorded(), 1) << "the set-aside block's event, once no capture is underway";
  host.Finish(kS2);
  pool.free(small);
  pool.empty_cache();
  EXPECT_GT(pool.memory_stats().num_device_free, 0);
  Block* again = Alloc(pool, 14 * kMiB);  // the retries work again
  EXPECT_NE(again, nullptr);
  pool.free(again);
}

TEST(BlockPoolTest, OutOfMemoryWaitsForBlocksPendingOnOtherStreamsBeforeGivingUp) {
  HostBacking host(/*budget=*/20 * kMiB);
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 15 * kMiB, kS1);  // The one 20 MiB segment the budget allows.
  pool.record_stream(a, kS2);
  host.Submit(kS2);  // Stream 2 still reads `a`.
  pool.free(a);      // Pending on stream 2's event.
  ASSERT_FALSE(host.finished(kS2));
  // Nothing is cached and the source is full: only waiting for stream 2 frees
  // the segment.
  Block* b = Alloc(pool, 15 * kMiB, kS1);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(host.synchronized(), 1);
  EXPECT_TRUE(host.finished(kS2));
  EXPECT_EQ(host.live_events(), 0);
  const MemoryStats s = pool.memory_stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(16 * kMiB));
  pool.free(b);
}

TEST(BlockPoolTest, MaxSplitSizeKeepsOversizeBlocksWhole) {
  HostBacking host;
  BlockPool pool(host.Make(), BlockPoolOptions{.max_split_size = 40 * kMiB});
  Block* big = Alloc(pool, 100 * kMiB);
  void* const big_ptr = big->ptr;
  pool.free(big);
  // A request below max_split_size never takes (and splits) the oversize block.
  Block* small = Alloc(pool, 5 * kMiB);
  EXPECT_NE(small->ptr, big_ptr);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 2);
  // A larger request that wastes kLargeBuffer or more does not take it either.
  Block* half = Alloc(pool, 50 * kMiB);
  EXPECT_NE(half->ptr, big_ptr);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 3);
  // One within kLargeBuffer of it does, and it stays whole.
  Block* near = Alloc(pool, 90 * kMiB);
  EXPECT_EQ(near->ptr, big_ptr);
  EXPECT_EQ(near->size, 100 * kMiB);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 3);
  EXPECT_EQ(pool.memory_stats().oversize_segments, 2);  // 100 and 50 MiB.
  pool.free(small);
  pool.free(half);
  pool.free(near);
}

TEST(BlockPoolTest, WithoutMaxSplitSizeTheSameRequestsSplitTheBigBlock) {
  // The control for the test above: torch's default policy splits.
  HostBacking host;
  BlockPool pool(host.Make());
  Block* big = Alloc(pool, 100 * kMiB);
  void* const big_ptr = big->ptr;
  pool.free(big);
  Block* small = Alloc(pool, 5 * kMiB);
  EXPECT_EQ(small->ptr, big_ptr);
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 1);
  pool.free(small);
}

TEST(BlockPoolTest, OutOfMemoryReleasesOversizeBlocksBeforeTheWholeCache) {
  HostBacking host(/*budget=*/2 * kMiB + 100 * kMiB);
  BlockPool pool(host.Make(), BlockPoolOptions{.max_split_size = 40 * kMiB});
  pool.free(Alloc(pool, 1000));  // A cached small segment (2 MiB).
  Block* a = Alloc(pool, 50 * kMiB);
  Block* b = Alloc(pool, 50 * kMiB);
  pool.free(a);  // Two cached oversize segments, neither big enough alone.
  pool.free(b);
  Block* c = Alloc(pool, 80 * kMiB);
  ASSERT_NE(c, nullptr);
  const MemoryStats s = pool.memory_stats();
  EXPECT_EQ(s.num_device_free, 2) << "only the oversize segments were released";
  EXPECT_EQ(s.num_alloc_retries, 0) << "the whole cache was not needed";
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(82 * kMiB));
  pool.free(c);
}

TEST(BlockPoolTest, MemoryLimitRefusesSegmentsPastIt) {
  HostBacking host;
  BlockPool pool(host.Make());
  pool.set_memory_limit(50 * kMiB);
  EXPECT_EQ(pool.memory_limit(), 50 * kMiB);
  Block* a = Alloc(pool, 30 * kMiB);
  absl::StatusOr<Block*> b = pool.allocate(30 * kMiB, kS1);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_THAT(std::string(b.status().message()), ::testing::HasSubstr("52428800"));
  EXPECT_EQ(host.outstanding(), 30 * kMiB) << "the source was never asked";
  pool.free(a);
}

TEST(BlockPoolTest, GarbageCollectionReturnsTheOldestCachedSegmentsPastTheThreshold) {
  HostBacking host;
  BlockPool pool(host.Make(), BlockPoolOptions{.garbage_collection_threshold = 0.5});
  pool.set_memory_limit(100 * kMiB);
  pool.free(Alloc(pool, 1000));  // The small segment, before anything is collectable.
  Block* old_block = Alloc(pool, 30 * kMiB);
  Block* young_block = Alloc(pool, 30 * kMiB);
  void* const young_ptr = young_block->ptr;
  pool.free(old_block);
  for (int i = 0; i < 4; ++i) pool.free(Alloc(pool, 1000));  // Cached: time passes for `old_block`.
  EXPECT_EQ(pool.memory_stats().num_device_alloc, 3);
  pool.free(young_block);
  // 62 MiB reserved > 50 MiB: before the new segment (another stream, so
  // nothing cached fits), the older of the two cached 30 MiB segments goes.
  Block* c = Alloc(pool, 12 * kMiB, kS2);
  MemoryStats s = pool.memory_stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>((30 + 2 + 12) * kMiB));
  std::vector<SegmentInfo> segments = pool.snapshot();
  EXPECT_TRUE(std::any_of(segments.begin(), segments.end(), [&](const SegmentInfo& seg) {
    return seg.address == reinterpret_cast<uintptr_t>(young_ptr);
  })) << "the younger segment stays cached";
  pool.free(c);
}

TEST(BlockPoolTest, GarbageCollectionWaitsUntilTheThresholdIsPassed) {
  HostBacking host;
  BlockPool pool(host.Make(), BlockPoolOptions{.garbage_collection_threshold = 0.8});
  pool.set_memory_limit(100 * kMiB);
  pool.free(Alloc(pool, 30 * kMiB));
  pool.free(Alloc(pool, 30 * kMiB));  // Reuses the first: 30 MiB reserved.
  pool.free(Alloc(pool, 40 * kMiB, kS2));
  Block* c = Alloc(pool, 12 * kMiB, Stream(Device(DeviceType::kCUDA, 0), 3));
  EXPECT_EQ(pool.memory_stats().reserved_bytes, static_cast<int64_t>(82 * kMiB));
  EXPECT_EQ(pool.memory_stats().num_device_free, 0) << "70 MiB < 80 MiB: nothing collected";
  pool.free(c);
}

TEST(BlockPoolTest, ParsesTheAllocatorConfigAsTorch) {
  absl::StatusOr<AllocatorConfig> c =
      ParseAllocatorConfig("max_split_size_mb:128, garbage_collection_threshold:0.6");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->options.max_split_size, 128 * kMiB);
  EXPECT_DOUBLE_EQ(c->options.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(c->ignored.empty());

  c = ParseAllocatorConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->options.max_split_size, ~size_t{0});
  EXPECT_EQ(c->options.garbage_collection_threshold, 0);

  c = ParseAllocatorConfig("expandable_segments:False,backend:native");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->ignored.empty());

  c = ParseAllocatorConfig(
      "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True,"
      "backend:cudaMallocAsync,max_split_size_mb:64,release_lock_on_cudamalloc:True");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->options.max_split_size, 64 * kMiB);
  // Intervals 0..8 (up to 256 MiB) take the first value, 9 (512 MiB) the
  // second, and every later one the '>' value.
  const std::array<size_t, 16> expected = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4};
  EXPECT_EQ(c->options.roundup_power2_divisions, expected);
  ASSERT_EQ(c->ignored.size(), 3u);
  EXPECT_THAT(c->ignored[0], ::testing::HasSubstr("expandable_segments:True is not supported"));
  EXPECT_THAT(c->ignored[1], ::testing::HasSubstr("backend:cudaMallocAsync is not supported"));
  EXPECT_THAT(c->ignored[2], ::testing::HasSubstr("release_lock_on_cudamalloc is not supported"));

  c = ParseAllocatorConfig("roundup_power2_divisions:4");
  ASSERT_TRUE(c.ok()) << c.status();
  for (size_t d : c->options.roundup_power2_divisions) EXPECT_EQ(d, 4u);
}

TEST(BlockPoolTest, RefusesMalformedAllocatorConfigNamingTheKey) {
  auto error = [](absl::string_view conf) {
    absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig(conf);
    EXPECT_FALSE(c.ok()) << conf;
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << conf;
    return std::string(c.status().message());
  };
  EXPECT_THAT(error("max_split_size_mb:20"),
              ::testing::HasSubstr("max_split_size_mb:20 is not valid"));
  EXPECT_THAT(error("max_split_size_mb:lots"), ::testing::HasSubstr("greater than 20"));
  EXPECT_THAT(error("garbage_collection_threshold:1.0"),
              ::testing::HasSubstr("strictly between 0.0 and 1.0"));
  EXPECT_THAT(error("garbage_collection_threshold:0"), ::testing::HasSubstr("0.0 and 1.0"));
  EXPECT_THAT(error("expandable_segments:yes"), ::testing::HasSubstr("True or False"));
  EXPECT_THAT(error("max_split_mb:64"), ::testing::HasSubstr("unrecognized option 'max_split_mb'"));
  EXPECT_THAT(error("max_split_size_mb"), ::testing::HasSubstr("has no value"));
  EXPECT_THAT(error("roundup_power2_divisions:3"), ::testing::HasSubstr("a power of two"));
  EXPECT_THAT(error("roundup_power2_divisions:[3:2]"), ::testing::HasSubstr("powers of two"));
  EXPECT_THAT(error("roundup_power2_divisions:[512:2,256:1]"),
              ::testing::HasSubstr("increasing order"));
  EXPECT_THAT(error("roundup_power2_divisions:[256:1"), ::testing::HasSubstr("closed by ']'"));
}

TEST(BlockPoolTest, OtherBackingErrorsAreReturnedWithoutRetry) {
  HostBacking host;
  host.fail_with_ = absl::FailedPreconditionError("no device");
  BlockPool pool(host.Make());
  absl::StatusOr<Block*> b = pool.allocate(100, kS1);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(b.status()));
  EXPECT_EQ(pool.memory_stats().num_alloc_retries, 0);
  EXPECT_EQ(pool.memory_stats().num_ooms, 0);
}

TEST(BlockPoolTest, SnapshotDescribesSegmentsAndBlocks) {
  HostBacking host;
  BlockPool pool(host.Make());
  Block* a = Alloc(pool, 700, kS1);
  Block* b = Alloc(pool, 2 * kMiB, kS2);
  std::vector<SegmentInfo> s = pool.snapshot();
  ASSERT_EQ(s.size(), 2u);
  for (const SegmentInfo& seg : s) {
    size_t sum = 0;
    for (const BlockInfo& blk : seg.blocks) sum += blk.size;
    EXPECT_EQ(sum, seg.total_size);
    EXPECT_EQ(seg.blocks.front().address, seg.address);
    if (seg.stream == kS1) {
      EXPECT_FALSE(seg.large_pool);
      EXPECT_EQ(seg.address, reinterpret_cast<uintptr_t>(a->ptr));
      EXPECT_EQ(seg.blocks[0].size, 1024u);
      EXPECT_EQ(seg.blocks[0].requested_size, 700u);
      EXPECT_TRUE(seg.blocks[0].allocated);
      EXPECT_EQ(seg.blocks[1].requested_size, 0u);
    } else {
      EXPECT_EQ(seg.stream, kS2);
      EXPECT_TRUE(seg.large_pool);
      EXPECT_EQ(seg.total_size, 20 * kMiB);
      EXPECT_EQ(seg.allocated_size, 2 * kMiB);
    }
  }
  pool.free(a);
  pool.free(b);
}

TEST(BlockPoolTest, DestructionReturnsEverySegment) {
  HostBacking host;
  {
    BlockPool pool(host.Make());
    Block* a = Alloc(pool, 100);
    pool.record_stream(a, kS2);
    host.Submit(kS2);
    pool.free(a);  // Pending on stream 2 when the pool goes.
    Alloc(pool, 30 * kMiB);
  }
  EXPECT_EQ(host.outstanding(), 0u);
  EXPECT_EQ(host.live_events(), 0);
}

TEST(BlockPoolTest, ConcurrentChurnKeepsTheBooksBalanced) {
  HostBacking host;
  BlockPool pool(host.Make());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<Block*> held;
      for (int i = 0; i < 2000; ++i) {
        if (held.size() < 8 && rng() % 2 == 0) {
          const size_t size = size_t{1} << (6 + rng() % 16);  // 64 B .. 2 MiB
          absl::StatusOr<Block*> b = pool.allocate(size, kS1);
          if (!b.ok()) {
            ++failures;
            continue;
          }
          std::memset((*b)->ptr, t, size);
          held.push_back(*b);
        } else if (!held.empty()) {
          Block* b = held.back();
          held.pop_back();
          if (static_cast<unsigned char*>(b->ptr)[b->requested_size - 1] != t) ++failures;
          pool.free(b);
        }
      }
      for (Block* b : held) pool.free(b);
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << "a block was overwritten by another thread's block";
  MemoryStats s = pool.memory_stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocation, 0);
  pool.empty_cache();
  EXPECT_EQ(host.outstanding(), 0u);
  EXPECT_EQ(pool.memory_stats().reserved_bytes, 0);
}

}  // namespace
}  // namespace ember::cuda
