// FlightRecorder: the history of a process group's ops for post-mortems
// (PyTorch's c10d flight recorder): a ring buffer of the last N collectives
// and point-to-point ops of one group, each with its sequence number, op,
// dtype and sizes, peer, state (scheduled, started, completed, failed),
// timestamps and error. Every ProcessGroup owns one (Note [Flight
// recorder]); the layer above the backends fills it, so every backend gets
// it.
//
//   ```cpp
//   #include "distributed/flight_recorder.h"
//   namespace dist = ember::distributed;
//   // pg: a ProcessGroup. Its history so far, oldest first:
//   for (const dist::FlightEntry& e : pg->flight_recorder().entries()) {
//     // e.op == "all_reduce", e.seq == 57, e.state == dist::FlightState::kCompleted, ...
//   }
//   // Every group's history of this process, written to this rank's file:
//   EMBER_ASSIGN_OR_RETURN(std::string path, dist::dump_flight_recorders("checkpoint"));
//   ```
//
// Environment (read when a group is created / when a dump is written):
// - TORCH_FR_BUFFER_SIZE: entries per group (default 2000; 0 turns the
//   recorder off). PyTorch's name for the same setting (its older,
//   nccl-only name was TORCH_NCCL_TRACE_BUFFER_SIZE).
// - TORCH_FR_DUMP_TEMP_FILE: where dumps go, a path pattern in which %r is
//   the process's rank, %h its host name and %p its pid; without %r the
//   value is a prefix (as in PyTorch) and "%r.%h" is appended. Default
//   /tmp/ember_fr_trace_%r.%h.
// - EMBER_FR_SIGNALS=0: install no signal handlers (Note [Flight recorder
//   dumps]).
//
// Dumps (Note [Flight recorder dumps]) hold every group of the process, in
// the text format that distributed/README.md ("Flight recorder") describes;
// they are written when an op fails or times out (once per group, for its
// first failure), when a group is aborted, on a fatal signal, on SIGUSR1, on
// SIGTERM (then the process ends by it as before), and by
// dump_flight_recorders().
//
// Thread-safety: every method is thread-safe. The fatal-signal and SIGUSR1
// dumps read the ring without its lock; an entry being written at that very
// moment may appear half updated.
#ifndef EMBER_DISTRIBUTED_FLIGHT_RECORDER_H_
#define EMBER_DISTRIBUTED_FLIGHT_RECORDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ember::distributed {

enum class FlightState : int8_t { kScheduled, kStarted, kCompleted, kFailed };
// "scheduled", "started", "completed", "failed".
const char* flight_state_name(FlightState state);

// What the caller tells the recorder about one op. The strings must be
// static (op_type_name, dtype_name).
struct FlightOp {
  const char* op = "";     // "all_reduce", "send", ...
  bool collective = true;  // false for send and recv
  const char* dtype = "";  // "float32"; "" for ops without tensors
  int64_t in_numel = 0;    // elements this rank passes in (all inputs)
  int64_t out_numel = 0;   // elements this rank receives (all outputs)
  int64_t nbytes = 0;      // bytes of one rank's input (the call's "size")
  int32_t peer = -1;       // root of rooted collectives, dst/src of p2p; -1 none
  int32_t tag = 0;         // p2p tag
  int64_t timeout_ms = 0;
};

// One recorded op. Plain data, so that a signal handler can read it.
struct FlightEntry {
  int64_t id = -1;    // record id: every op of this group, in call order
  int64_t seq = -1;   // collective (or p2p) sequence number, from 0
  bool collective = true;
  const char* op = "";
  const char* dtype = "";
  int64_t in_numel = 0;
  int64_t out_numel = 0;
  int64_t nbytes = 0;
  int32_t peer = -1;
  int32_t tag = 0;
  int64_t timeout_ms = 0;
  FlightState state = FlightState::kScheduled;
  // Wall clock, nanoseconds since the Unix epoch; 0 = not yet.
  int64_t created_ns = 0;
  int64_t started_ns = 0;
  int64_t finished_ns = 0;
  char error[240] = {};  // the failure's message, truncated; "" when none
};

class FlightRecorder {
 public:
  // TORCH_FR_BUFFER_SIZE, or 2000; 0 turns recording off.
  static int CapacityFromEnv();
  static constexpr int kDefaultCapacity = 2000;

  FlightRecorder(std::string group, std::string backend, int rank, int size, int capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  bool enabled() const { return capacity_ > 0; }
  int capacity() const { return capacity_; }
  // The group's name in dumps ("0" for the first group a process creates,
  // then "1", ...; distributed.cc names groups as PyTorch does).
  std::string group_name() const ABSL_LOCKS_EXCLUDED(mu_);
  void set_group_name(std::string_view name) ABSL_LOCKS_EXCLUDED(mu_);
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Records a new op, scheduled at `created_ns`; returns its id (-1 when
  // off). Collectives and p2p ops take the next number of their own
  // sequence.
  int64_t Record(const FlightOp& op, int64_t created_ns) ABSL_LOCKS_EXCLUDED(mu_);
  // The op `id` started / finished. Ids already overwritten are ignored.
  void Started(int64_t id, int64_t ns) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns true the first time an op of this group fails (the caller then
  // dumps, outside any lock of its own).
  bool Finished(int64_t id, const absl::Status& status, int64_t ns) ABSL_LOCKS_EXCLUDED(mu_);

  // The entries still in the ring, oldest first.
  std::vector<FlightEntry> entries() const ABSL_LOCKS_EXCLUDED(mu_);
  // Collective progress: the highest sequence number scheduled, started
  // and completed (-1: none yet). Lock-free reads.
  int64_t last_enqueued() const { return last_enqueued_.load(std::memory_order_relaxed); }
  int64_t last_started() const { return last_started_.load(std::memory_order_relaxed); }
  int64_t last_completed() const { return last_completed_.load(std::memory_order_relaxed); }
  // The op of the last collective scheduled ("all_reduce"; "-" before any).
  const char* last_enqueued_op() const { return last_op_.load(std::memory_order_relaxed); }
  // The collective sequence number of entry `id`; -1 for p2p ops and
  // entries no longer in the ring.
  int64_t CollectiveSeq(int64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Writes this recorder's section of a dump to `fd` (async-signal-safe;
  // Note [Flight recorder dumps]). `locked`: take the lock (not from a
  // signal handler).
  void WriteSection(int fd, bool locked) const;

 private:
  FlightEntry* Find(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string backend_;
  const int rank_;
  const int size_;
  const int capacity_;
  mutable absl::Mutex mu_;
  char group_[64] = {};  // a char array: read by the signal-time dump
  std::unique_ptr<FlightEntry[]> ring_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_collective_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_p2p_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> recorded_{0};
  std::atomic<int64_t> last_enqueued_{-1};
  std::atomic<int64_t> last_started_{-1};
  std::atomic<int64_t> last_completed_{-1};
  std::atomic<const char*> last_op_{"-"};
  int slot_ = -1;  // in the process-wide registry
};

// The name for a new group's recorder: "0", "1", ... in creation order.
std::string next_flight_group_name();

// The process's rank in dumps: set by init_process_group (the global rank);
// before that RANK from the environment, else the first group's rank.
void set_flight_recorder_rank(int rank);

// The file this process's dump goes to (TORCH_FR_DUMP_TEMP_FILE expanded).
std::string flight_recorder_dump_path();

// Writes every live recorder of this process to flight_recorder_dump_path()
// (a temporary file renamed into place, so a reader never sees half a
// dump); returns the path. `reason` is recorded in the file.
absl::StatusOr<std::string> dump_flight_recorders(std::string_view reason);

// Installs the SIGUSR1, SIGTERM and fatal-signal dumps (called whenever a
// recorder is created, unless EMBER_FR_SIGNALS=0). A handler found in place
// (installed before, or since the last call) is chained: SIGUSR1's and
// SIGTERM's are called after the dump; for a fatal signal, and for SIGTERM's
// default action, the earlier action is restored and the signal raised
// again. An ignored SIGTERM is left ignored, without a dump.
void install_flight_recorder_signal_handlers();

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_FLIGHT_RECORDER_H_
