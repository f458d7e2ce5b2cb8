// ShmChannel: a Channel between two ranks on one host, through two
// single-producer/single-consumer byte rings in a shared memfd segment.
//
//   // rank a (creates):                    // rank b (opens, after a publishes):
//   auto a = ShmChannel::Create(opts);        auto b = ShmChannel::Open(locator, opts);
//   store->set(key, a->Locator());            // Locator() = "<pid>:<fd>"
//
// Note [Same-host shared memory]
// Between ranks on one host the bytes never touch the kernel's loopback: each
// direction is a ring in a memfd that both processes map. The writer copies
// into the ring and publishes its head; the reader streams straight out of
// the ring into the destination (or reduces into it), so a message costs two
// copies and no system call while both sides are busy. Waiting spins briefly,
// then sleeps on a futex in the segment (FUTEX_WAKE only when the other side
// said it sleeps; see shm_segment.h).
// A dead peer is noticed while waiting: each idle slice (50 ms) reads
// /proc/<pid>/stat, so survivors fail within that slice instead of the op's
// timeout. A stopped (SIGSTOP) peer is alive; its ops fail at the timeout and
// the message says the process is stopped.
//
// Thread-safety: see Channel.
#ifndef EMBER_DISTRIBUTED_TCP_SHM_CHANNEL_H_
#define EMBER_DISTRIBUTED_TCP_SHM_CHANNEL_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "distributed/tcp/channel.h"
#include "distributed/tcp/shm_segment.h"

namespace ember::distributed::tcp {

struct ShmChannelOptions {
  // Bytes per direction; a multiple of 4096.
  size_t ring_bytes = size_t{2} << 20;
  // The peer's rank and pid, for messages and the liveness check.
  int peer_rank = -1;
  pid_t peer_pid = 0;
};

class ShmChannel : public Channel {
 public:
  // Creates the segment (this side writes ring 0 and reads ring 1).
  static absl::StatusOr<std::unique_ptr<ShmChannel>> Create(const ShmChannelOptions& options);
  // Maps the segment that `locator` ("<pid>:<fd>", from Locator()) names.
  static absl::StatusOr<std::unique_ptr<ShmChannel>> Open(const std::string& locator,
                                                          const ShmChannelOptions& options);
  ~ShmChannel() override;

  std::string Locator() const;

  absl::Status Write(const void* data, size_t n, absl::Time deadline) override;
  absl::StatusOr<absl::Span<const char>> Peek(size_t min_bytes, absl::Duration wait) override;
  void Consume(size_t n) override;
  void Interrupt() override;
  void Wake() override;
  std::string Describe() const override { return "shared memory"; }

  struct Ring;  // the control block of one direction, in the segment

 private:
  ShmChannel(SharedMapping segment, bool creator, const ShmChannelOptions& options);
  // kUnavailable when the peer process has exited.
  absl::Status CheckPeerAlive() const;

  SharedMapping segment_;
  size_t capacity_;
  Ring* out_;
  Ring* in_;
  char* out_data_;
  char* in_data_;
  ShmChannelOptions options_;
  std::atomic<bool> interrupted_{false};
  std::atomic<bool> woken_{false};
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_SHM_CHANNEL_H_
