// The byte form of a Value on queue and pipe sockets (internal to
// multiprocessing/).
//
// Encoding moves every tensor's storage into shared memory (in place, as
// PyTorch does when a tensor is put on a queue) and describes it through the
// storage's SharingHandler; the tensor's geometry travels inline. Decoding
// rebuilds each tensor as a view on the same shared bytes, so writes on either
// side are seen by the other.
//
//   EMBER_ASSIGN_OR_RETURN(EncodedMessage m, EncodeMessage(Value(t)));
//   ... send m.bytes with m.fds ...; on failure AbandonMessage(m);
//   EMBER_ASSIGN_OR_RETURN(Value v, DecodeMessage(bytes, std::move(fds)));
//
// Channels (Connection, SimpleQueue, Queue) and synchronization primitives
// (synchronize.h: their shared pages) travel as their descriptors, which
// follow the storages' in the message, and a few bytes of state; each kind's
// codec is registered by the file that defines it.
//
// Layout: magic "EMBQ", version, the storage table (device type, byte size,
// handle, descriptor count), then the value tree (a tag byte per node).
// Every length and index is checked on decode: a malformed message is an
// InvalidArgument error, never a crash. Thread-safe (no shared state).
#ifndef EMBER_MULTIPROCESSING_MESSAGE_H_
#define EMBER_MULTIPROCESSING_MESSAGE_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "multiprocessing/sharing.h"
#include "multiprocessing/value.h"
#include "tensor/tensor.h"

namespace ember::multiprocessing {

struct EncodedMessage {
  std::string bytes;
  std::vector<int> fds;  // borrowed from `storages` and the value's channels
  std::vector<ExportedStorage> storages;
};

// How one kind of channel (or synchronization primitive) crosses a message.
enum class ChannelKind : uint8_t {
  kConnection = 0,
  kSimpleQueue,
  kQueue,
  kLock,
  kRLock,
  kSemaphore,
  kBoundedSemaphore,
  kEvent,
  kCondition,
  kBarrier,
};
inline constexpr int kNumChannelKinds = 10;
struct ChannelCodec {
  // Appends the channel's descriptors (borrowed: valid while `value` lives)
  // and returns its state bytes; FailedPrecondition for a closed channel.
  absl::StatusOr<std::string> (*encode)(const Value& value, std::vector<int>& fds) = nullptr;
  // Rebuilds the channel from its descriptors (now this process's) and state.
  absl::StatusOr<Value> (*decode)(std::vector<base::UniqueFd> fds,
                                  std::string_view state) = nullptr;
  uint8_t fds = 0;  // descriptors per channel of this kind
};
// Called at start-up by connection.cc, queue.cc and synchronize.cc.
void RegisterChannelCodec(ChannelKind kind, ChannelCodec codec);

// Whether `t` may be sent: PyTorch refuses a non-leaf tensor that requires
// grad (its graph cannot cross processes). InvalidArgument saying to detach()
// it otherwise.
absl::Status CheckTensorSendable(const Tensor& t);

// Shares and exports every tensor of `value`. Errors: those of
// CheckTensorSendable and share_memory_.
absl::StatusOr<EncodedMessage> EncodeMessage(const Value& value);
// Drops the references an encoded message took, for one never delivered.
void AbandonMessage(EncodedMessage& message);
// Rebuilds a value; `fds` are the descriptors that arrived with `bytes`.
absl::StatusOr<Value> DecodeMessage(std::string_view bytes, std::vector<base::UniqueFd> fds);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_MESSAGE_H_
