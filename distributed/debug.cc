#include "distributed/debug.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace ember::distributed {

// Note [Debug levels]
// PyTorch's TORCH_DISTRIBUTED_DEBUG: OFF; INFO adds logging (DDP's bucket
// and timing statistics); DETAIL also wraps every process group so that each
// collective's shape is checked across ranks before it runs. Here that check
// is the top level of the one call check every group runs (Note [Call
// checks] in process_group.cc): by default the ranks compare each
// collective's op, dtype, bytes, root and reduce op through the backend's own
// messages, just before the data moves, which costs a few small messages;
// DETAIL adds the tensors' shapes and compares through the group's store
// before the backend sees the call, which costs a store round trip per rank
// per collective (as PyTorch's wrapper costs a gloo all_gather), which is
// why it is DETAIL's.

DebugLevel debug_level_from_env() {
  const char* v = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  if (v == nullptr || *v == '\0') return DebugLevel::kOff;
  const std::string level = absl::AsciiStrToUpper(v);
  if (level == "OFF") return DebugLevel::kOff;
  if (level == "INFO") return DebugLevel::kInfo;
  if (level == "DETAIL") return DebugLevel::kDetail;
  static bool warned = [&] {
    std::fprintf(stderr,
                 "ember: TORCH_DISTRIBUTED_DEBUG=%s is not OFF, INFO or DETAIL; using OFF\n", v);
    return true;
  }();
  (void)warned;
  return DebugLevel::kOff;
}

CallCheckLevel call_check_level_from_env() {
  if (debug_level_from_env() == DebugLevel::kDetail) return CallCheckLevel::kDetail;
  for (const char* name : {"EMBER_CHECK_COLLECTIVES", "EMBER_GLOO_CHECK_COLLECTIVES"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && std::string(v) == "0") return CallCheckLevel::kOff;
  }
  return CallCheckLevel::kDefault;
}

std::string bytes_text(int64_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n >= 1024 && n % 1024 == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " B");
}

absl::StatusOr<std::vector<std::vector<int64_t>>> exchange_call_words(
    Store& store, const std::string& prefix, int rank, int size, int64_t seq,
    const std::vector<int64_t>& words, const std::string& what, absl::Duration timeout) {
  const std::string key = absl::StrCat(prefix, "ember_fingerprint/", seq, "/");
  if (absl::Status s = store.set(absl::StrCat(key, rank), absl::StrJoin(words, " ")); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what,
                                               ": TORCH_DISTRIBUTED_DEBUG=DETAIL could not "
                                               "publish this rank's call: ",
                                               s.message()));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::vector<int64_t>> rows(size);
  std::vector<int> missing;
  for (int p = 0; p < size; ++p) {
    if (p == rank) {
      rows[p] = words;
      continue;
    }
    absl::StatusOr<std::string> theirs =
        store.get(absl::StrCat(key, p), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!theirs.ok()) {
      missing.push_back(p);
      continue;
    }
    for (absl::string_view field : absl::StrSplit(*theirs, ' ', absl::SkipEmpty())) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(field, &v)) {
        return absl::DataLossError(
            absl::StrCat(what, ": rank ", p, "'s call '", *theirs, "' in the store is malformed"));
      }
      rows[p].push_back(v);
    }
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": timed out: rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
        " did not reach it within ", absl::FormatDuration(timeout),
        " (TORCH_DISTRIBUTED_DEBUG=DETAIL's check before the collective)"));
  }
  return rows;
}

}  // namespace ember::distributed
