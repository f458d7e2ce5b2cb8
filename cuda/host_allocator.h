// The pinned host allocator: page-locked host memory (cudaHostAlloc) for
// tensors created with pinned_memory, which the GPU copies to and from
// asynchronously and faster than pageable memory; as torch's
// CachingHostAllocator, it caches freed blocks, over the same BlockPool as
// the device allocator (Note [CUDA caching allocator] in caching_allocator.h).
//
//   ```cpp
//   #include "cuda/host_allocator.h"
//   ember::Allocator* pinned = ember::cuda::pinned_allocator();
//   try {
//     ember::DataPtr p = pinned->Allocate(4096);  // device kCPU, page-locked
//     bool pinned_block = ember::cuda::is_pinned(p);  // true
//   } catch (const ember::Error& e) {
//     // no GPU: "CUDA pinned host allocator: cannot allocate 4096 bytes: CUDA is not available:
//     ..."
//   }
//   ```
//
// Blocks are not tied to a stream when allocated: any freed block may serve
// the next request. A block that work on a CUDA stream still reads or writes
// is declared with host_record_stream(ptr, stream); when it is freed, an event
// is recorded on that stream and the block is reused only after it completed.
// Ember's host<->device copies (copy_out in copy_kernels.cc) do this for a
// pinned host side themselves, against the stream the copy runs on (as
// torch's CachingHostAllocator records an event at each copy); other work on
// a pinned tensor (a kernel reading it through a mapped pointer) records it
// with Tensor::record_stream or host_record_stream.
//
// Errors: Allocate throws ember::Error (it serves tensor factories);
// host_record_stream returns absl::Status. Pinning needs a CUDA driver: with
// none, every allocation fails with the runtime's reason. Out of pinned
// memory, the cache is released and the allocation retried once.
//
// Thread-safety: thread-safe.
#ifndef EMBER_CUDA_HOST_ALLOCATOR_H_
#define EMBER_CUDA_HOST_ALLOCATOR_H_

#include "absl/status/status.h"
#include "cuda/block_pool.h"
#include "tensor/allocator.h"
#include "tensor/stream.h"

namespace ember::cuda {

// The allocator behind pinned_memory = true (name "cuda_pinned"): page-locked
// memory; the DataPtr's device is kCPU. Throws ember::Error when CUDA is
// unavailable or pinned memory is exhausted.
Allocator* pinned_allocator();

// Whether `ptr` came from pinned_allocator() (torch's Tensor.is_pinned).
bool is_pinned(const DataPtr& ptr);

// `ptr` (from pinned_allocator()) is used by work queued on the CUDA stream
// `stream` (current device when it has no index); when freed, it is reused
// only after that work finished. InvalidArgument for another allocator's
// pointer or a non-CUDA stream; FailedPrecondition when CUDA is unavailable
// or, without a stream backend, for a stream id other than 0.
absl::Status host_record_stream(const DataPtr& ptr, Stream stream);

// torch.cuda.host_memory_stats(): the pinned pool's counters.
MemoryStats host_memory_stats();
// Returns every wholly free cached pinned segment to the driver (cudaFreeHost).
void host_empty_cache();

}  // namespace ember::cuda

#endif  // EMBER_CUDA_HOST_ALLOCATOR_H_
