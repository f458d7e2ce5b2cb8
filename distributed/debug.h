// TORCH_DISTRIBUTED_DEBUG for the layer above the backends (Note [Debug
// levels]): OFF (the default), INFO, DETAIL, with PyTorch's meaning. At
// DETAIL every collective's fingerprint (op, dtype, bytes, root) is compared
// across the group's ranks through its store before the backend sees the
// call, so mismatched collectives fail at once on every backend, naming both
// sides, instead of hanging or failing inside the backend.
//
//   ```cpp
//   // TORCH_DISTRIBUTED_DEBUG=DETAIL in the environment when the group is created:
//   auto work = pg->broadcast(t, {.root = 1});  // while rank 0 passes root 0:
//   // FAILED_PRECONDITION: mismatched collectives: broadcast (collective #4): rank 0 ran
//   //   broadcast of 32 B float32 with root 0 but this rank (1) ran broadcast of 32 B
//   //   float32 with root 1; ...
//   ```
//
// Thread-safety: plain functions.
#ifndef EMBER_DISTRIBUTED_DEBUG_H_
#define EMBER_DISTRIBUTED_DEBUG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "distributed/flight_recorder.h"
#include "distributed/store.h"

namespace ember::distributed {

enum class DebugLevel { kOff, kInfo, kDetail };

// TORCH_DISTRIBUTED_DEBUG (case-insensitive); unset is OFF. An unknown value
// is reported once on stderr and read as OFF.
DebugLevel debug_level_from_env();

// "all_reduce of 32 B float32", "broadcast of 8 B int64 with root 1".
std::string describe_call(const FlightOp& op);

// Publishes this rank's fingerprint of collective `seq` under
// <prefix>ember_fingerprint/<seq>/<rank> and compares it with every other
// rank's: kFailedPrecondition naming both calls on a mismatch,
// kDeadlineExceeded naming the ranks that did not reach it within
// `timeout`. Blocks until every rank has published or the timeout passes.
absl::Status check_fingerprint(Store& store, const std::string& prefix, int rank, int size,
                               int64_t seq, const FlightOp& op, absl::Duration timeout);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_DEBUG_H_
