#include "multiprocessing/sharing.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "multiprocessing/shared_segment.h"
#include "tensor/error.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"
#include "tensor/thread_pool.h"

namespace ember::multiprocessing {
namespace {

std::atomic<SharingStrategy> g_strategy{SharingStrategy::kFileDescriptor};

const char* StrategyName(SharingStrategy s) {
  return s == SharingStrategy::kFileDescriptor ? "file_descriptor" : "file_system";
}

// memcpy, split over the intra-op pool for large storages (one thread
// rarely saturates memory bandwidth).
void CopyBytes(void* dst, const void* src, size_t n) {
  constexpr int64_t kChunk = 1 << 20;
  if (n < 4 * static_cast<size_t>(kChunk)) {
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    const size_t from = begin * kChunk, to = std::min<size_t>(n, end * kChunk);
    std::memcpy(static_cast<char*>(dst) + from, static_cast<const char*>(src) + from, to - from);
  });
}

// A shared storage's DataPtr context: its segment.
struct SegmentRef {
  std::shared_ptr<SharedSegment> segment;
};

void DeleteSegmentRef(void* context) {
  auto* ref = static_cast<SegmentRef*>(context);
  std::shared_ptr<SharedSegment> segment = std::move(ref->segment);
  delete ref;
  SharedSegment::Recycle(std::move(segment));
}

SharedSegment* SegmentOf(const Storage& storage) {
  if (!storage.defined() || storage.data_ptr().deleter() != &DeleteSegmentRef) return nullptr;
  return static_cast<SegmentRef*>(storage.data_ptr().context())->segment.get();
}

DataPtr MakeDataPtr(std::shared_ptr<SharedSegment> segment) {
  void* data = segment->data();
  return DataPtr(data, new SegmentRef{std::move(segment)}, &DeleteSegmentRef, kCPU);
}

// Lets `empty()`-style code allocate straight into shared memory.
class ShmAllocator : public Allocator {
 public:
  explicit ShmAllocator(SharingStrategy strategy) : strategy_(strategy) {}
  DataPtr Allocate(size_t nbytes) override {
    absl::StatusOr<std::shared_ptr<SharedSegment>> seg = SharedSegment::Acquire(strategy_, nbytes);
    EMBER_CHECK(seg.ok(), seg.status().message());
    return MakeDataPtr(*std::move(seg));
  }
  std::string_view name() const override {
    return strategy_ == SharingStrategy::kFileDescriptor ? "shm_fd" : "shm_file";
  }

 private:
  SharingStrategy strategy_;
};

Allocator* AllocatorFor(SharingStrategy s) {
  static ShmAllocator fd(SharingStrategy::kFileDescriptor);
  static ShmAllocator file(SharingStrategy::kFileSystem);
  return s == SharingStrategy::kFileDescriptor ? static_cast<Allocator*>(&fd) : &file;
}

class CpuSharingHandler : public SharingHandler {
 public:
  absl::Status Share(const Storage& storage) override {
    if (IsShared(storage)) return absl::OkStatus();
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<SharedSegment> seg,
                           SharedSegment::Acquire(g_strategy.load(), storage.nbytes()));
    CopyBytes(seg->data(), storage.data(), storage.nbytes());
    SharingStrategy strategy = seg->strategy();
    Storage handle = storage;  // shares the storage's state
    handle.set_data_ptr(MakeDataPtr(std::move(seg)), AllocatorFor(strategy));
    return absl::OkStatus();
  }

  bool IsShared(const Storage& storage) const override { return SegmentOf(storage) != nullptr; }

  absl::StatusOr<ExportedStorage> Export(const Storage& storage) override {
    SharedSegment* seg = SegmentOf(storage);
    if (seg == nullptr) {
      return absl::FailedPreconditionError("Export: the storage is not in shared memory");
    }
    ExportedStorage out;
    out.nbytes = storage.nbytes();
    out.source = storage;
    if (seg->strategy() == SharingStrategy::kFileDescriptor) {
      out.handle = "d";
      out.fds.push_back(seg->fd());
    } else {
      out.handle = "n" + seg->name();
    }
    seg->AddMessageReference();
    return out;
  }

  void Abandon(const ExportedStorage& exported) override {
    if (SharedSegment* seg = SegmentOf(exported.source)) seg->DropMessageReference();
  }

  absl::StatusOr<Storage> Import(ReceivedStorage received) override {
    absl::StatusOr<std::shared_ptr<SharedSegment>> seg;
    if (received.handle == "d" && received.fds.size() == 1) {
      seg = SharedSegment::ImportFd(std::move(received.fds[0]));
    } else if (received.handle.size() > 1 && received.handle[0] == 'n' && received.fds.empty()) {
      seg = SharedSegment::ImportName(received.handle.substr(1));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("malformed CPU storage handle ('",
                                                     received.handle.substr(0, 64), "' with ",
                                                     received.fds.size(), " descriptors)"));
    }
    if (!seg.ok()) return seg.status();
    if (received.nbytes > (*seg)->capacity()) {
      return absl::InvalidArgumentError(absl::StrCat("a storage of ", received.nbytes,
                                                     " bytes does not fit its region of ",
                                                     (*seg)->capacity(), " bytes"));
    }
    SharingStrategy strategy = (*seg)->strategy();
    return Storage(MakeDataPtr(*std::move(seg)), received.nbytes, AllocatorFor(strategy));
  }
};

struct Registry {
  std::mutex mu;
  std::array<SharingHandler*, kNumDeviceTypes> handlers{};
};

Registry& GetRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    static CpuSharingHandler cpu;
    reg->handlers[static_cast<int>(DeviceType::kCPU)] = &cpu;
    return reg;
  }();
  return *r;
}

}  // namespace

std::vector<std::string> get_all_sharing_strategies() { return {"file_descriptor", "file_system"}; }

std::string get_sharing_strategy() { return StrategyName(g_strategy.load()); }

absl::Status set_sharing_strategy(std::string_view name) {
  if (name == "file_descriptor") {
    g_strategy = SharingStrategy::kFileDescriptor;
  } else if (name == "file_system") {
    g_strategy = SharingStrategy::kFileSystem;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown sharing strategy '", std::string(name),
                     "'; valid strategies: ", absl::StrJoin(get_all_sharing_strategies(), ", ")));
  }
  return absl::OkStatus();
}

absl::Status set_shared_memory_prefix(std::string_view prefix) {
  return SetRegionNamePrefix(prefix);
}

void register_sharing_handler(DeviceType type, SharingHandler* handler) {
  Registry& r = GetRegistry();
  std::lock_guard lock(r.mu);
  r.handlers[static_cast<int>(type)] = handler;
}

absl::StatusOr<SharingHandler*> get_sharing_handler(DeviceType type) {
  Registry& r = GetRegistry();
  std::lock_guard lock(r.mu);
  SharingHandler* h = r.handlers[static_cast<int>(type)];
  if (h == nullptr) {
    return absl::UnimplementedError(absl::StrCat("sharing ", std::string(DeviceTypeName(type)),
                                                 " storages between processes is not supported "
                                                 "yet; copy the tensor to the CPU first"));
  }
  return h;
}

absl::Status share_memory_(const Storage& storage) {
  if (!storage.defined()) return absl::OkStatus();
  EMBER_ASSIGN_OR_RETURN(SharingHandler * h, get_sharing_handler(storage.device().type()));
  return h->Share(storage);
}

absl::Status share_memory_(const Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError("share_memory_: the tensor is undefined");
  }
  return share_memory_(t.storage());
}

absl::StatusOr<Tensor> empty_shared(IntArrayRef sizes, Dtype dtype) {
  int64_t numel = 1;
  for (int64_t d : sizes) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty_shared: negative size in ", ShapeToString(sizes)));
    }
    numel *= d;
  }
  const size_t nbytes = static_cast<size_t>(numel) * element_size(dtype);
  const SharingStrategy strategy = g_strategy.load();
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<SharedSegment> seg,
                         SharedSegment::Acquire(strategy, nbytes));
  Storage storage(MakeDataPtr(std::move(seg)), nbytes, AllocatorFor(strategy));
  return Tensor(MakeTensorImpl(std::move(storage), dtype, sizes, ContiguousStrides(sizes), 0));
}

bool is_shared(const Storage& storage) {
  if (!storage.defined()) return false;
  absl::StatusOr<SharingHandler*> h = get_sharing_handler(storage.device().type());
  return h.ok() && (*h)->IsShared(storage);
}

bool is_shared(const Tensor& t) { return t.defined() && is_shared(t.storage()); }

absl::Status alias_shared_storage(const Storage& storage, const Storage& shared) {
  if (!storage.defined() || !shared.defined()) {
    return absl::InvalidArgumentError("alias_shared_storage: a storage is undefined");
  }
  if (storage.device().type() != DeviceType::kCPU || shared.device().type() != DeviceType::kCPU) {
    return absl::UnimplementedError(
        "alias_shared_storage: only CPU storages can alias shared memory so far");
  }
  SharedSegment* seg = SegmentOf(shared);
  if (seg == nullptr) {
    return absl::InvalidArgumentError(
        "alias_shared_storage: the source storage is not in shared memory; share_memory_ it "
        "first");
  }
  if (storage.nbytes() != shared.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("alias_shared_storage: the storage holds ",
                                                   storage.nbytes(), " bytes but the shared one ",
                                                   shared.nbytes()));
  }
  if (storage.is_alias_of(shared) || storage.data() == shared.data()) return absl::OkStatus();
  const SharingStrategy strategy = seg->strategy();
  auto* ref = static_cast<SegmentRef*>(shared.data_ptr().context());
  Storage handle = storage;  // shares the storage's state
  handle.set_data_ptr(MakeDataPtr(ref->segment), AllocatorFor(strategy));
  return absl::OkStatus();
}

void empty_shared_memory_cache() { SharedSegment::EmptyCache(); }

}  // namespace ember::multiprocessing
