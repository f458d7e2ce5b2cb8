// Process and Spawn: run functions in child processes
// (torch.multiprocessing.Process / spawn), with PyTorch's start methods.
//
//   ```cpp
//   #include "multiprocessing/process.h"
//   namespace mp = ember::multiprocessing;
//   absl::Status s = mp::spawn([&](int rank) -> absl::Status {
//     if (rank == 1) return absl::InternalError("loss is NaN");  // runs in child `rank`
//     return absl::OkStatus();
//   }, /*nprocs=*/2);
//   // s names the first failing rank and its message:
//   // "process 1 terminated with exit code 1: loss is NaN"
//   if (s.ok()) return absl::InternalError("the failing child went unnoticed");
//   ```
//
// The spawn method: an entry point registered at start-up (at namespace scope,
// EMBER_REGISTER_ENTRY_POINT("worker", Worker)), handed values; main() calls
// maybe_run_spawned_child() first.
//
//   ```cpp compile-only
//   #include "multiprocessing/process.h"
//   #include "multiprocessing/queue.h"
//   namespace mp = ember::multiprocessing;
//   mp::register_entry_point("worker", [](int rank, absl::Span<const mp::Value> args) {
//     absl::StatusOr<mp::Queue> queue = args[0].as<mp::Queue>();
//     return queue.ok() ? queue->put(mp::Value(rank)) : queue.status();
//   });
//   EMBER_ASSIGN_OR_RETURN(mp::Queue queue, mp::Queue::create());
//   EMBER_ASSIGN_OR_RETURN(mp::Context ctx, mp::get_context("spawn"));
//   EMBER_RETURN_IF_ERROR(ctx.spawn("worker", {mp::Value(queue)}, /*nprocs=*/4));
//   ```
//
// Start methods ("fork", "spawn" and "forkserver"; set_start_method picks
// the process-wide one, get_context one per call):
//   fork (StartMethod::kFork): the child is a fork() of the caller and runs
//     the function; it inherits everything, queues and shared tensors
//     included, and runs tensor ops on one thread (the intra-op pool's
//     threads do not survive fork; call set_num_threads to change that in the
//     child). As with Python's fork, forking a process with other threads
//     running is only safe when the function avoids locks those threads may
//     hold.
//   spawn (StartMethod::kSpawn): the child re-executes the current binary,
//     whose main() must call maybe_run_spawned_child() first; that runs the entry
//     point registered under the given name (EMBER_REGISTER_ENTRY_POINT) with
//     the child's rank and arguments, then exits. The arguments are Values
//     (value.h: plain values, shared tensors, Queues, Pipes' Connections),
//     sent to the child at start over an inherited socket in the message
//     encoding of queues (message.h), as Python's spawn pickles the process
//     object: tensors arrive in the same shared memory, channels as the same
//     sockets. Nothing else is inherited but the environment. A module is
//     passed as its shared state (module_state.h).
//   forkserver (StartMethod::kForkserver): the first use in a process starts
//     a server the spawn way (a fresh exec of this binary, served from
//     maybe_run_spawned_child(): no threads, locks or shared regions of the
//     caller); each child is then a fork() of that server, handed its
//     argument socket by the caller, and receives its entry point's rank and
//     arguments exactly as a spawned child does, so it carries what spawn
//     carries and starts without an exec. Its environment is the server's,
//     i.e. the caller's when the server started. The server reports each
//     child's end to the caller, so join, exit codes and kill/terminate
//     behave as for the other methods; it exits when the caller does (its
//     children with it), and a server found dead is restarted by the next
//     start (Note [Forkserver] in process.cc).
// Children die with their parent (PR_SET_PDEATHSIG: SIGKILL, delivered when
// the thread that started them exits; a forkserver's children with the
// server, which exits with the process that started it), so nothing is left
// orphaned.
// A child's failure (a non-OK Status or an exception) is reported to the
// parent with its message and exit code 1.
//
// Thread-safety: a Process handle is thread-compatible; Spawn, the start
// method functions and Context are thread-safe.
#ifndef EMBER_MULTIPROCESSING_PROCESS_H_
#define EMBER_MULTIPROCESSING_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/unique_fd.h"
#include "multiprocessing/connection.h"
#include "multiprocessing/value.h"

namespace ember::multiprocessing {

enum class StartMethod { kFork, kSpawn, kForkserver };

// How a child ended: an exit code, or the signal that killed it.
struct ExitStatus {
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;
  bool ok() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "signal SIGKILL".
  std::string str() const;
};

// What a registered entry point runs: its rank and the arguments it was given
// (under the spawn method, rebuilt in the child from what the parent passed).
using EntryPoint = absl::Status (*)(int rank, absl::Span<const Value> args);
// Registers `fn` under `name` (at start-up, e.g. via the macro below).
void register_entry_point(const std::string& name, EntryPoint fn);
#define EMBER_REGISTER_ENTRY_POINT(name, fn)                  \
  static const bool ember_entry_point_##fn = [] {             \
    ::ember::multiprocessing::register_entry_point(name, fn); \
    return true;                                              \
  }()
// Call first in main(): in a process started with kSpawn, runs its entry
// point and exits; in a forkserver, serves its parent until that exits
// (never returns in either); otherwise returns at once.
void maybe_run_spawned_child();

class Process {
 public:
  // Forks a child running `fn` (kFork). Errors: Unavailable when fork fails.
  static absl::StatusOr<Process> start(std::function<absl::Status()> fn);
  // Re-executes this binary running entry point `entry_point` with `rank`
  // and `args` (kSpawn), which are sent to the child as a message; their
  // tensors are moved to shared memory first. NotFound when `entry_point` is
  // not registered here; the errors of Connection::send when `args` cannot
  // be sent (the child is killed then).
  static absl::StatusOr<Process> start_spawn(const std::string& entry_point, int rank,
                                             std::vector<Value> args = {});
  // The same through this process's forkserver (kForkserver), started
  // first when there is none or it died. Errors as start_spawn's, and
  // Unavailable naming the server when it cannot be started, dies while
  // starting the child or refuses (its fork failed); DeadlineExceeded when
  // it does not answer within a minute.
  static absl::StatusOr<Process> start_forkserver(const std::string& entry_point, int rank,
                                                  std::vector<Value> args = {});

  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  // Kills (SIGKILL) and reaps a child that was never joined.
  ~Process();

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the child to end (DeadlineExceeded while it
  // runs). Returns the same status on every later call. A forkserver's
  // child whose server died before reporting its end is reported as exit
  // code 255 with a message saying so (as Python's forkserver does).
  absl::StatusOr<ExitStatus> join(absl::Duration timeout = absl::InfiniteDuration());
  bool is_alive();
  // The failure message the child reported ("" when none), once joined.
  const std::string& error_message() const { return error_message_; }
  void terminate();  // SIGTERM
  void kill();       // SIGKILL

 private:
  Process() = default;
  static absl::StatusOr<Process> StartExecuted(StartMethod method, const std::string& entry_point,
                                               int rank, std::vector<Value> args);
  void Reap(ExitStatus exit);
  void Signal(int signal);
  void KillAndReap();

  pid_t pid_ = -1;
  base::UniqueFd error_pipe_;  // the child's failure message arrives here
  // A forkserver's child: the server reports its end here (only the server
  // can wait for it); closed for the other methods.
  Connection reports_;
  std::optional<ExitStatus> exit_;
  std::string error_message_;
};

struct SpawnOptions {
  StartMethod start_method = StartMethod::kFork;
  // The registered entry point each child runs (kSpawn, kForkserver; under
  // kFork, when no function is given), and its arguments.
  std::string entry_point;
  std::vector<Value> args;
  // How long all children may run (then all are killed: DeadlineExceeded).
  absl::Duration timeout = absl::InfiniteDuration();
  // How long a terminated child has between SIGTERM and SIGKILL.
  absl::Duration terminate_grace = absl::Seconds(1);
};

// Starts `nprocs` children (rank 0..nprocs-1) running `fn(rank)` (kFork) or
// the entry point (kSpawn, kForkserver), and joins them all. When one fails, the others
// are terminated and the error names the failing rank, how it ended and its
// message ("process 1 terminated with signal SIGKILL", "process 2 terminated
// with exit code 1: <message>"). InvalidArgument for nprocs < 1.
absl::Status spawn(std::function<absl::Status(int rank)> fn, int nprocs,
                   const SpawnOptions& options = {});

// Start methods, as Python's multiprocessing names them.
// "fork", "spawn" and "forkserver".
std::vector<std::string> get_all_start_methods();
// Sets the process-wide start method, once: FailedPrecondition ("context has
// already been set") when it is already set, by an earlier call or by
// get_start_method / get_context fixing the default, unless `force`.
// InvalidArgument naming the valid methods for any other name.
absl::Status set_start_method(std::string_view method, bool force = false);
// The process-wide start method. When none was set: "" with `allow_none`,
// otherwise the default, "fork", which is then fixed (as Python does).
std::string get_start_method(bool allow_none = false);

// A start method to start children with (Python's multiprocessing context).
class Context {
 public:
  explicit Context(StartMethod method) : method_(method) {}
  StartMethod start_method() const { return method_; }
  std::string get_start_method() const;  // "fork", "spawn" or "forkserver"
  // One child running the registered `target` with `args` and `rank`
  // (Python's ctx.Process(target, args).start()). Under fork the values are
  // handed over as they are; under spawn and forkserver they are sent
  // (Process::start_spawn, Process::start_forkserver).
  absl::StatusOr<Process> process(const std::string& target, std::vector<Value> args = {},
                                  int rank = 0) const;
  // spawn(entry_point, nprocs) with this start method: every rank gets
  // `args` (torch.multiprocessing.spawn(fn, args, nprocs, start_method)).
  // `options.start_method`, `entry_point` and `args` are replaced.
  absl::Status spawn(const std::string& entry_point, std::vector<Value> args, int nprocs,
                     SpawnOptions options = {}) const;

 private:
  StartMethod method_;
};
// The context of `method` ("fork", "spawn" or "forkserver"; InvalidArgument naming the
// valid ones otherwise), or with "" the process-wide one (fixing the default
// as get_start_method does).
absl::StatusOr<Context> get_context(std::string_view method = "");

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_PROCESS_H_
