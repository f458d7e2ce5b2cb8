// Process and Spawn: run functions in child processes
// (torch.multiprocessing.Process / spawn).
//
//   absl::Status s = Spawn([&](int rank) -> absl::Status {
//     return Train(rank, shared_weights);   // runs in child `rank`
//   }, /*nprocs=*/4);
//   // s names the first failing rank and its message, e.g.
//   // "process 2 terminated with exit code 1: loss is NaN"
//
// Start methods:
//   kFork: the child is a fork() of the caller and runs the function; it
//     inherits everything, queues and shared tensors included, and runs
//     tensor ops on one thread (the intra-op pool's threads do not survive
//     fork; call SetNumThreads to change that in the child). As with
//     Python's fork, forking a process with other threads running is only
//     safe when the function avoids locks those threads may hold.
//   kSpawn: the child re-executes the current binary, whose main() must call
//     MaybeRunSpawnedChild() first; that runs the entry point registered
//     under the given name (EMBER_REGISTER_ENTRY_POINT) with the child's rank
//     and arguments, then exits. It inherits nothing but the environment.
// Children die with their parent (PR_SET_PDEATHSIG: SIGKILL, delivered when
// the thread that started them exits), so nothing is left orphaned.
// A child's failure (a non-OK Status or an exception) is reported to the
// parent with its message and exit code 1.
//
// Thread-safety: a Process handle is thread-compatible; Spawn is thread-safe.
#ifndef EMBER_MULTIPROCESSING_PROCESS_H_
#define EMBER_MULTIPROCESSING_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "multiprocessing/unique_fd.h"

namespace ember::multiprocessing {

enum class StartMethod { kFork, kSpawn };

// How a child ended: an exit code, or the signal that killed it.
struct ExitStatus {
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;
  bool ok() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "signal SIGKILL".
  std::string ToString() const;
};

// What a kSpawn child runs: its rank and the arguments it was given.
using EntryPoint = absl::Status (*)(int rank,
                                    absl::Span<const std::string> args);
// Registers `fn` under `name` (at start-up, e.g. via the macro below).
void RegisterEntryPoint(const std::string& name, EntryPoint fn);
#define EMBER_REGISTER_ENTRY_POINT(name, fn)                \
  static const bool ember_entry_point_##fn = [] {           \
    ::ember::multiprocessing::RegisterEntryPoint(name, fn); \
    return true;                                            \
  }()
// Call first in main(): in a process started with kSpawn, runs its entry
// point and exits (never returns); otherwise returns at once.
void MaybeRunSpawnedChild();

class Process {
 public:
  // Forks a child running `fn` (kFork). Errors: Unavailable when fork fails.
  static absl::StatusOr<Process> Start(std::function<absl::Status()> fn);
  // Re-executes this binary running entry point `entry_point` with `rank`
  // and `args` (kSpawn). NotFound when `entry_point` is not registered here.
  static absl::StatusOr<Process> StartSpawn(const std::string& entry_point,
                                            int rank,
                                            std::vector<std::string> args = {});

  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  // Kills (SIGKILL) and reaps a child that was never joined.
  ~Process();

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the child to end (DeadlineExceeded while it
  // runs). Returns the same status on every later call.
  absl::StatusOr<ExitStatus> Join(
      absl::Duration timeout = absl::InfiniteDuration());
  bool is_alive();
  // The failure message the child reported ("" when none), once joined.
  const std::string& error_message() const { return error_message_; }
  void Terminate();  // SIGTERM
  void Kill();       // SIGKILL

 private:
  Process() = default;
  void Reap(int wait_status);

  pid_t pid_ = -1;
  UniqueFd error_pipe_;  // the child's failure message arrives here
  std::optional<ExitStatus> exit_;
  std::string error_message_;
};

struct SpawnOptions {
  StartMethod start_method = StartMethod::kFork;
  // kSpawn: the registered entry point each child runs, and its arguments.
  std::string entry_point;
  std::vector<std::string> args;
  // How long all children may run (then all are killed: DeadlineExceeded).
  absl::Duration timeout = absl::InfiniteDuration();
  // How long a terminated child has between SIGTERM and SIGKILL.
  absl::Duration terminate_grace = absl::Seconds(1);
};

// Starts `nprocs` children (rank 0..nprocs-1) running `fn(rank)` (kFork) or
// the entry point (kSpawn), and joins them all. When one fails, the others
// are terminated and the error names the failing rank, how it ended and its
// message. InvalidArgument for nprocs < 1.
absl::Status Spawn(std::function<absl::Status(int rank)> fn, int nprocs,
                   const SpawnOptions& options = {});

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_PROCESS_H_
