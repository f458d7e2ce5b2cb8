// TORCH_DISTRIBUTED_DEBUG and the call check's levels for the layer above
// the backends (Note [Debug levels]; the check itself is Note [Call checks]
// in process_group.cc). By default every collective's call (op, dtype,
// bytes, root, reduce op) is compared across the group's ranks by the
// backend's own messages before it can do harm; TORCH_DISTRIBUTED_DEBUG=
// DETAIL adds the tensors' shapes and compares before the backend sees the
// call, through the group's store; EMBER_CHECK_COLLECTIVES=0 turns the check
// off.
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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/store.h"

namespace ember::distributed {

enum class DebugLevel { kOff, kInfo, kDetail };

// TORCH_DISTRIBUTED_DEBUG (case-insensitive); unset is OFF. An unknown value
// is reported once on stderr and read as OFF.
DebugLevel debug_level_from_env();

// How much of each collective's call the ranks compare (Note [Call checks]).
enum class CallCheckLevel {
  kOff,      // EMBER_CHECK_COLLECTIVES=0 (or the older EMBER_GLOO_CHECK_COLLECTIVES=0)
  kDefault,  // op, dtype, bytes, root, reduce op, all_to_all counts
  kDetail,   // TORCH_DISTRIBUTED_DEBUG=DETAIL: also the shapes, checked before the call
};
// DETAIL when TORCH_DISTRIBUTED_DEBUG=DETAIL (it wins), else kOff when
// EMBER_CHECK_COLLECTIVES or EMBER_GLOO_CHECK_COLLECTIVES is "0", else
// kDefault.
CallCheckLevel call_check_level_from_env();

// "32 B", "4 KiB", "4 MiB" (exact multiples only).
std::string bytes_text(int64_t n);

// DETAIL's exchange: publishes this rank's `words` for collective `seq` under
// <prefix>ember_fingerprint/<seq>/<rank> and reads every other rank's.
// Returns size() rows (this rank's row is `words`); kDeadlineExceeded naming
// the ranks that did not publish within `timeout` ("<what>: timed out: rank
// 1 did not reach it within 5s ..."). Blocks until every rank has published
// or the timeout passes.
absl::StatusOr<std::vector<std::vector<int64_t>>> exchange_call_words(
    Store& store, const std::string& prefix, int rank, int size, int64_t seq,
    const std::vector<int64_t>& words, const std::string& what, absl::Duration timeout);

}  // namespace ember::distributed

#endif  // EMBER_DISTRIBUTED_DEBUG_H_
