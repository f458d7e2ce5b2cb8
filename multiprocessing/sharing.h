// Sharing tensors between processes: the sharing strategies,
// share_memory_() / is_shared(), and the per-device-type hook that turns a
// shared storage into something a message can carry and back.
//
//   ```cpp
//   #include "multiprocessing/sharing.h"
//   #include "tensor/factories.h"
//   namespace mp = ember::multiprocessing;
//   EMBER_RETURN_IF_ERROR(mp::set_sharing_strategy("file_system"));
//   ember::Tensor w = ember::zeros({1024});
//   EMBER_RETURN_IF_ERROR(mp::share_memory_(w));  // moved in place; views follow
//   if (!mp::is_shared(w)) return absl::InternalError("w is not shared");
//   EMBER_RETURN_IF_ERROR(mp::set_sharing_strategy("file_descriptor"));
//   ```
//
// Strategies, as torch.multiprocessing documents them:
//   "file_descriptor" (default): each shared storage is an anonymous memfd,
//     kept open with the storage; messages pass the descriptor (SCM_RIGHTS).
//     Costs one descriptor per shared storage in every process holding it.
//   "file_system": each shared storage is a named region in /dev/shm with a
//     cross-process reference count; messages pass the name. The shm manager
//     daemon (tools/shm_manager) unlinks regions left by dead processes.
// Either way a region's pages are reserved when it is created, so a full
// /dev/shm is an error then, never a SIGBUS later.
//
// CUDA storages will share through CUDA IPC: a device type registers its own
// SharingHandler; queues and pipes only ever talk to the handler.
//
// Thread-safety: every function is thread-safe; moving a storage that another
// thread is writing is the caller's race, as in PyTorch.
#ifndef EMBER_MULTIPROCESSING_SHARING_H_
#define EMBER_MULTIPROCESSING_SHARING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "tensor/device.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"

namespace ember::multiprocessing {

// {"file_descriptor", "file_system"}.
std::vector<std::string> get_all_sharing_strategies();
// The strategy new shared storages use in this process.
std::string get_sharing_strategy();
// InvalidArgument naming `name` and the valid strategies when unknown.
// Storages already shared keep their strategy.
absl::Status set_sharing_strategy(std::string_view name);

// The prefix of file_system region names (see shared_segment.h): "/ember" or
// $EMBER_SHM_PREFIX. InvalidArgument for a prefix shm_open cannot use.
absl::Status set_shared_memory_prefix(std::string_view prefix);

// Moves the bytes of `t`'s storage into shared memory in place: every tensor
// viewing that storage sees the same values, now shared. A no-op when already
// shared. Blocks for the copy. Errors: ResourceExhausted (descriptor limit,
// /dev/shm full; the message names the limit or size and what to do),
// Unavailable (shm manager), Unimplemented for a device with no handler.
absl::Status share_memory_(const Tensor& t);
absl::Status share_memory_(const Storage& storage);
bool is_shared(const Tensor& t);
bool is_shared(const Storage& storage);

// A new contiguous CPU tensor (uninitialised) whose storage is created in
// shared memory with the current strategy, without the copy share_memory_
// makes (torch's storage._new_shared): what a DataLoader worker collates a
// batch into. Errors as share_memory_'s.
absl::StatusOr<Tensor> empty_shared(IntArrayRef sizes, Dtype dtype);

// Makes `storage` use the bytes of the shared storage `shared` in place (its
// own bytes are freed): every tensor viewing `storage` then reads and writes
// the same shared memory as `shared`, in this process and in every other
// holder. This is how a child rebuilds its own module onto the parameters a
// parent shared (module_state.h). InvalidArgument when `shared` is not in
// shared memory or the byte sizes differ; Unimplemented off the CPU.
absl::Status alias_shared_storage(const Storage& storage, const Storage& shared);

// Frees the shared regions this process keeps for reuse (Note [Segment
// reuse] in shared_segment.cc).
void empty_shared_memory_cache();

// What a message carries for one shared storage.
struct ExportedStorage {
  uint64_t nbytes = 0;
  std::string handle;    // handler-defined bytes (a region name, an IPC handle)
  std::vector<int> fds;  // descriptors to pass; valid while `source` lives
  Storage source;        // keeps the bytes alive until the message is sent
};
// The same, received: the descriptors are now this process's.
struct ReceivedStorage {
  uint64_t nbytes = 0;
  std::string handle;
  std::vector<base::UniqueFd> fds;
};

// Shares storages of one device type across processes.
class SharingHandler {
 public:
  virtual ~SharingHandler() = default;
  virtual absl::Status Share(const Storage& storage) = 0;
  virtual bool IsShared(const Storage& storage) const = 0;
  // Describes a shared storage for one message, taking a reference that the
  // receiver's Import adopts (or Abandon drops when the message is not sent).
  virtual absl::StatusOr<ExportedStorage> Export(const Storage& storage) = 0;
  virtual void Abandon(const ExportedStorage& exported) = 0;
  // Rebuilds a storage from what a message carried. Errors name what was
  // malformed or missing.
  virtual absl::StatusOr<Storage> Import(ReceivedStorage received) = 0;
};

// Makes `handler` (not owned; must outlive its use) share `type`'s storages.
// CPU's handler is built in.
void register_sharing_handler(DeviceType type, SharingHandler* handler);
// The handler for `type`, or Unimplemented naming the device type.
absl::StatusOr<SharingHandler*> get_sharing_handler(DeviceType type);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_SHARING_H_
