// The tcp backend's collective algorithms: what each rank sends, receives
// and reduces, over the Mesh of channels (mesh.h) to the other ranks. They
// see bytes, not tensors: process_group_tcp.cc stages tensors into
// contiguous buffers and runs these on its worker thread; the shared-memory
// all_reduce arena (shm_arena.h) is the one algorithm that bypasses the mesh.
//
// Note [tcp algorithms]
// Small all_reduce (under kDirectAllReduceBytes received per rank) is one
// hop: every rank sends its buffer to every other and reduces the N inputs
// in rank order. Larger all_reduce, when every rank of the group is on this
// host, runs in the shared-memory arena (Note [Shared-memory all_reduce] in
// shm_arena.h); otherwise (or with EMBER_TCP_ARENA=0, or after an arena op
// failed) it is a ring: N-1 reduce-scatter steps, then N-1 all-gather
// steps, over N segments of the buffer. Every receive of the op is posted before the
// first send, so each incoming segment streams from the channel straight
// into the destination (reduce-scatter: acc = op(acc, incoming); all-gather:
// a copy) on the reader thread while the worker thread sends the next
// segment. Each segment is reduced exactly once, on a path fixed by its
// index, and then copied to everyone: every rank ends with the same bits,
// run after run (AVG divides the finished segment before it is copied).
// reduce runs the reduce-scatter half and gathers the segments to the root.
// The other collectives move whole tensors directly between the ranks that
// need them (Exchange), with sends staggered (rank r sends to r+1 first) so
// that no rank is everyone's first target; reduce_scatter reduces what it
// received in rank order 0..N-1. Non-contiguous tensors go through
// contiguous staging copies.
//
// Thread-safety: an op's functions run on the group's worker thread; the
// mesh's reader thread runs the sinks.
#ifndef EMBER_DISTRIBUTED_TCP_ALGORITHMS_H_
#define EMBER_DISTRIBUTED_TCP_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distributed/process_group.h"
#include "distributed/tcp/mesh.h"
#include "tensor/dtype.h"

namespace ember::distributed::tcp {

// One queued op, as the algorithms see it.
struct OpContext {
  OpType op;
  int64_t seq;  // the collective's sequence number in this group
  absl::Time deadline;
  std::string what;  // "all_reduce (collective #3)"
};

// Where a received buffer goes.
struct Target {
  char* data;
  size_t nbytes;
};

// Sinks for Mesh::Post: copy what arrives to `dst`, or reduce it into `acc`.
Sink CopySink(char* dst);
Sink ReduceSink(ReduceOp op, Dtype dtype, char* acc);

// Sends `bytes` to `dst` as step `step` of the collective; a failure names
// the peer, or the failure elsewhere that made the peer hang up.
absl::Status SendTo(Mesh& mesh, const OpContext& ctx, int dst, int32_t step,
                    absl::Span<const char> bytes);

// Holds an op's posted receives; any still pending when the op returns
// (it failed part way) are cancelled, so that no late message is written
// into buffers the op is about to free.
class OpRecvs {
 public:
  explicit OpRecvs(Mesh& mesh) : mesh_(mesh) {}
  ~OpRecvs() {
    for (auto& recv : recvs_) {
      if (recv && !recv->finished()) {
        mesh_.Cancel(recv, absl::CancelledError("the collective ended before this message"));
      }
    }
  }
  std::shared_ptr<PendingRecv> Add(std::shared_ptr<PendingRecv> recv) {
    recvs_.push_back(recv);
    return recv;
  }

 private:
  Mesh& mesh_;
  std::vector<std::shared_ptr<PendingRecv>> recvs_;
};

// Moves whole buffers between ranks: sends[p] to rank p and recvs[p] from
// rank p (empty optionals skip a peer), all under one collective step.
absl::Status Exchange(Mesh& mesh, const OpContext& ctx, int32_t step,
                      const std::vector<std::optional<absl::Span<const char>>>& sends,
                      const std::vector<std::optional<Target>>& recvs);

// The reduce-scatter half of the ring: afterwards segment r+1 of `data`
// holds the full reduction on rank r.
absl::Status RingReduceScatter(Mesh& mesh, const OpContext& ctx, char* data, int64_t numel,
                               Dtype dtype, ReduceOp op);

// all_reduce of `numel` elements at `data` in place: in one hop
// (DirectAllReduce, small buffers) or around the ring (RingAllReduce).
absl::Status DirectAllReduce(Mesh& mesh, const OpContext& ctx, char* data, int64_t numel,
                             Dtype dtype, ReduceOp op);
absl::Status RingAllReduce(Mesh& mesh, const OpContext& ctx, char* data, int64_t numel, Dtype dtype,
                           ReduceOp op);

// all_gather: `input` to every rank's outputs[rank], outputs[p] from rank p.
absl::Status AllGatherInto(Mesh& mesh, const OpContext& ctx, const std::vector<Target>& outputs,
                           absl::Span<const char> input);

}  // namespace ember::distributed::tcp

#endif  // EMBER_DISTRIBUTED_TCP_ALGORITHMS_H_
