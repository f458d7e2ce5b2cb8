#include "distributed/debug.h"

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
// collective's shape is checked across ranks before it runs. Here the check
// lives once in the layer above the backends (ProcessGroup's public
// methods): the fingerprint of collective #n is published in the group's
// store and compared with every rank's, so tcp, gloo and mpi (given a store)
// get it alike. It costs a store round trip per rank per collective, which
// is why it is DETAIL's, as in PyTorch. The checks that are on by default
// stay where they were: tcp compares op and size in its message headers,
// gloo all-gathers a call description before each collective (a mismatch
// there would abort the process inside gloo).

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

namespace {

std::string Bytes(int64_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n >= 1024 && n % 1024 == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " B");
}

std::string Fingerprint(const FlightOp& op) {
  return absl::StrCat(op.op, " ", op.dtype[0] != '\0' ? op.dtype : "-", " ", op.nbytes, " ",
                      op.peer);
}

// The FlightOp a fingerprint describes (names stay in the returned strings).
struct Parsed {
  std::string op, dtype;
  FlightOp flight;
};
bool Parse(const std::string& text, Parsed& out) {
  std::vector<std::string> f = absl::StrSplit(text, ' ');
  if (f.size() != 4) return false;
  out.op = f[0];
  out.dtype = f[1] == "-" ? "" : f[1];
  out.flight.op = out.op.c_str();
  out.flight.dtype = out.dtype.c_str();
  return absl::SimpleAtoi(f[2], &out.flight.nbytes) && absl::SimpleAtoi(f[3], &out.flight.peer);
}

}  // namespace

std::string describe_call(const FlightOp& op) {
  const std::string name = op.op;
  if (name == "barrier" || name == "monitored_barrier") return name;
  std::string text = absl::StrCat(name, " of ", Bytes(op.nbytes), " ", op.dtype);
  if (op.peer >= 0) absl::StrAppend(&text, " with root ", op.peer);
  return text;
}

absl::Status check_fingerprint(Store& store, const std::string& prefix, int rank, int size,
                               int64_t seq, const FlightOp& op, absl::Duration timeout) {
  const std::string key = absl::StrCat(prefix, "ember_fingerprint/", seq, "/");
  const std::string mine = Fingerprint(op);
  const std::string what = absl::StrCat(op.op, " (collective #", seq, ")");
  if (absl::Status s = store.set(absl::StrCat(key, rank), mine); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": TORCH_DISTRIBUTED_DEBUG=DETAIL could not "
                                               "publish this rank's call: ", s.message()));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> missing;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    absl::StatusOr<std::string> theirs =
        store.get(absl::StrCat(key, p), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!theirs.ok()) {
      missing.push_back(p);
      continue;
    }
    if (*theirs == mine) continue;
    Parsed parsed;
    const std::string their_call = Parse(*theirs, parsed) ? describe_call(parsed.flight) : *theirs;
    return absl::FailedPreconditionError(absl::StrCat(
        "mismatched collectives: ", what, ": rank ", p, " ran ", their_call, " but this rank (",
        rank, ") ran ", describe_call(op),
        "; every rank must run the same collectives in the same order with tensors of the same "
        "size and dtype (TORCH_DISTRIBUTED_DEBUG=DETAIL)"));
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": timed out: rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
        " did not reach it within ", absl::FormatDuration(timeout),
        " (TORCH_DISTRIBUTED_DEBUG=DETAIL's check before the collective)"));
  }
  return absl::OkStatus();
}

}  // namespace ember::distributed
