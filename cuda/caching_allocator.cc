#include "cuda/caching_allocator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "cuda/status.h"
#include "tensor/device_guard.h"
#include "tensor/status_macros.h"

namespace ember::cuda {
namespace {

BlockPoolBacking DeviceBacking(int device) {
  BlockPoolBacking backing;
  backing.allocate = [device](size_t size) -> absl::StatusOr<void*> {
    return internal::OnDevice(device, [size]() -> absl::StatusOr<void*> {
      void* ptr = nullptr;
      EMBER_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, size));
      return ptr;
    });
  };
  backing.free = [device](void* ptr, size_t size) {
    absl::Status st = internal::OnDevice(device, [ptr] {
      EMBER_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
      return absl::OkStatus();
    });
    if (!st.ok()) std::fprintf(stderr, "ember: %s\n", std::string(st.message()).c_str());
  };
  internal::AddStreamEvents(backing);
  return backing;
}

// PYTORCH_CUDA_ALLOC_CONF, read once (at the first allocation or pool);
// what it names that Ember does not act on is reported on stderr then.
const absl::StatusOr<AllocatorConfig>& Config() {
  static const absl::StatusOr<AllocatorConfig>* const config = [] {
    const char* env = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    auto* parsed = new absl::StatusOr<AllocatorConfig>(ParseAllocatorConfig(env ? env : ""));
    if (parsed->ok()) {
      for (const std::string& line : (*parsed)->ignored) {
        std::fprintf(stderr, "ember: PYTORCH_CUDA_ALLOC_CONF: %s\n", line.c_str());
      }
    }
    return parsed;
  }();
  return *config;
}

// One pool per visible device, made at first use and never destroyed (frees
// may run at exit).
class Devices {
 public:
  static Devices& Get() {
    static Devices* devices = new Devices(device_count());
    return *devices;
  }
  // Null for an index without a device.
  BlockPool* pool(int device) {
    return device >= 0 && device < static_cast<int>(pools_.size()) ? pools_[device].get() : nullptr;
  }

 private:
  explicit Devices(int count) {
    const BlockPoolOptions options = Config().ok() ? Config()->options : BlockPoolOptions{};
    for (int d = 0; d < count; ++d) {
      pools_.push_back(std::make_unique<BlockPool>(DeviceBacking(d), options));
    }
  }
  std::vector<std::unique_ptr<BlockPool>> pools_;
};

// Note [Graph memory pools]'s state: the private pools by (device, id), and
// which capture feeds which pool.
struct PrivatePool {
  PrivatePool(int device, const BlockPoolOptions& options)
      : pool(DeviceBacking(device), options) {}
  BlockPool pool;
  int graphs = 0;  // RetainPool calls not yet released
};

// A private pool's block, as the DataPtr's context: the pool stays alive
// while the block is in use.
struct PrivateBlock {
  Block* block;
  std::shared_ptr<PrivatePool> owner;
};

class PrivatePools {
 public:
  static PrivatePools& Get() {
    static PrivatePools* pools = new PrivatePools;
    return *pools;
  }
  // Captures routing to a pool, process-wide: 0 skips the routing check.
  std::atomic<int> captures{0};
  std::mutex mu;
  using Key = std::tuple<int, uint64_t, uint64_t>;
  std::map<Key, std::shared_ptr<PrivatePool>> pools;
  struct Route {
    int device;
    unsigned long long capture_id;
    MempoolId id;
    std::shared_ptr<PrivatePool> pool;
  };
  std::vector<Route> routes;

  static Key KeyOf(int device, MempoolId id) { return {device, id.first, id.second}; }
  std::shared_ptr<PrivatePool>& FindOrMake(int device, MempoolId id) {
    std::shared_ptr<PrivatePool>& pool = pools[KeyOf(device, id)];
    if (pool == nullptr) {
      pool = std::make_shared<PrivatePool>(
          device, Config().ok() ? Config()->options : BlockPoolOptions{});
    }
    return pool;
  }
  // The pool the capture `stream` takes part in feeds, if any.
  std::shared_ptr<PrivatePool> RouteOf(int device, Stream stream) {
    const std::optional<unsigned long long> id = internal::CaptureIdOf(stream);
    if (!id) return nullptr;
    std::lock_guard<std::mutex> lock(mu);
    for (const Route& r : routes) {
      if (r.device == device && r.capture_id == *id) return r.pool;
    }
    return nullptr;
  }
};

void FreePrivateBlock(void* context) {
  std::unique_ptr<PrivateBlock> b(static_cast<PrivateBlock*>(context));
  b->owner->pool.free(b->block);
}

// The pool a query reads: null without a usable device or for a bad index.
BlockPool* QueryPool(int device) {
  if (!is_available()) return nullptr;
  return Devices::Get().pool(device == -1 ? current_device() : device);
}

void FreeDeviceBlock(void* context) {
  auto* block = static_cast<Block*>(context);
  Devices::Get().pool(block->stream.device().index())->free(block);
}

std::string OutOfMemoryMessage(size_t nbytes, int device, BlockPool& pool,
                               const absl::Status& cause) {
  std::string message =
      absl::StrCat("CUDA out of memory. Tried to allocate ", internal::FormatSize(nbytes), ".");
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const absl::Status info = internal::OnDevice(device, [&] {
    EMBER_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return absl::OkStatus();
  });
  if (info.ok()) {
    absl::StrAppend(&message, " cuda:", device, " has a total capacity of ",
                    internal::FormatSize(total_bytes), " of which ",
                    internal::FormatSize(free_bytes), " is free.");
  }
  const MemoryStats stats = pool.memory_stats();
  absl::StrAppend(
      &message, " Ember has ", internal::FormatSize(stats.allocated_bytes), " allocated and ",
      internal::FormatSize(stats.reserved_bytes - stats.allocated_bytes),
      " reserved but unallocated on it; blocks waiting on record_stream events were waited for "
      "and its wholly free cached segments returned to the driver before the allocation was "
      "retried. Free tensors that are no longer needed or use a smaller batch; when reserved but "
      "unallocated memory is large, the cache is fragmented (ember::cuda::memory_snapshot() "
      "shows where): try PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<MiB> to keep large blocks "
      "whole. (",
      cause.message(), ")");
  return message;
}

absl::StatusOr<DataPtr> AllocateOn(size_t nbytes, int device, std::optional<Stream> stream) {
  if (!Config().ok()) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA caching allocator: cannot allocate ",
                                                   nbytes,
                                                   " bytes: ", Config().status().message()));
  }
  if (absl::Status available = internal::CheckAvailable("caching_allocator_alloc");
      !available.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA caching allocator: cannot allocate ",
                                                      nbytes, " bytes: ", available.message()));
  }
  if (stream.has_value()) {
    if (stream->device().is_cuda() && stream->device().has_index() && device != -1 &&
        device != stream->device().index()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "caching_allocator_alloc: device ", device, " differs from the stream's device ",
          stream->device().str(), "; pass one or make them agree"));
    }
    const Stream named = stream->device().has_index() || !stream->device().is_cuda()
                             ? *stream
                             : Stream(Device(DeviceType::kCUDA, device), stream->id());
    absl::StatusOr<Stream> checked = internal::CheckCudaStream(named);
    if (!checked.ok()) {
      return absl::Status(checked.status().code(),
                          absl::StrCat("caching_allocator_alloc: ", checked.status().message()));
    }
    device = checked->device().index();
  }
  EMBER_ASSIGN_OR_RETURN(const int d, internal::CheckDevice("caching_allocator_alloc", device));
  const Device on(DeviceType::kCUDA, d);
  const Stream s = stream.has_value() ? Stream(on, stream->id()) : current_stream(on);
  PrivatePools& privates = PrivatePools::Get();
  if (privates.captures.load(std::memory_order_acquire) > 0) {
    if (std::shared_ptr<PrivatePool> routed = privates.RouteOf(d, s)) {
      absl::StatusOr<Block*> block = routed->pool.allocate(nbytes, Stream(on, s.id()));
      if (absl::IsResourceExhausted(block.status())) {
        return absl::ResourceExhaustedError(
            OutOfMemoryMessage(nbytes, d, routed->pool, block.status()));
      }
      if (!block.ok()) return block.status();
      if (*block == nullptr) return DataPtr(nullptr, nullptr, nullptr, on);
      return DataPtr((*block)->ptr, new PrivateBlock{*block, routed}, &FreePrivateBlock, on);
    }
  }
  BlockPool& pool = *Devices::Get().pool(d);
  absl::StatusOr<Block*> block = pool.allocate(nbytes, Stream(on, s.id()));
  if (absl::IsResourceExhausted(block.status())) {
    return absl::ResourceExhaustedError(OutOfMemoryMessage(nbytes, d, pool, block.status()));
  }
  if (!block.ok()) return block.status();
  if (*block == nullptr) return DataPtr(nullptr, nullptr, nullptr, on);
  return DataPtr((*block)->ptr, *block, &FreeDeviceBlock, on);
}

class CachingAllocator final : public Allocator {
 public:
  DataPtr Allocate(size_t nbytes) override {
    absl::StatusOr<DataPtr> p = AllocateOn(nbytes, -1, std::nullopt);
    if (!p.ok()) internal::ThrowStatus(p.status());
    return std::move(*p);
  }
  std::string_view name() const override { return "cuda_caching"; }
  void RecordStream(const DataPtr& ptr, ember::Stream stream) override {
    if (absl::Status st = record_stream(ptr, stream); !st.ok()) internal::ThrowStatus(st);
  }
};

// A recorded event of the kCUDA DeviceGuardImpl (//cuda:device, linked
// with this library) and its device.
struct StreamEvent {
  void* event;
  Device device;
};

DeviceGuardImpl& CudaImpl() { return *GetDeviceGuardImpl(DeviceType::kCUDA); }

absl::StatusOr<void*> RecordEvent(Stream stream) {
  const Device device = stream.device();
  EMBER_ASSIGN_OR_RETURN(void* event, CudaImpl().CreateEvent(device, /*enable_timing=*/false));
  if (absl::Status st = CudaImpl().RecordEvent(event, stream); !st.ok()) {
    CudaImpl().DestroyEvent(event, device);
    return st;
  }
  return new StreamEvent{event, device};
}

bool QueryEvent(void* marker) {
  return CudaImpl().QueryEvent(static_cast<StreamEvent*>(marker)->event);
}

void SynchronizeEvent(void* marker) {
  const auto* e = static_cast<StreamEvent*>(marker);
  // A failed wait is the device's error, reported by the next synchronize;
  // the event is treated as complete, as QueryEvent does.
  if (absl::Status st = CudaImpl().SynchronizeEvent(e->event); !st.ok()) {
    std::fprintf(stderr, "ember: waiting for a record_stream event on %s: %s\n",
                 e->device.str().c_str(), std::string(st.message()).c_str());
  }
}

void ReleaseEvent(void* marker) {
  std::unique_ptr<StreamEvent> e(static_cast<StreamEvent*>(marker));
  CudaImpl().DestroyEvent(e->event, e->device);
}

[[maybe_unused]] const bool kRegistered = [] {
  SetAllocator(DeviceType::kCUDA, caching_allocator());
  return true;
}();

}  // namespace

Allocator* caching_allocator() {
  static CachingAllocator allocator;
  return &allocator;
}

absl::StatusOr<DataPtr> caching_allocator_alloc(size_t nbytes, int device,
                                                std::optional<Stream> stream) {
  return AllocateOn(nbytes, device, stream);
}

absl::Status record_stream(const DataPtr& ptr, Stream stream) {
  if (!ptr) return absl::OkStatus();  // Zero bytes: nothing to keep.
  if (ptr.deleter() == &FreePrivateBlock) {
    absl::StatusOr<Stream> s = internal::CheckCudaStream(stream);
    if (!s.ok()) {
      return absl::Status(s.status().code(),
                          absl::StrCat("record_stream: ", s.status().message()));
    }
    auto* b = static_cast<PrivateBlock*>(ptr.context());
    b->owner->pool.record_stream(b->block, *s);
    return absl::OkStatus();
  }
  if (ptr.deleter() != &FreeDeviceBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("record_stream: the pointer on ", ptr.device().str(),
                     " was not allocated by the CUDA caching allocator; only its blocks (and "
                     "pinned ones, through host_record_stream) can be recorded on a stream"));
  }
  absl::StatusOr<Stream> s = internal::CheckCudaStream(stream);
  if (!s.ok())
    return absl::Status(s.status().code(), absl::StrCat("record_stream: ", s.status().message()));
  auto* block = static_cast<Block*>(ptr.context());
  Devices::Get().pool(block->stream.device().index())->record_stream(block, *s);
  return absl::OkStatus();
}

int64_t memory_allocated(int device) {
  BlockPool* pool = QueryPool(device);
  return pool == nullptr ? 0 : pool->memory_stats().allocated_bytes;
}

int64_t max_memory_allocated(int device) {
  BlockPool* pool = QueryPool(device);
  return pool == nullptr ? 0 : pool->memory_stats().peak_allocated_bytes;
}

int64_t memory_reserved(int device) {
  BlockPool* pool = QueryPool(device);
  return pool == nullptr ? 0 : pool->memory_stats().reserved_bytes;
}

int64_t max_memory_reserved(int device) {
  BlockPool* pool = QueryPool(device);
  return pool == nullptr ? 0 : pool->memory_stats().peak_reserved_bytes;
}

void reset_peak_memory_stats(int device) {
  if (BlockPool* pool = QueryPool(device)) pool->reset_peak_memory_stats();
}

MemoryStats memory_stats(int device) {
  BlockPool* pool = QueryPool(device);
  return pool == nullptr ? MemoryStats{} : pool->memory_stats();
}

absl::Status set_per_process_memory_fraction(double fraction, int device) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("set_per_process_memory_fraction: invalid fraction value: ", fraction,
                     ". Allowed range: 0~1 (a share of the device's total memory)"));
  }
  EMBER_ASSIGN_OR_RETURN(const int d,
                         internal::CheckDevice("set_per_process_memory_fraction", device));
  EMBER_ASSIGN_OR_RETURN(const DeviceProperties props, get_device_properties(d));
  Devices::Get().pool(d)->set_memory_limit(
      static_cast<size_t>(fraction * static_cast<double>(props.total_memory)));
  return absl::OkStatus();
}

void empty_cache() {
  for (int d = 0; d < device_count(); ++d) Devices::Get().pool(d)->empty_cache();
}

std::vector<SegmentInfo> memory_snapshot() {
  std::vector<SegmentInfo> all;
  for (int d = 0; d < device_count(); ++d) {
    std::vector<SegmentInfo> segments = Devices::Get().pool(d)->snapshot();
    all.insert(all.end(), std::make_move_iterator(segments.begin()),
               std::make_move_iterator(segments.end()));
  }
  return all;
}

namespace internal {

absl::Status BeginAllocateToPool(int device, MempoolId id, unsigned long long capture_id) {
  EMBER_ASSIGN_OR_RETURN(const int d, CheckDevice("CUDA graph capture", device));
  PrivatePools& privates = PrivatePools::Get();
  std::shared_ptr<PrivatePool> pool;
  {
    std::lock_guard<std::mutex> lock(privates.mu);
    pool = privates.FindOrMake(d, id);
    privates.routes.push_back({d, capture_id, id, pool});
  }
  Devices::Get().pool(d)->begin_capture();
  pool->pool.begin_capture();
  privates.captures.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

void EndAllocateToPool(int device, MempoolId id) {
  PrivatePools& privates = PrivatePools::Get();
  std::shared_ptr<PrivatePool> pool;
  {
    std::lock_guard<std::mutex> lock(privates.mu);
    for (auto it = privates.routes.begin(); it != privates.routes.end(); ++it) {
      if (it->device == device && it->id == id) {
        pool = it->pool;
        privates.routes.erase(it);
        break;
      }
    }
  }
  if (pool == nullptr) return;
  privates.captures.fetch_sub(1, std::memory_order_acq_rel);
  pool->pool.end_capture();
  Devices::Get().pool(device)->end_capture();
}

void RetainPool(int device, MempoolId id) {
  PrivatePools& privates = PrivatePools::Get();
  std::lock_guard<std::mutex> lock(privates.mu);
  ++privates.FindOrMake(device, id)->graphs;
}

void ReleasePool(int device, MempoolId id) {
  PrivatePools& privates = PrivatePools::Get();
  std::shared_ptr<PrivatePool> released;
  {
    std::lock_guard<std::mutex> lock(privates.mu);
    auto it = privates.pools.find(PrivatePools::KeyOf(device, id));
    if (it == privates.pools.end()) return;
    if (--it->second->graphs > 0) return;
    released = std::move(it->second);  // freed here, or by its last block's free
    privates.pools.erase(it);
  }
}

MemoryStats private_pool_stats(int device, MempoolId id) {
  PrivatePools& privates = PrivatePools::Get();
  std::lock_guard<std::mutex> lock(privates.mu);
  auto it = privates.pools.find(PrivatePools::KeyOf(device, id));
  return it == privates.pools.end() ? MemoryStats{} : it->second->pool.memory_stats();
}

void AddStreamEvents(BlockPoolBacking& backing) {
  backing.record_event = &RecordEvent;
  backing.query_event = &QueryEvent;
  backing.release_event = &ReleaseEvent;
  backing.synchronize_event = &SynchronizeEvent;
}

absl::StatusOr<Stream> CheckCudaStream(Stream stream) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("the stream is on ", stream.device().str(),
                                                   "; pass a stream of a CUDA device"));
  }
  EMBER_ASSIGN_OR_RETURN(const int device,
                         CheckDevice("the stream's device", stream.device().index()));
  return Stream(Device(DeviceType::kCUDA, device), stream.id());
}

std::string FormatSize(uint64_t bytes) {
  char text[64];
  if (bytes <= 1024) {
    std::snprintf(text, sizeof(text), "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes < (uint64_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.2f KiB", bytes / 1024.0);
  } else if (bytes < (uint64_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(text, sizeof(text), "%.2f GiB", bytes / 1073741824.0);
  }
  return text;
}

}  // namespace internal

}  // namespace ember::cuda
