// Sharing CUDA tensors between processes through CUDA IPC: the
// SharingHandler for kCUDA storages, registered when this library is linked
// (//multiprocessing:cuda_sharing, part of //:ember in builds with CUDA).
//
//   ```cpp compile-only
//   #include "multiprocessing/queue.h"
//   // Producer (the child must be started with spawn or forkserver: a forked
//   // child cannot use CUDA once its parent has):
//   ember::Tensor w = ember::ones({1024}, ember::TensorOptions().device(ember::Device(ember::DeviceType::kCUDA, 0)));
//   EMBER_RETURN_IF_ERROR(queue.put(ember::multiprocessing::Value(w)));
//   // Consumer: the tensor arrives on cuda:0 over the same memory; writes are
//   // seen by both processes.
//   ```
//
// What a message carries for a CUDA storage (Note [CUDA IPC]): the IPC
// handle of the caching allocator's segment that holds it and the storage's
// offset in it, an interprocess event recorded on the sender's current
// stream (the receiver's current stream waits for it, so it sees every write
// queued before the send), and a slot of a reference counter in a
// shared-memory file of the sender. The receiver opens each segment once
// (cudaIpcOpenMemHandle) however many storages of it arrive, and closes it
// when the last one is freed. The sender keeps the storage alive while its
// counter is above zero: one reference for the message in flight, handed to
// the receiver, which drops it when its storage is freed. The sender frees
// blocks whose counter reached zero at its next send, or at
// cuda_ipc_collect() (torch.cuda.ipc_collect).
//
// As in PyTorch: the producer must outlive the consumers' use of the memory
// (a consumer receiving from a producer that has exited gets an error naming
// its pid, never stale memory); a CUDA tensor received from another process
// cannot be sent on ("Attempted to send CUDA tensor received from another
// process; this is not currently supported. Consider cloning before
// sending."); a consumer that dies without freeing keeps the block alive in
// the producer until the producer exits.
//
// Thread-safety: thread-safe.
#ifndef EMBER_MULTIPROCESSING_CUDA_SHARING_H_
#define EMBER_MULTIPROCESSING_CUDA_SHARING_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ember::multiprocessing {

// Frees the CUDA blocks this process sent that no consumer holds any more
// (torch.cuda.ipc_collect). Returns how many were freed.
int cuda_ipc_collect();

// How many sent CUDA storages this process still keeps for consumers.
int cuda_ipc_blocks_held();

namespace internal {

// What a message carries for one CUDA storage (ExportedStorage::handle), as
// bytes of this layout.
struct CudaIpcWire {
  char magic[8];
  uint32_t version;
  int32_t device;
  int32_t producer_pid;
  uint32_t slot;  // of the counter file below
  uint64_t segment_size;
  uint64_t offset;  // of the storage in its segment
  uint64_t nbytes;
  cudaIpcMemHandle_t memory;  // the segment's
  cudaIpcEventHandle_t event;
  char counters[64];  // the counter file's name, NUL-terminated
};
inline constexpr char kCudaIpcMagic[8] = {'E', 'M', 'B', 'C', 'U', 'I', 'P', 'C'};
inline constexpr uint32_t kCudaIpcVersion = 1;

// Reference counters shared between processes: one file in /dev/shm of
// kSlots 64-bit counters, created by the sender, opened by receivers by
// name. CUDA-independent, so its behaviour is tested without a GPU.
class IpcRefCounters {
 public:
  static constexpr int kSlots = 4096;

  // A new counter file named "<prefix>_<pid>_<n>", every slot free. The
  // creator unlinks it when destroyed.
  static absl::StatusOr<std::unique_ptr<IpcRefCounters>> Create(const std::string& prefix);
  // The file `name` as another process created it. NotFound names it.
  static absl::StatusOr<std::unique_ptr<IpcRefCounters>> Open(const std::string& name);
  ~IpcRefCounters();
  IpcRefCounters(const IpcRefCounters&) = delete;
  IpcRefCounters& operator=(const IpcRefCounters&) = delete;

  const std::string& name() const { return name_; }
  // A free slot with its counter set to 1; ResourceExhausted when all are
  // taken (the sender then makes another file).
  absl::StatusOr<int> Acquire();
  // Frees a slot whose counter reached zero, for Acquire to hand out again.
  void Release(int slot);
  // Atomic add; returns the new value.
  int64_t Add(int slot, int64_t delta);
  int64_t Get(int slot) const;

 private:
  IpcRefCounters(std::string name, int64_t* counters, bool owner)
      : name_(std::move(name)), counters_(counters), owner_(owner) {}

  const std::string name_;
  int64_t* const counters_;
  const bool owner_;
  std::vector<int> free_;  // owner only
  int next_ = 0;           // owner only: slots below it were handed out once
};

}  // namespace internal

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_CUDA_SHARING_H_
