#include "multiprocessing/cuda_sharing.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/caching_allocator.h"
#include "cuda/device.h"
#include "cuda/status.h"
#include "cuda/stream.h"
#include "multiprocessing/sharing.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

// Note [CUDA IPC]
// cudaIpcGetMemHandle names a whole cudaMalloc allocation, and the caching
// allocator hands out blocks inside larger segments, so a message carries
// the segment's handle plus the storage's offset in it (PyTorch's
// getBaseAllocation). A process may open a given segment only once, so the
// receiver keeps one opening per segment, shared by every storage it
// received from it, and closes it after the last is freed. Lifetimes cross
// processes through a counter in shared memory per sent storage: the sender
// sets it to 1 for the message, the receiver inherits that reference and
// drops it when its storage is freed (an atomic decrement in the mapped
// file), and the sender, which alone may free the block, lets go of its
// storage once the counter is zero. The event recorded at send orders the
// receiver after the sender's queued writes without blocking either host;
// the receiver synchronises its current stream before it drops its
// reference, so the sender never reuses memory the receiver still works on.

namespace {

using Wire = internal::CudaIpcWire;
constexpr const char* kMagic = internal::kCudaIpcMagic;
constexpr uint32_t kVersion = internal::kCudaIpcVersion;

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed CUDA IPC handle: ", what));
}

absl::StatusOr<Wire> Parse(const std::string& bytes) {
  Wire w;
  if (bytes.size() != sizeof(Wire)) {
    return Malformed(absl::StrCat(bytes.size(), " bytes, expected ", sizeof(Wire)));
  }
  std::memcpy(&w, bytes.data(), sizeof(w));
  if (std::memcmp(w.magic, kMagic, sizeof(w.magic)) != 0) return Malformed("bad magic");
  if (w.version != kVersion) {
    return Malformed(absl::StrCat("version ", w.version, " (this build reads ", kVersion, ")"));
  }
  if (w.device < 0) return Malformed(absl::StrCat("device ", w.device));
  if (w.offset > w.segment_size || w.nbytes > w.segment_size - w.offset) {
    return Malformed(absl::StrCat("storage of ", w.nbytes, " bytes at offset ", w.offset,
                                  " does not fit its segment of ", w.segment_size, " bytes"));
  }
  if (w.slot >= static_cast<uint32_t>(internal::IpcRefCounters::kSlots)) {
    return Malformed(absl::StrCat("counter slot ", w.slot));
  }
  if (std::memchr(w.counters, '\0', sizeof(w.counters)) == nullptr || w.counters[0] != '/') {
    return Malformed("counter file name");
  }
  return w;
}

// A sent storage the sender keeps until its counter reaches zero.
struct Sent {
  Storage storage;
  cudaEvent_t event = nullptr;
  internal::IpcRefCounters* counters = nullptr;
  int slot = 0;
};

// A segment of another process, open in this one.
struct OpenSegment {
  void* base = nullptr;
  int device = 0;
  ~OpenSegment() {
    cuda::internal::OnDevice(device, [&] {
      cudaIpcCloseMemHandle(base);
      return absl::OkStatus();
    }).IgnoreError();
  }
};

// What a received storage holds: its segment's opening and the counter
// reference it drops when freed.
struct Received {
  std::shared_ptr<OpenSegment> segment;
  std::shared_ptr<internal::IpcRefCounters> counters;
  int slot = 0;
  int device = 0;
};

// Dropping the reference lets the sender free the block and reuse the
// memory at once, so the work this process queued on the memory must be
// done first: the device's current stream is synchronised before (as PyTorch
// does; work on other streams must be ordered before it by the user, as
// record_stream asks within one process).
void FreeReceived(void* context) {
  auto* r = static_cast<Received*>(context);
  cuda::internal::OnDevice(r->device, [&]() -> absl::Status {
    absl::StatusOr<cuda::Stream> stream = cuda::current_stream(r->device);
    if (stream.ok()) cudaStreamSynchronize(stream->stream());
    return absl::OkStatus();
  }).IgnoreError();
  r->counters->Add(r->slot, -1);
  delete r;
}

class CudaSharingHandler final : public SharingHandler {
 public:
  absl::Status Share(const Storage&) override { return absl::OkStatus(); }
  bool IsShared(const Storage&) const override { return true; }

  absl::StatusOr<ExportedStorage> Export(const Storage& storage) override {
    if (storage.data_ptr().deleter() == &FreeReceived) {
      return absl::FailedPreconditionError(
          "Attempted to send CUDA tensor received from another process; this is not currently "
          "supported. Consider cloning before sending.");
    }
    Collect();
    const int device = storage.device().index();
    const uintptr_t ptr = reinterpret_cast<uintptr_t>(storage.data());
    // The caching allocator's segment that holds the storage.
    uintptr_t base = 0;
    size_t segment_size = 0;
    for (const cuda::SegmentInfo& s : cuda::memory_snapshot()) {
      if (s.stream.device().index() == device && ptr >= s.address &&
          ptr + storage.nbytes() <= s.address + s.total_size) {
        base = s.address;
        segment_size = s.total_size;
        break;
      }
    }
    if (base == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this CUDA storage (", storage.nbytes(), " bytes on cuda:", device,
          ") was not allocated by Ember's CUDA caching allocator, so it cannot be shared through "
          "CUDA IPC; clone it first"));
    }
    Wire w{};
    std::memcpy(w.magic, kMagic, sizeof(w.magic));
    w.version = kVersion;
    w.device = device;
    w.producer_pid = getpid();
    w.segment_size = segment_size;
    w.offset = ptr - base;
    w.nbytes = storage.nbytes();
    Sent sent{.storage = storage};
    EMBER_RETURN_IF_ERROR(cuda::internal::OnDevice(device, [&]() -> absl::Status {
      EMBER_RETURN_IF_ERROR(cuda::runtime_status(
          cudaIpcGetMemHandle(&w.memory, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle"));
      EMBER_RETURN_IF_ERROR(cuda::runtime_status(
          cudaEventCreateWithFlags(&sent.event, cudaEventDisableTiming | cudaEventInterprocess),
          "cudaEventCreateWithFlags"));
      EMBER_ASSIGN_OR_RETURN(cuda::Stream current, cuda::current_stream(device));
      EMBER_RETURN_IF_ERROR(
          cuda::runtime_status(cudaEventRecord(sent.event, current.stream()), "cudaEventRecord"));
      return cuda::runtime_status(cudaIpcGetEventHandle(&w.event, sent.event),
                                  "cudaIpcGetEventHandle");
    }));
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::pair<internal::IpcRefCounters*, int>> slot = AcquireSlot();
    if (!slot.ok()) {
      cudaEventDestroy(sent.event);
      return slot.status();
    }
    sent.counters = slot->first;
    sent.slot = slot->second;
    w.slot = static_cast<uint32_t>(sent.slot);
    std::snprintf(w.counters, sizeof(w.counters), "%s", sent.counters->name().c_str());
    sent_.emplace(std::make_pair(sent.counters, sent.slot), std::move(sent));
    ExportedStorage out;
    out.nbytes = storage.nbytes();
    out.handle.assign(reinterpret_cast<const char*>(&w), sizeof(w));
    out.source = storage;
    return out;
  }

  void Abandon(const ExportedStorage& exported) override {
    absl::StatusOr<Wire> w = Parse(exported.handle);
    if (!w.ok()) return;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [key, sent] : sent_) {
        if (sent.counters->name() == w->counters && sent.slot == static_cast<int>(w->slot)) {
          sent.counters->Add(sent.slot, -1);
          break;
        }
      }
    }
    Collect();
  }

  absl::StatusOr<Storage> Import(ReceivedStorage received) override {
    EMBER_ASSIGN_OR_RETURN(Wire w, Parse(received.handle));
    if (w.nbytes != received.nbytes) {
      return Malformed(
          absl::StrCat("it describes ", w.nbytes, " bytes, the message ", received.nbytes));
    }
    if (kill(w.producer_pid, 0) != 0 && errno == ESRCH) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the process that sent this CUDA tensor (pid ", w.producer_pid,
          ") has exited, and its CUDA memory with it; keep a producer of CUDA tensors alive "
          "until its consumers are done with them"));
    }
    EMBER_ASSIGN_OR_RETURN(int device,
                           cuda::internal::CheckDevice("receiving a CUDA tensor", w.device));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<internal::IpcRefCounters> counters,
                           OpenCounters(w.counters));
    EMBER_ASSIGN_OR_RETURN(std::shared_ptr<OpenSegment> segment, OpenSegmentOf(w));
    EMBER_RETURN_IF_ERROR(cuda::internal::OnDevice(device, [&]() -> absl::Status {
      cudaEvent_t event = nullptr;
      EMBER_RETURN_IF_ERROR(
          cuda::runtime_status(cudaIpcOpenEventHandle(&event, w.event), "cudaIpcOpenEventHandle"));
      EMBER_ASSIGN_OR_RETURN(cuda::Stream current, cuda::current_stream(device));
      absl::Status waited = cuda::runtime_status(cudaStreamWaitEvent(current.stream(), event, 0),
                                                 "cudaStreamWaitEvent");
      cudaEventDestroy(event);
      return waited;
    }));
    auto* r = new Received{.segment = segment,
                           .counters = counters,
                           .slot = static_cast<int>(w.slot),
                           .device = device};
    void* data = static_cast<char*>(segment->base) + w.offset;
    return Storage(DataPtr(data, r, &FreeReceived, Device(DeviceType::kCUDA, device)), w.nbytes);
  }

  int Collect() {
    std::vector<Sent> done;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = sent_.begin(); it != sent_.end();) {
        if (it->second.counters->Get(it->second.slot) <= 0) {
          it->second.counters->Release(it->second.slot);
          done.push_back(std::move(it->second));
          it = sent_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Sent& s : done) cudaEventDestroy(s.event);
    return static_cast<int>(done.size());  // the storages go with `done`
  }

  int Held() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(sent_.size());
  }

 private:
  absl::StatusOr<std::pair<internal::IpcRefCounters*, int>> AcquireSlot()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& file : files_) {
      if (absl::StatusOr<int> slot = file->Acquire(); slot.ok()) {
        return std::make_pair(file.get(), *slot);
      }
    }
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<internal::IpcRefCounters> file,
                           internal::IpcRefCounters::Create("/ember_cuda_ipc"));
    EMBER_ASSIGN_OR_RETURN(int slot, file->Acquire());
    files_.push_back(std::move(file));
    return std::make_pair(files_.back().get(), slot);
  }

  absl::StatusOr<std::shared_ptr<internal::IpcRefCounters>> OpenCounters(const std::string& name) {
    absl::MutexLock lock(&mu_);
    if (auto it = opened_counters_.find(name); it != opened_counters_.end()) return it->second;
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<internal::IpcRefCounters> file,
                           internal::IpcRefCounters::Open(name));
    std::shared_ptr<internal::IpcRefCounters> shared = std::move(file);
    opened_counters_[name] = shared;
    return shared;
  }

  absl::StatusOr<std::shared_ptr<OpenSegment>> OpenSegmentOf(const Wire& w) {
    const std::string key =
        absl::StrCat(w.producer_pid, ":", w.device, ":",
                     std::string(reinterpret_cast<const char*>(&w.memory), sizeof(w.memory)));
    absl::MutexLock lock(&mu_);
    if (auto it = segments_.find(key); it != segments_.end()) {
      if (std::shared_ptr<OpenSegment> open = it->second.lock()) return open;
    }
    auto open = std::make_shared<OpenSegment>();
    open->device = w.device;
    EMBER_RETURN_IF_ERROR(cuda::internal::OnDevice(w.device, [&]() -> absl::Status {
      return cuda::runtime_status(
          cudaIpcOpenMemHandle(&open->base, w.memory, cudaIpcMemLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle");
    }));
    segments_[key] = open;
    return open;
  }

  absl::Mutex mu_;
  std::vector<std::unique_ptr<internal::IpcRefCounters>> files_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<internal::IpcRefCounters*, int>, Sent> sent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<internal::IpcRefCounters>> opened_counters_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::weak_ptr<OpenSegment>> segments_ ABSL_GUARDED_BY(mu_);
};

CudaSharingHandler& Handler() {
  static auto* handler = new CudaSharingHandler();
  return *handler;
}

[[maybe_unused]] const bool kRegistered = [] {
  register_sharing_handler(DeviceType::kCUDA, &Handler());
  return true;
}();

}  // namespace

int cuda_ipc_collect() { return Handler().Collect(); }
int cuda_ipc_blocks_held() { return Handler().Held(); }

// --- Reference counter files -----------------------------------------------------

namespace internal {

namespace {
constexpr size_t kFileBytes = IpcRefCounters::kSlots * sizeof(int64_t);

absl::StatusOr<int64_t*> Map(int fd, const std::string& name) {
  void* p = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap of CUDA IPC counters ", name));
  return static_cast<int64_t*>(p);
}
}  // namespace

absl::StatusOr<std::unique_ptr<IpcRefCounters>> IpcRefCounters::Create(const std::string& prefix) {
  static std::atomic<int> next{0};
  const std::string name = absl::StrCat(prefix, "_", getpid(), "_", next++);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("creating CUDA IPC counters ", name));
  if (ftruncate(fd, kFileBytes) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("sizing CUDA IPC counters ", name, " (is /dev/shm full?)"));
  }
  absl::StatusOr<int64_t*> counters = Map(fd, name);
  close(fd);
  if (!counters.ok()) {
    shm_unlink(name.c_str());
    return counters.status();
  }
  return std::unique_ptr<IpcRefCounters>(new IpcRefCounters(name, *counters, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<IpcRefCounters>> IpcRefCounters::Open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("opening CUDA IPC counters ", name,
                                            " (has the process that sent the tensor exited?)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != kFileBytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC counters ", name, " have the wrong size; not an Ember counter file"));
  }
  absl::StatusOr<int64_t*> counters = Map(fd, name);
  close(fd);
  EMBER_RETURN_IF_ERROR(counters.status());
  return std::unique_ptr<IpcRefCounters>(new IpcRefCounters(name, *counters, /*owner=*/false));
}

IpcRefCounters::~IpcRefCounters() {
  munmap(counters_, kFileBytes);
  if (owner_) shm_unlink(name_.c_str());
}

absl::StatusOr<int> IpcRefCounters::Acquire() {
  int slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (next_ < kSlots) {
    slot = next_++;
  } else {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", kSlots, " slots of CUDA IPC counters ", name_, " are in use"));
  }
  __atomic_store_n(&counters_[slot], 1, __ATOMIC_SEQ_CST);
  return slot;
}

void IpcRefCounters::Release(int slot) { free_.push_back(slot); }

int64_t IpcRefCounters::Add(int slot, int64_t delta) {
  return __atomic_add_fetch(&counters_[slot], delta, __ATOMIC_SEQ_CST);
}

int64_t IpcRefCounters::Get(int slot) const {
  return __atomic_load_n(&counters_[slot], __ATOMIC_SEQ_CST);
}

}  // namespace internal

}  // namespace ember::multiprocessing
