// ShmArena: all_reduce for a group whose ranks all run on one host, through
// one shared staging segment per rank; the tcp backend's large all_reduce
// there (Note [Shared-memory all_reduce]).
//
//   EMBER_ASSIGN_OR_RETURN(auto arena, ShmArena::Create(rank, size));
//   store->set(key(rank), arena->Locator());
//   for (int p : peers) EMBER_RETURN_IF_ERROR(arena->Attach(p, store->get(key(p))));
//   ...
//   EMBER_RETURN_IF_ERROR(arena->AllReduce(op, data, numel, kFloat32, ReduceOp::kSum));
//
// Note [Shared-memory all_reduce]
// The buffer is cut into chunks of `size` portions (each at most
// PortionBytes()); portion p of every chunk is rank p's to reduce. Per chunk:
//   1. publish: copy the portions the others reduce into my staging slot;
//   2. reduce: my portion = in_0 op in_1 op ... op in_{N-1}, in rank order,
//      reading the others' slots and my own buffer; the result goes to my
//      buffer and to my result slot;
//   3. collect: copy every other portion from its owner's result slot.
// Each rank's segment holds kDepth slots, so ranks run up to kDepth chunks
// apart, and three counters (chunks published, reduced, collected) that the
// others wait on before steps 2, 3 and slot reuse. A rank writes only its own
// segment (its counters, slots and its announcement below) and reads the
// others'; nobody reads another process's private memory.
// Why: a chunk's bytes stay in the shared cache between the steps, so each
// rank's buffer crosses the memory bus about once each way, where the ring's
// process_vm_readv path pays two kernel copies per byte (BENCHMARKS.md).
// Every portion is reduced once, by its owner, in a fixed order, and then
// copied: all ranks get the same bits, run after run.
//
// Agreement: every all_reduce of such a group announces itself in the
// announcing rank's segment (sequence number, size, dtype, op, chunk count
// so far, and whether it runs here). Before the first chunk each rank
// checks every peer's announcement, so a peer that called all_reduce with
// another size, dtype or op is an immediate error naming both calls. A rank
// whose arena op failed marks its segment broken; from then on every rank
// sees that and runs its all_reduce over the rings instead.
//
// Waiting spins, yields, then sleeps on the peer's futex word (see
// shm_segment.h); each sleep slice asks `Op::failure` (a peer lost, the op
// poisoned, the group aborted), and the op's deadline bounds every wait.
// The spin is adaptive: its budget halves after each wait that spinning did
// not end (the peer was not running: more ranks than free cores) and grows
// back after each it did, so ranks sharing a core hand over at once.
//
// Thread-safety: one op at a time (the group's worker thread); Interrupt()
// from any thread.
#ifndef EMBER_DISTRIBUTED_TCP_SHM_ARENA_H_
#define EMBER_DISTRIBUTED_TCP_SHM_ARENA_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "distributed/tcp/shm_segment.h"
#include "tensor/dtype.h"

namespace ember::distributed::tcp {

class ShmArena {
 public:
  // Chunks a rank may run ahead of the slowest peer.
  static constexpr int kDepth = 8;

  // Creates this rank's segment (`size` ranks in the group).
  static absl::StatusOr<std::unique_ptr<ShmArena>> Create(int rank, int size);
  // What peers pass to Attach: "<pid>:<fd>".
  std::string Locator() const;
  // Maps `peer`'s segment, named by its Locator().
  absl::Status Attach(int peer, const std::string& locator);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The largest portion of a chunk, in bytes.
  size_t PortionBytes() const { return portion_bytes_; }

  struct Op {
    int64_t seq = 0;   // the collective's sequence number
    std::string what;  // "all_reduce (collective #3)", for errors
    absl::Time deadline;
    // Why the collective cannot finish, when known elsewhere; OK otherwise.
    std::function<absl::Status()> failure;
    // "rank 1 (pid 4711 on this host, stopped)", for errors.
    std::function<std::string(int)> describe;
  };

  // Whether no rank has marked its arena broken.
  bool Usable() const;
  // Records that collective `seq` is an all_reduce of `nbytes` of `dtype`
  // under `op` that runs elsewhere (over the rings); AllReduce announces
  // itself.
  void AnnounceElsewhere(int64_t seq, size_t nbytes, Dtype dtype, ReduceOp op);
  // all_reduce of the contiguous buffer `data` (numel > 0) in place.
  absl::Status AllReduce(const Op& op, char* data, int64_t numel, Dtype dtype, ReduceOp redop);
  // Makes waiting and future ops fail with kAborted.
  void Interrupt();

  struct Control;  // one rank's counters and announcement, in its segment

 private:
  ShmArena(int rank, int size, size_t portion_bytes, SharedMapping segment);
  void Announce(int64_t seq, size_t nbytes, Dtype dtype, ReduceOp op, bool here);
  absl::Status CheckAnnouncements(const Op& op, size_t nbytes, Dtype dtype, ReduceOp redop);
  // Waits until `counter(peer)` reaches `target` for every peer.
  absl::Status WaitForPeers(const Op& op, std::atomic<uint64_t> Control::*counter, uint64_t target,
                            const char* step);
  void Advance(std::atomic<uint64_t> Control::*counter, uint64_t value);
  absl::Status Fail(absl::Status status);

  Control& control(int r) const;
  char* slot(int r, uint64_t chunk) const;         // rank r's published portions
  char* result_slot(int r, uint64_t chunk) const;  // rank r's reduced portion

  const int rank_;
  const int size_;
  const size_t portion_bytes_;
  std::vector<SharedMapping> segments_;  // [rank_] is ours
  std::atomic<bool> interrupted_{false};
  // CpuRelax() rounds a wait spins before yielding (worker thread only).
  static constexpr int kMinSpins = 8;
  static constexpr int kMaxSpins = 400;
  int spin_budget_ = kMaxSpins;
};

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_SHM_ARENA_H_
