// Distributed checkpoints (torch.distributed.checkpoint): every rank saves its
// own shards of a state dict into one checkpoint directory, and any number of
// ranks, sharded any way, load it back, each reading only the slices it needs.
//
//   ```cpp compile-only
//   #include "distributed/checkpoint/checkpoint.h"
//   namespace dcp = ember::distributed::checkpoint;
//   // On every rank of `pg` (world size N): rank r holds rows [r*R, (r+1)*R)
//   // of an [N*R, 16] weight, and a bias that every rank holds whole.
//   dcp::StateDict sd = {
//       {"fc.weight", dcp::shard(local_rows, /*global_shape=*/{N * R, 16},
//                                /*offsets=*/{r * R, 0})},
//       {"fc.bias", dcp::replicated(bias)},
//       // FSDP's flat parameters: elements [start, start + n) of the
//       // row-major flattening of a [64, 16] tensor.
//       {"proj.weight", dcp::flat_shard(flat_piece, {64, 16}, start)},
//   };
//   EMBER_RETURN_IF_ERROR(dcp::save(sd, {.path = "/ckpt/step100", .process_group = pg}));
//
//   // Later, on M ranks (or one process with no group): describe what this
//   // rank wants with the same keys and its own placements, then load in place.
//   dcp::StateDict want = {{"fc.weight", dcp::shard(my_rows, {N * R, 16}, {my_start, 0})},
//                          {"fc.bias", dcp::replicated(bias)}};
//   EMBER_RETURN_IF_ERROR(dcp::load(want, {.path = "/ckpt/step100"}));
//   ```
//
// A StateDict maps keys (a module's fully qualified names, "layer1.0.weight")
// to Items. An Item is either a full tensor (the same on every rank:
// replicated parameters, scalars) or this rank's piece of a global tensor,
// placed as a box (sizes = the local tensor's, starting at `offsets`: the
// chunk metadata of PyTorch's ShardedTensor and DTensor) or as a flat range of
// the row-major elements of the global tensor or of one box of it (FSDP's
// flattened parameters, alone or over tensor-parallel shards). On
// disk every piece is a box; a flat range is stored as the few boxes that
// tile it (Note [Flat ranges as boxes] in checkpoint.cc). Optimizer state goes
// through the same StateDict: optimizer_state.h turns an optimizer's state
// into Items placed like their parameters.
//
// save() is collective over `process_group`: every rank must call it with the
// same keys, dtypes and global shapes (each rank its own pieces). It plans
// (pieces held by several ranks are written once), writes each rank's data file
// and one metadata file into a temporary directory beside `path`, and renames
// that directory to `path` only once every rank has finished: a save that
// fails or whose rank dies leaves the previous checkpoint at `path` whole
// (Note [Atomic commit] in checkpoint.cc). The format is described in
// distributed/checkpoint/README.md.
//
// load() is not collective: each rank reads the metadata and the byte ranges
// that overlap its pieces, verifies their checksums and copies them into the
// Items' tensors (in place, converting the dtype when it differs). Any number
// of ranks with any placements may load a checkpoint, and so may one process
// with full tensors (a plain module's state_dict()).
//
// Errors (absl::Status): InvalidArgument for a malformed StateDict (a
// placement outside its global shape, a duplicate key, ranks that disagree
// on a key's dtype or global shape, pieces that overlap or leave part of a
// global tensor unsaved), naming the key, the ranks and the values; NotFound
// for a key or checkpoint that is absent; DataLoss for a checksum mismatch or
// a truncated file, naming the file and the byte range; the process group's
// errors (kDeadlineExceeded, kUnavailable naming the rank) when a peer fails
// or dies during save; Internal / PermissionDenied for file system errors,
// naming the path.
//
// Tensors may be on any device: a device item is written from a host copy
// made on its device's current stream and loaded through one (Note [Device
// tensors in checkpoints] in checkpoint.cc), so a checkpoint saved from
// cuda:0 loads into CPU tensors or another device's and the other way round.
// The process group exchanges CPU bytes: pass one that takes CPU tensors
// (tcp, gloo, mpi, or the default group of "cpu:gloo,cuda:nccl"). Thread-safety: free functions; the StateDict's
// tensors must not be written by other threads during a call. save() on
// several threads with one process group must be serialised by the caller,
// as every collective must.
#ifndef EMBER_DISTRIBUTED_CHECKPOINT_CHECKPOINT_H_
#define EMBER_DISTRIBUTED_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace ember::distributed::checkpoint {

// Where a rank's local tensor lies inside its global tensor.
struct Placement {
  SizeVector global_shape;
  // Box form: the local tensor's sizes are the box's, starting at `offsets`
  // (one per dimension of global_shape).
  SizeVector offsets;
  // Flat form, when >= 0: the local tensor is 1-D and holds elements
  // [flat_offset, flat_offset + numel) of the row-major flattening of the
  // box at `offsets` of sizes `box_sizes` (a tensor-parallel shard that FSDP
  // flattened and sharded again: torch's 2-D DTensor of FSDP x TP), or, when
  // both are empty, of the whole global tensor.
  int64_t flat_offset = -1;
  SizeVector box_sizes;

  bool is_flat() const { return flat_offset >= 0; }
};

struct Item {
  Tensor tensor;  // the full tensor, or this rank's piece
  std::optional<Placement> placement;  // unset: `tensor` is the whole global tensor
};

// The three kinds of Item. replicated(): the whole tensor, the same on every
// rank (DTensor's Replicate; in one process, simply the tensor), written once.
Item replicated(Tensor tensor);
Item shard(Tensor local, SizeVector global_shape, SizeVector offsets);
// box_offsets / box_sizes: the box whose flattening the range indexes
// (Placement's flat form); empty: the whole global tensor.
Item flat_shard(Tensor local, SizeVector global_shape, int64_t flat_offset,
                SizeVector box_offsets = {}, SizeVector box_sizes = {});

// Keys in order; each key at most once.
using StateDict = std::vector<std::pair<std::string, Item>>;

// Note [Cached save plans]
// Planning a save exchanges every rank's layout (per key the dtype, global
// shape and boxes) and assigns each distinct piece a writer: bytes and work
// that grow with the number of keys and ranks, and are the same at every save
// of an unchanged model. A SavePlanCache given to save() keeps the last
// plan: the next save first all_gathers one digest of each rank's layout
// (and of the cache itself), and when none changed and every rank's cache
// holds the same plan, reuses it without sending a layout; otherwise it
// plans as without a cache and keeps the new plan. Every rank decides from
// the same gathered digests, so all reuse or all replan. Use one cache per
// process group and sequence of saves (AsyncCheckpointer keeps one).
class SavePlanCache;

struct CheckpointOptions {
  // The checkpoint directory (created by save, replaced whole if present).
  std::string path;
  // The ranks that save together; null: this process alone. load() does not
  // use it.
  std::shared_ptr<ProcessGroup> process_group;
  // Each collective of save(); the group's timeout when unset.
  std::optional<absl::Duration> timeout;
  // fsync data and metadata files and the parent directory before and after
  // the commit, as PyTorch's FileSystemWriter(sync_files=True) does. Off, a
  // crash of the machine (not of a process) may lose a committed checkpoint.
  bool sync_files = true;
  // Write data files around the page cache (O_DIRECT) where the file system
  // takes it, from the tensors' own memory where it is aligned (Note [Direct
  // writes] in data_file.h); the files are the same either way. Off: through
  // the page cache.
  bool direct_io = true;
  // Bytes covered by each CRC-32C of a piece's data (the smallest unit a
  // load reads and verifies).
  int64_t checksum_block_bytes = int64_t{1} << 20;
  // Note [Cached save plans]; null: every save plans afresh.
  std::shared_ptr<SavePlanCache> plan_cache;
  // Note [Collective-free saves]: no collective at all; `process_group`
  // (if given) only names this rank and the world size.
  bool collective_free = false;
};

class SavePlanCache {
 public:
  SavePlanCache();
  ~SavePlanCache();
  SavePlanCache(const SavePlanCache&) = delete;
  SavePlanCache& operator=(const SavePlanCache&) = delete;

  // Saves that reused the cached plan, and saves that planned afresh.
  int64_t hits() const;
  int64_t misses() const;

  struct State;  // checkpoint.cc's

 private:
  friend absl::Status save(const StateDict& state_dict, const CheckpointOptions& options);
  std::unique_ptr<State> state_;
};

// Note [Collective-free saves]
// For jobs where a save's collectives cost too much (many ranks) or cannot
// be afforded (a rank saving alone, e.g. on its way out): every rank writes
// every piece it holds (a replicated item on rank 0 only) into `path`, which
// must be a new directory or one holding only other ranks' parts of the same
// save, as its data file and its part of the metadata
// (metadata.rank<r>.json, renamed into place after its data is written and
// synced). No rank plans with another, so nothing checks at save time that
// the ranks agree; load() and load_full_state_dict() merge the parts,
// refuse a checkpoint until every rank's part is there (NotFound naming the
// missing ranks: a save still running, or a rank that died), refuse parts
// that disagree on a key's dtype or shape, read identical pieces of several
// ranks once, and fail (DataLoss) where the pieces leave a tensor uncovered.
// A rank's part is whole or absent, never torn; a directory that already
// holds this rank's part (or a collective checkpoint) is refused:
// collective-free saves need a directory per save ("/ckpt/step100").

// Saves `state_dict` (see above). Collective: blocks until every rank of the
// group has written its pieces and rank 0 has committed, or an error; every
// rank returns the same outcome when the group still works.
absl::Status save(const StateDict& state_dict, const CheckpointOptions& options);

// Fills every Item's tensor from the checkpoint at options.path (see above).
// Keys of the checkpoint not in `state_dict` are not read.
absl::Status load(const StateDict& state_dict, const CheckpointOptions& options);

// Every tensor of a checkpoint, whole (or only `keys` when given), in the
// checkpoint's key order: what a plain module's load_state_dict takes, and
// what format_utils.h writes as one torch.save file.
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> load_full_state_dict(
    const std::string& path, const std::vector<std::string>& keys = {});

}  // namespace ember::distributed::checkpoint

#endif  // EMBER_DISTRIBUTED_CHECKPOINT_CHECKPOINT_H_
