// Channel: a reliable, ordered byte stream to one peer rank, in both
// directions; the one seam between the tcp backend's algorithms and how bytes
// move (Note [Same-host shared memory] in shm_channel.h). Two implementations:
// ShmChannel (two rings in a shared memfd, for ranks on one host) and
// SocketChannel (a TCP connection, between hosts).
//
//   channel->Write(header, 32, deadline);        // any thread, one at a time
//   auto bytes = channel->Peek(8, absl::Milliseconds(100));  // the reader thread
//   ... use *bytes ...; channel->Consume(bytes->size());
//
// Thread-safety: one writer thread at a time (callers serialise writes) and
// one reader thread (Peek/Consume) may run concurrently; Interrupt may be
// called from any thread.
#ifndef EMBER_DISTRIBUTED_TCP_CHANNEL_H_
#define EMBER_DISTRIBUTED_TCP_CHANNEL_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ember::distributed::tcp {

class Channel {
 public:
  virtual ~Channel() = default;

  // Writes all `n` bytes, blocking while the peer has not made room, until
  // `deadline`. kDeadlineExceeded at the deadline, kUnavailable when the peer
  // is gone, kAborted after Interrupt().
  virtual absl::Status Write(const void* data, size_t n, absl::Time deadline) = 0;

  // Waits up to `wait` for at least `min_bytes` (at most 32) readable bytes
  // and returns every byte readable in one contiguous piece (at least
  // `min_bytes` of them), or an empty span when the wait passed first.
  // kUnavailable when the peer is gone, kAborted after Interrupt().
  virtual absl::StatusOr<absl::Span<const char>> Peek(size_t min_bytes, absl::Duration wait) = 0;
  // Releases the first `n` bytes of the last Peek.
  virtual void Consume(size_t n) = 0;

  // Makes blocked and future Write/Peek calls return kAborted.
  virtual void Interrupt() = 0;

  // Makes a Peek that is waiting return early (with what it has), so that
  // the reader thread can look at other work. Optional.
  virtual void Wake() {}

  // "shared memory" or "tcp 10.0.0.2:41234", for messages.
  virtual std::string Describe() const = 0;
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_CHANNEL_H_
