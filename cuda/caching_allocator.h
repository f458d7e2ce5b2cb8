// The CUDA caching allocator: device memory for tensors, as torch's
// CUDACachingAllocator. Linking //cuda:caching_allocator registers it as the
// ember::Allocator of DeviceType::kCUDA (GetAllocator), so
// `empty(..., cuda)` takes its memory from here; the functions below are
// torch.cuda's memory-management API under the same names.
//
//   ```cpp
//   #include "cuda/caching_allocator.h"
//   absl::StatusOr<ember::DataPtr> p = ember::cuda::caching_allocator_alloc(1 << 20);
//   if (!p.ok()) return absl::OkStatus();  // no GPU: FailedPrecondition naming the reason
//   int64_t used = ember::cuda::memory_allocated();  // 1 MiB (rounded block sizes)
//   p->Reset();                                      // cached, not cudaFree'd
//   ember::cuda::empty_cache();                      // now returned to the driver
//   ```
//
// Note [CUDA caching allocator]
// cudaMalloc and cudaFree are slow and synchronize the device, so freed
// device memory is kept and handed to later requests instead
// (torch "CUDA semantics > Memory management"). The caching itself lives in
// BlockPool (cuda/block_pool.h), which knows nothing of CUDA: one pool per
// device here over cudaMalloc/cudaFree, and one for pinned host memory over
// cudaHostAlloc/cudaFreeHost (cuda/host_allocator.h). Its behaviour is torch's:
// 512-byte rounding, a small pool (requests up to 1 MiB, 2 MiB segments) and a
// large pool (20 MiB segments below 10 MiB, the request rounded to 2 MiB
// above), best fit with splitting and merging inside a segment, and on
// cudaMalloc failure torch's retries: cached oversize blocks released first,
// then every block pending on record_stream events waited for
// (cudaEventSynchronize) and every wholly free segment released.
//
// PYTORCH_CUDA_ALLOC_CONF is read once, at the first allocation: Ember
// honours max_split_size_mb, garbage_collection_threshold (which, as in
// torch, acts only under set_per_process_memory_fraction) and
// roundup_power2_divisions; the keys torch knows and Ember does not act on
// (expandable_segments:True, backend:cudaMallocAsync,
// release_lock_on_cudamalloc, pinned_*) are named on stderr and ignored (the
// pinned pool keeps torch's host defaults); anything else, or a malformed
// value, fails every allocation with kInvalidArgument naming it
// (ParseAllocatorConfig in block_pool.h).
//
// Streams. A block is allocated on the calling thread's current stream of the
// current device (ember::current_stream) and, once freed, is reused only by
// allocations on that stream: work queued there later runs after the work
// that used the block, so no synchronization is needed. A block used on
// another stream must be declared with record_stream(ptr, stream), as
// torch's Tensor.record_stream: when it is freed, an event is recorded on each
// such stream and the block is reused only after all of them completed
// (polled, never waited for, at the next allocation). Stream ids name the
// streams of the kCUDA DeviceGuardImpl (tensor/device_guard.h), through which
// the events are created, recorded and queried; without one (//cuda:device not
// linked) only the default stream, id 0, exists and its events are plain
// cudaEvents recorded on the legacy default stream.
//
// CUDA graphs (cuda/graphs.h): while a graph is being captured, allocations
// made on a stream taking part in that capture come from the graph's private
// pool (Note [Graph memory pools]), and every pool of the device follows Note
// [Allocating during a capture] in block_pool.h.
//
// Errors: the Status API (caching_allocator_alloc, record_stream) returns
// kFailedPrecondition with the runtime's reason when no device is usable,
// kInvalidArgument for a bad device index or a pointer of another allocator,
// and kResourceExhausted with torch's out-of-memory message ("CUDA out of
// memory. Tried to allocate ..."); Allocator::Allocate, used by tensor
// factories, throws ember::Error with the same messages (README.md "API
// rules"). Nothing touches the CUDA runtime at load time. Queries never fail:
// a device without a usable GPU, or that was never allocated on, reports
// zeros. Environment variables: PYTORCH_CUDA_ALLOC_CONF, as above.
//
// Thread-safety: thread-safe; each device's pool has its own mutex.
#ifndef EMBER_CUDA_CACHING_ALLOCATOR_H_
#define EMBER_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/block_pool.h"
#include "tensor/allocator.h"
#include "tensor/stream.h"

namespace ember::cuda {

// The kCUDA allocator (name "cuda_caching"). Allocate(n) serves the current
// device's current stream and throws ember::Error when no device is usable or
// memory is exhausted. Zero bytes give a null pointer on the current device.
Allocator* caching_allocator();

// torch.cuda.caching_allocator_alloc: `nbytes` on `device` (-1: the current
// device) for `stream` (default: that device's current stream; a given stream
// must be on `device` when both are given). Errors as in the header comment.
absl::StatusOr<DataPtr> caching_allocator_alloc(size_t nbytes, int device = -1,
                                                std::optional<Stream> stream = std::nullopt);

// Tensor.record_stream: `ptr` (from this allocator) is also used by work on
// `stream` (a CUDA stream; its current device when it has no index); when
// freed, its memory is reused only after that work finished. A no-op for the
// stream it was allocated on. InvalidArgument for a pointer of another
// allocator or a stream of another device type; FailedPrecondition for a
// stream id other than 0 when no stream backend is linked.
absl::Status record_stream(const DataPtr& ptr, Stream stream);

// torch.cuda.memory_allocated and friends, for `device` (-1: the current
// device). Bytes are rounded block and segment sizes.
int64_t memory_allocated(int device = -1);
int64_t max_memory_allocated(int device = -1);
int64_t memory_reserved(int device = -1);
int64_t max_memory_reserved(int device = -1);
// Sets the peaks of `device` to the current values.
void reset_peak_memory_stats(int device = -1);
// torch.cuda.set_per_process_memory_fraction: this process's caching
// allocator reserves at most `fraction` (0 to 1) of `device`'s total memory
// (-1: the current device); a request past it fails with the out-of-memory
// error. Also the base of garbage_collection_threshold. kInvalidArgument for
// a fraction outside [0, 1] or a bad device; kFailedPrecondition without one.
absl::Status set_per_process_memory_fraction(double fraction, int device = -1);
// Every counter of `device` (torch.cuda.memory_stats).
MemoryStats memory_stats(int device = -1);
// Returns every cached, wholly free segment of every device to the driver
// (cudaFree), so that other processes can use it; memory in use is untouched.
// Blocks on cudaFree, which synchronizes the device.
void empty_cache();
// The segments of every device with their blocks (torch.cuda.memory_snapshot);
// each segment's stream names its device.
std::vector<SegmentInfo> memory_snapshot();

// A private memory pool's id (torch's MempoolId_t): (0, n) for the pools
// graph_pool_handle() makes to share between graphs, (n, 0) for a graph's
// own. {0, 0} names no pool.
struct MempoolId {
  uint64_t first = 0;
  uint64_t second = 0;
  friend bool operator==(const MempoolId& a, const MempoolId& b) {
    return a.first == b.first && a.second == b.second;
  }
  friend bool operator<(const MempoolId& a, const MempoolId& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;
  }
};

// Note [Graph memory pools]
// A private pool is a BlockPool of its own on one device, over cudaMalloc as
// the device's pool is. From BeginAllocateToPool to EndAllocateToPool, every
// allocation on that device whose stream is capturing the given capture
// (cudaStreamGetCaptureInfo's id; a side stream joined to the capture
// through an event takes part too) comes from the pool; a block freed
// afterwards, during a later capture or a replay, goes back to it and is
// reused only by the pool's own later requests (a graph's replays write the
// same addresses, so nothing else may take them). A pool lives while a graph
// holds it (RetainPool / ReleasePool: pools shared between graphs, as
// torch's graph_pool_handle, count each) or one of its blocks is in use;
// then its memory returns to the driver. The routing check costs nothing
// while no capture is underway in the process. memory_allocated and the
// other queries count the device's own pool only; private_pool_stats reads
// a private pool.
namespace internal {
absl::Status BeginAllocateToPool(int device, MempoolId pool, unsigned long long capture_id);
void EndAllocateToPool(int device, MempoolId pool);
void RetainPool(int device, MempoolId pool);
void ReleasePool(int device, MempoolId pool);
// The counters of a private pool (zeros when it does not exist).
MemoryStats private_pool_stats(int device, MempoolId pool);
}  // namespace internal

namespace internal {
// Fills the event functions of `backing` with CUDA events on kCUDA streams
// (Note [CUDA caching allocator]).
void AddStreamEvents(BlockPoolBacking& backing);
// `stream` with its device index filled in (the current device when it has
// none), or why it names no usable CUDA stream.
absl::StatusOr<Stream> CheckCudaStream(Stream stream);
// "512 bytes", "1.50 KiB", "2.00 MiB", "3.25 GiB", as torch writes sizes.
std::string FormatSize(uint64_t bytes);
}  // namespace internal

}  // namespace ember::cuda

#endif  // EMBER_CUDA_CACHING_ALLOCATOR_H_
