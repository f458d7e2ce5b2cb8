// Reading flight recorder dumps (distributed/flight_recorder.h; the format
// is in distributed/README.md, "Flight recorder") and finding the first
// point where a job's ranks diverged: the analyser behind `fr_trace` and
// launch's failure summary.
//
//   ```cpp
//   #include "tools/launch/flight_analysis.h"
//   namespace fa = ember::launch::flight;
//   EMBER_ASSIGN_OR_RETURN(std::vector<fa::RankDump> dumps, fa::ReadDumps({"/tmp/job7"}));
//   fa::Verdict v = fa::Analyse(dumps, /*world_size=*/4);
//   // v.text: "all_reduce #57 (group 0, 4 MiB float32): ranks 0, 2, 3 entered it;
//   //          rank 1 never did, its last completed op is #56 broadcast"
//   ```
//
// Thread-safety: plain functions over values.
#ifndef EMBER_TOOLS_LAUNCH_FLIGHT_ANALYSIS_H_
#define EMBER_TOOLS_LAUNCH_FLIGHT_ANALYSIS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::launch::flight {

struct DumpOp {
  std::string group;
  int64_t id = -1;
  int64_t seq = -1;
  bool collective = true;
  std::string op;
  std::string dtype;
  int64_t in_numel = 0;
  int64_t out_numel = 0;
  int64_t bytes = 0;
  int peer = -1;
  int tag = 0;
  int64_t timeout_ms = 0;
  std::string state;  // scheduled, started, completed, failed
  int64_t created_us = 0;
  int64_t started_us = 0;
  int64_t finished_us = 0;
  std::string error;
};

struct DumpGroup {
  std::string name;
  std::string backend;
  int rank = 0;  // this process's rank in the group
  int size = 0;
  int64_t recorded = 0;
  int64_t last_enqueued = -1;
  int64_t last_started = -1;
  int64_t last_completed = -1;
  std::vector<DumpOp> ops;  // oldest first
};

// One process's dump.
struct RankDump {
  std::string path;
  int rank = -1;  // global rank
  std::string host;
  int pid = 0;
  int64_t time_us = 0;
  std::string reason;
  std::vector<DumpGroup> groups;
};

// Parses one dump; kDataLoss naming the path and line when it is not one.
absl::StatusOr<RankDump> ParseDump(std::string_view text, const std::string& path);

// Reads the dumps at `paths`: files, or directories whose regular files
// that start with the dump header are read (others are skipped). Ordered by
// rank.
absl::StatusOr<std::vector<RankDump>> ReadDumps(const std::vector<std::string>& paths);

struct Verdict {
  // False when the ranks agree on everything recorded.
  bool diverged = false;
  // One line: where the ranks diverged, which ranks are at fault and why.
  std::string text;
  std::string group;
  int64_t seq = -1;
  std::string op;
  // Global ranks at fault (never entered the op, ran something else, or are
  // still inside it while the others gave up).
  std::vector<int> culprits;
};

// The first divergence among `dumps`. With `world_size` (> 0) every rank's
// dump is expected and ranks without one are named; with 0 (say, one node's
// dumps of a larger job) missing ranks are not judged.
Verdict Analyse(const std::vector<RankDump>& dumps, int world_size = 0);

// Per rank and group: "rank 1 (host a, pid 7): group 0 (tcp): last completed
// #56 broadcast, last started #56; dump: SIGUSR1".
std::vector<std::string> Progress(const std::vector<RankDump>& dumps);

// "4 MiB", "16 B", "1.5 KiB".
std::string HumanBytes(int64_t bytes);

}  // namespace ember::launch::flight

#endif  // EMBER_TOOLS_LAUNCH_FLIGHT_ANALYSIS_H_
