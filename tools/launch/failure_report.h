// What launch prints when a worker fails (Note [Failure summary] in
// failure_report.cc): the root cause first, then the first failure with its
// rank, host, pid, exit code or signal, time and message (from the worker's
// TORCHELASTIC_ERROR_FILE, else the last lines of its stderr), the other
// ranks' states, and the flight recorder analyser's verdict over the
// workers' dumps. The pieces here read /proc, error files and dumps; the
// launcher's supervision loop (launch.cc) calls them.
//
//   ```cpp
//   #include "tools/launch/failure_report.h"
//   ember::launch::WorkerReport first{.rank = 0, .local_rank = 0, .host = "n1", .pid = 42,
//                                     .outcome = "exited with code 1",
//                                     .when = absl::Now(), .message = "all_reduce ... timed out"};
//   std::string text = ember::launch::FailureSummary(first, {}, std::nullopt);
//   ```
//
// Thread-safety: plain functions and values; OutputTail is not thread-safe.
#ifndef EMBER_TOOLS_LAUNCH_FAILURE_REPORT_H_
#define EMBER_TOOLS_LAUNCH_FAILURE_REPORT_H_

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "tools/launch/flight_analysis.h"

namespace ember::launch {

// "running", "sleeping", "stopped (SIGSTOP or similar)", "in uninterruptible
// sleep", "zombie", or "gone", from /proc/<pid>/stat.
std::string ProcessState(pid_t pid);

// Whether `pid` has a handler installed for `sig` (SigCgt in
// /proc/<pid>/status): a worker that catches SIGUSR1 dumps its flight
// recorder on it; one that does not would die of it.
bool CatchesSignal(pid_t pid, int sig);

// The last `max_lines` lines of what a worker wrote to stderr.
class OutputTail {
 public:
  explicit OutputTail(size_t max_lines = 10) : max_lines_(max_lines) {}
  void Add(std::string_view bytes);
  // Complete lines, then the unfinished one, if any.
  std::vector<std::string> Lines() const;

 private:
  size_t max_lines_;
  std::deque<std::string> lines_;
  std::string partial_;
};

// The message in a TORCHELASTIC_ERROR_FILE (PyTorch's layout, see
// distributed/error_file.h), with its stack on the following lines when the
// file has one; nullopt when the file is absent or holds no message.
std::optional<std::string> ReadErrorFile(const std::string& path);

struct WorkerReport {
  int rank = -1;
  int local_rank = -1;
  std::string host;
  pid_t pid = -1;
  // "exited with code 1", "was killed by signal 9 (SIGKILL)", or for the
  // other ranks their state when the first one failed ("sleeping").
  std::string outcome;
  absl::Time when = absl::InfinitePast();
  // The signal that killed it; 0 if it exited (or for the other ranks).
  int signal = 0;
  // The error file's message, else the last lines of stderr; may be empty.
  std::string message;
  std::string message_source;  // "error file" or "stderr"
};

// The summary, as lines without the "launch: " prefix. `verdict` is the
// analyser's, when dumps were found in `dump_dir`; `dump_problem`, when not
// empty, says why the dumps there could not be read (the summary then names
// the first failure as the root cause and says so).
std::vector<std::string> FailureSummary(const WorkerReport& first,
                                        const std::vector<WorkerReport>& others,
                                        const std::optional<flight::Verdict>& verdict,
                                        const std::string& dump_dir = "",
                                        const std::string& dump_problem = "");

}  // namespace ember::launch

#endif  // EMBER_TOOLS_LAUNCH_FAILURE_REPORT_H_
