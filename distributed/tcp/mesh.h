// Mesh: one rank's Channels to every peer of a group, a reader thread per
// peer, and MPI-style message matching. The tcp backend's algorithms are
// written only against Send / Post / Wait.
//
//   auto recv = mesh.Post(/*src=*/1, {MessageKind::kCollective, seq, /*step=*/0},
//                         /*op=*/op_code, bytes, CopyInto(dst));
//   EMBER_RETURN_IF_ERROR(mesh.Send(1, key, op_code, payload, deadline));
//   EMBER_RETURN_IF_ERROR(mesh.Wait(recv, deadline, "all_reduce (collective #3)"));
//
// Note [Message matching]
// Every message carries a 32-byte header: kind (point-to-point, collective,
// poison), an op code, a tag (the user's tag, or the collective's sequence
// number), a step within the op and the payload size. A message from rank s
// matches the oldest posted receive for (s or any source, kind, tag, step).
// The reader thread streams a matched payload straight from the channel into
// the receive's Sink (a copy, or a reduction into the destination), so a
// posted receive costs no extra copy. A message that arrives before its
// receive is posted is kept whole in memory ("unexpected") and delivered when
// the receive is posted; readers therefore never stop draining, which is why
// sends can never deadlock against each other. A receive whose expected size
// or op code differs from the message's fails with kFailedPrecondition (a
// mismatched collective), and the payload is discarded.
//
// Failures: a peer that says goodbye (destroyed its group) fails only the
// receives posted from it. A peer whose channel breaks without goodbye
// (killed, connection reset) fails
// every receive posted from it, every collective receive (a group with a
// dead member cannot finish a collective) and every later such Post. Poison
// (sent by a rank whose collective failed) fails that collective's receives
// on the peers at once instead of at their timeouts. Abort fails everything.
//
// Thread-safety: all methods are thread-safe. Sinks and done-callbacks run on
// a reader thread or the posting thread, never concurrently for one receive.
#ifndef EMBER_DISTRIBUTED_TCP_MESH_H_
#define EMBER_DISTRIBUTED_TCP_MESH_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distributed/tcp/channel.h"

namespace ember::distributed::tcp {

// kGoodbye: the peer destroyed its group in an orderly way; its channel
// closing afterwards is not a failure.
// kAck: the receiver has read a direct message (Note [Direct reads]).
enum class MessageKind : uint8_t {
  kP2P = 1,
  kCollective = 2,
  kPoison = 3,
  kGoodbye = 4,
  kAck = 5,
};

struct MessageKey {
  MessageKind kind = MessageKind::kP2P;
  int64_t tag = 0;
  int32_t step = 0;
  friend bool operator==(const MessageKey&, const MessageKey&) = default;
};

// The step of a collective's call-check words (Note [Call checks] in
// process_group.cc), which every rank sends before any of the collective's
// data. A poisoned collective (Mesh::Poison) fails and drops its data
// messages, not these: they are on their way whatever failed later, and
// each rank's check needs every peer's words to name the same culprit.
inline constexpr int32_t kCallCheckStep = -1;

// Whether a poison of collective `key.tag` fails and drops `key`'s message.
inline bool Poisonable(const MessageKey& key) {
  return key.kind == MessageKind::kCollective && key.step != kCallCheckStep;
}

// Receives `n` bytes at `offset` of the payload. Offsets of all but the last
// piece are multiples of 8, so pieces never split an element.
using Sink = std::function<void(size_t offset, const char* data, size_t n)>;
// Runs once when a receive finishes (before waiters wake), with its status
// and the sending rank.
using RecvDone = std::function<void(const absl::Status& status, int src)>;

// Any op code matches; for point-to-point receives.
inline constexpr uint8_t kAnyOp = 0xff;
inline constexpr int kFromAnyRank = -1;

class PendingRecv {
 public:
  PendingRecv(int src, MessageKey key, uint8_t op, size_t nbytes, Sink sink, RecvDone done,
              char* copy_to)
      : src_(src),
        key_(key),
        op_(op),
        nbytes_(nbytes),
        sink_(std::move(sink)),
        done_(std::move(done)),
        copy_to_(copy_to) {}
  bool finished() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status status() ABSL_LOCKS_EXCLUDED(mu_);
  // The sender, once finished; for kFromAnyRank receives.
  int source() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Mesh;
  const int src_;
  const MessageKey key_;
  const uint8_t op_;
  const size_t nbytes_;
  Sink sink_;
  RecvDone done_;
  char* const copy_to_;
  absl::Mutex mu_;
  bool claimed_ ABSL_GUARDED_BY(mu_) = false;    // finishing has begun
  bool signalled_ ABSL_GUARDED_BY(mu_) = false;  // finished; waiters may go
  std::atomic<bool> signalled_flag_{false};      // the same, for spinning waiters
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int source_ ABSL_GUARDED_BY(mu_) = -1;
};

// What the mesh knows about a peer, for messages.
struct PeerInfo {
  std::string address;  // "10.0.0.2:41234"
  pid_t pid = 0;
  bool same_host = false;
  // Note [Direct reads]: whether this rank can read the peer's memory, and
  // whether the peer can read this rank's.
  bool we_read_peer = false;
  bool peer_reads_us = false;
};

// Note [Direct reads]
// Between processes on one host a large message (kDirectBytes and up) does
// not go through the ring at all: the sender writes a 16-byte descriptor
// (the payload's address) and blocks; the receiver's reader thread copies
// the payload straight out of the sender's memory with process_vm_readv
// (Cross Memory Attach: one copy instead of two) into the destination, or
// in 256 KiB pieces through a cache-sized bounce buffer into a reducing
// sink, then answers with an ack that releases the sender. A collective's
// direct message that arrives before its receive is posted is not copied
// aside: its descriptor waits, and once the receive is posted the reader
// thread is woken to read it (safe because every collective posts all its
// receives before its first send). Point-to-point messages are read into
// memory at once instead, so that unsafe send/send patterns cannot deadlock.
// Ranks that are threads of one process use the rings: a sender that gives
// up at its deadline frees its buffer, which a late reader in the same
// address space must never touch. (Between processes such a late read
// gets whatever the sender's memory then holds; the sender's failure
// poisons the collective, so the receiver's op fails too, unless it had
// already finished.) Whether a peer may be read is probed once at setup (a known word at a
// published address); when the kernel refuses (ptrace restrictions, containers), messages use the
// ring.
inline constexpr size_t kDirectBytes = 256 << 10;

class Mesh {
 public:
  // `channels[rank()]` is null; `op_names` maps op codes to names for
  // messages. Starts one reader thread per peer. Receive callbacks run on
  // those threads, so nothing a callback releases may own the Mesh: the
  // destructor joins the readers, and a reader cannot join itself.
  Mesh(int rank, std::vector<std::unique_ptr<Channel>> channels, std::vector<PeerInfo> peers,
       std::function<std::string(uint8_t)> op_names);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(channels_.size()); }

  // Sends one message to `dst`; returns once it is in the channel. Blocks
  // while the peer's buffer is full, until `deadline`.
  absl::Status Send(int dst, MessageKey key, uint8_t op, absl::Span<const char> payload,
                    absl::Time deadline);
  // Posts a receive of exactly `nbytes` from `src` (or kFromAnyRank).
  // `copy_to`: when the sink only copies into one buffer, that buffer;
  // large same-host messages are then read straight into it.
  std::shared_ptr<PendingRecv> Post(int src, MessageKey key, uint8_t op, size_t nbytes, Sink sink,
                                    RecvDone done = nullptr, char* copy_to = nullptr);
  // Waits for `recv` until `deadline`; then cancels it with kDeadlineExceeded
  // naming `what` and the peer. Returns the receive's status.
  // Collective receives first give a failure elsewhere a moment to explain
  // the stall (Note [Which rank reports a stall]) unless `settle` is off.
  absl::Status Wait(const std::shared_ptr<PendingRecv>& recv, absl::Time deadline,
                    const std::string& what, bool settle = true);
  // Fails `recv` with `status` unless it already finished.
  void Cancel(const std::shared_ptr<PendingRecv>& recv, const absl::Status& status);

  // Tells every peer that collective `seq` failed here (best effort, short
  // deadline), so that their receives for it fail at once.
  void Poison(int64_t seq, const absl::Status& reason);
  // Fails every pending and future operation with `status`; wakes waiters.
  void Abort(const absl::Status& status);
  // Before Abort when the group is destroyed: tells every peer this rank is
  // leaving (their receives from it fail, no others), as the destructor
  // does. Skips a peer whose channel is busy with another message or does
  // not take the goodbye by `deadline`, so a stopped peer cannot hold it.
  void SayGoodbye(absl::Time deadline);

  // Why collective `seq` cannot finish, when known: a mismatch seen here,
  // the poison a peer sent for it, else the first peer lost. Waits up to `settle` for a cause to
  // arrive (a send that failed is often the echo of a failure elsewhere).
  // OK when nothing is known.
  absl::Status CollectiveFailure(int64_t seq, absl::Duration settle = absl::ZeroDuration());

  // "rank 2 (pid 4711 on this host, stopped)" / "rank 2 (10.0.0.2:41234)".
  std::string DescribePeer(int rank) const;
  // Whether `rank` runs on this host and is stopped or has exited.
  bool PeerKnownDown(int rank) const;

 private:
  struct Unexpected;
  // `status` with "what: " in front, unless it already starts so.
  static absl::Status WithContext(const absl::Status& status, const std::string& what);
  void ReadLoop(int peer);
  // Reads the deferred direct messages of `peer` (on its reader thread).
  absl::Status ReadDeferred(int peer);
  absl::Status ReadMessage(int peer, Channel& channel);
  absl::Status StreamPayload(Channel& channel, size_t nbytes, const Sink& sink);
  // Copies a direct message's payload from `peer`'s memory into `sink`.
  absl::Status ReadDirect(int peer, uint64_t address, size_t nbytes, const Sink& sink);
  // Copies [offset, offset + n) of a direct message straight into `dst`.
  absl::Status ReadDirectInto(int peer, uint64_t address, size_t offset, size_t n, char* dst);
  absl::Status SendDirect(int dst, MessageKey key, uint8_t op, absl::Span<const char> payload,
                          absl::Time deadline);
  absl::Status CheckMatch(const PendingRecv& recv, int peer, uint8_t op, size_t nbytes) const;
  void Finish(const std::shared_ptr<PendingRecv>& recv, const absl::Status& status, int src);
  // Remembers a failed CheckMatch of a collective (CollectiveFailure).
  void RecordMismatch(const MessageKey& key, const absl::Status& match);
  void FailPeer(int peer, const absl::Status& status);
  absl::Status PostError(int src, const MessageKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  std::vector<std::unique_ptr<Channel>> channels_;
  const std::vector<PeerInfo> peers_;
  const std::function<std::string(uint8_t)> op_names_;
  std::vector<std::unique_ptr<absl::Mutex>> send_mu_;  // one writer per channel
  std::vector<std::atomic<int64_t>> next_direct_id_;   // per destination
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  std::list<std::shared_ptr<PendingRecv>> posted_ ABSL_GUARDED_BY(mu_);
  std::list<std::shared_ptr<Unexpected>> unexpected_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> failed_peers_ ABSL_GUARDED_BY(mu_);
  absl::Status first_failure_ ABSL_GUARDED_BY(mu_);  // of failed_peers_
  // Collectives that a mismatch detected here has doomed.
  std::map<int64_t, absl::Status> mismatched_ ABSL_GUARDED_BY(mu_);
  // Direct collective messages whose receive was posted after they
  // arrived: the peer's reader thread reads them (Note [Direct reads]).
  struct Deferred {
    std::shared_ptr<PendingRecv> target;
    std::shared_ptr<Unexpected> message;
  };
  std::vector<std::deque<Deferred>> deferred_ ABSL_GUARDED_BY(mu_);
  // Acks of direct messages: (peer, id).
  std::set<std::pair<int, int64_t>> acks_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::Status> poisoned_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);

  std::vector<std::thread> readers_;
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_MESH_H_
