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
#include "multiprocessing/sharing.h"
#include "multiprocessing/unique_fd.h"
#include "multiprocessing/value.h"
#include "tensor/tensor.h"

namespace ember::multiprocessing {

struct EncodedMessage {
  std::string bytes;
  std::vector<int> fds;  // borrowed from `storages`
  std::vector<ExportedStorage> storages;
};

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
absl::StatusOr<Value> DecodeMessage(std::string_view bytes,
                                    std::vector<UniqueFd> fds);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_MESSAGE_H_
