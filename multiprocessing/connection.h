// Connection and Pipe: message channels between processes that carry Values,
// tensors included (multiprocessing.Pipe's Connection).
//
//   ```cpp
//   #include "multiprocessing/connection.h"
//   #include "multiprocessing/process.h"
//   #include "tensor/factories.h"
//   namespace mp = ember::multiprocessing;
//   EMBER_ASSIGN_OR_RETURN(auto pipe, mp::Pipe());  // a pair of Connections
//   ember::Tensor weights = ember::zeros({4});
//   EMBER_RETURN_IF_ERROR(pipe.first.send(mp::Value(weights)));  // moved to shared memory
//   EMBER_RETURN_IF_ERROR(mp::spawn([&](int rank) -> absl::Status {  // a forked child
//     EMBER_ASSIGN_OR_RETURN(mp::Value v, pipe.second.recv(absl::Seconds(5)));
//     EMBER_ASSIGN_OR_RETURN(ember::Tensor w, v.as<ember::Tensor>());
//     w.fill_(1);  // the parent's `weights` sees it
//     return absl::OkStatus();
//   }, /*nprocs=*/1));
//   ```
//
// A Connection is one end of a UNIX SOCK_SEQPACKET socket: each Send is one
// message, delivered whole or not at all, with the descriptors of
// file_descriptor-shared storages attached (SCM_RIGHTS). Tensors are moved to
// shared memory when sent (see message.h); the receiver gets views on the
// same bytes. Messages are at most kMaxMessageBytes: large data belongs in
// tensors, which travel by reference.
//
// A Connection is a handle: copies share the socket (Close closes it for all
// of them). Connections reach children by fork, as arguments of a spawned
// child (process.h), or inside a message on another connection or queue (the
// descriptor travels with SCM_RIGHTS); the descriptors themselves are
// close-on-exec.
//
// Thread-safety: Send and Receive may be called from several threads and
// processes at once; each message goes to exactly one receiver.
#ifndef EMBER_MULTIPROCESSING_CONNECTION_H_
#define EMBER_MULTIPROCESSING_CONNECTION_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/unique_fd.h"
#include "multiprocessing/value.h"

namespace ember::multiprocessing {

inline constexpr size_t kMaxMessageBytes = 160 << 10;
// The kernel's limit on descriptors in one message (SCM_MAX_FD).
inline constexpr size_t kMaxMessageFds = 253;

class Connection {
 public:
  Connection() = default;
  explicit Connection(base::UniqueFd fd) : fd_(std::make_shared<base::UniqueFd>(std::move(fd))) {}

  // Sends `value`, moving its tensors to shared memory. Blocks while the
  // socket is full, up to `timeout` (DeadlineExceeded). Errors: those of
  // share_memory_, InvalidArgument for a message over kMaxMessageBytes or
  // with too many file_descriptor storages, Unavailable when the peer is gone.
  // Nothing is sent when it fails.
  absl::Status send(const Value& value, absl::Duration timeout = absl::InfiniteDuration());
  // Waits up to `timeout` for a message (DeadlineExceeded); without a
  // timeout the wait is the receive call itself (no poll). Errors:
  // Unavailable when the peer closed its end, InvalidArgument for a malformed
  // message (its descriptors are closed), ResourceExhausted when descriptors
  // could not be accepted (the limit is named).
  absl::StatusOr<Value> recv(absl::Duration timeout = absl::InfiniteDuration());
  // True when a message is ready within `timeout`.
  bool poll(absl::Duration timeout = absl::ZeroDuration()) const;

  // Sends raw bytes and descriptors as one message (what Send does after
  // encoding; tests use it to inject malformed input).
  absl::Status send_bytes(std::string_view bytes, absl::Span<const int> fds,
                          absl::Duration timeout = absl::InfiniteDuration());

  bool valid() const { return fd_ != nullptr && fd_->valid(); }
  int fd() const { return fd_ != nullptr ? fd_->get() : -1; }
  // Closes the socket for every copy of this handle.
  void close() {
    if (fd_ != nullptr) fd_->reset();
  }

 private:
  std::shared_ptr<base::UniqueFd> fd_;
};

// A connected pair. Duplex: both ends send and receive; otherwise the first
// end only receives and the second only sends, as multiprocessing.Pipe.
absl::StatusOr<std::pair<Connection, Connection>> Pipe(bool duplex = true);

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_CONNECTION_H_
