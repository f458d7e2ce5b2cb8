#include "cuda/block_pool.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

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
    return b;
  }

  // Streams as opaque ids: work submitted to a stream completes when the
  // test says so, like a kernel still running on a device queue.
  void Submit(Stream s) { ++submitted_[s.id()]; }
  void Finish(Stream s) { completed_[s.id()] = submitted_[s.id()]; }

  size_t outstanding() const { return outstanding_; }
  int recorded() const { return recorded_; }
  int live_events() const { return live_events_; }
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
