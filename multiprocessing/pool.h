// Pool: a pool of worker processes running registered functions
// (multiprocessing.Pool, as torch.multiprocessing offers it): map, starmap
// and apply, blocking or returning an AsyncResult.
//
//   ```cpp
//   #include "multiprocessing/pool.h"
//   namespace mp = ember::multiprocessing;
//   // Registered at start-up (EMBER_REGISTER_POOL_FUNCTION at namespace scope).
//   mp::register_pool_function("square", [](absl::Span<const mp::Value> args)
//                                            -> absl::StatusOr<mp::Value> {
//     EMBER_ASSIGN_OR_RETURN(int64_t x, args[0].as<int64_t>());
//     return mp::Value(x * x);
//   });
//   EMBER_ASSIGN_OR_RETURN(mp::Pool pool,
//                          mp::Pool::create({.processes = 2, .start_method = "fork"}));
//   EMBER_ASSIGN_OR_RETURN(mp::Value::List squares,
//                          pool.map("square", {mp::Value(1), mp::Value(2), mp::Value(3)}));
//   if (squares[2].as<int64_t>().value_or(0) != 9) return absl::InternalError("wrong square");
//   EMBER_ASSIGN_OR_RETURN(mp::AsyncResult r, pool.apply_async("square", {mp::Value(7)}));
//   EMBER_ASSIGN_OR_RETURN(mp::Value v, r.get(absl::Seconds(10)));
//   pool.close();
//   EMBER_RETURN_IF_ERROR(pool.join(absl::Seconds(10)));
//   ```
//
// Functions are registered by name, as entry points are (process.h), so that
// workers started by any start method (fork, spawn, forkserver: the pool's
// context) find them; a spawned worker re-executes this binary, whose main()
// must call maybe_run_spawned_child() first. A task's arguments and result
// are Values: tensors travel as with Queue, moved to shared memory and
// received as views on the same bytes.
//
// Work goes to the workers in chunks (map's chunksize; default
// ceil(items / (4 * processes)), as Python's), each chunk one message on that
// worker's own socket, at most two chunks queued per worker. Results come
// back in order.
//
// Failures reach the result instead of hanging:
//   - a task that returns a non-OK Status or throws: get() returns the same
//     code with the worker's message, naming the function, the item and the
//     worker's pid (a map fails with its first failing chunk, as Python's);
//     so does a task whose arguments or result cannot be sent (one item
//     over kMaxMessageBytes; larger chunks and replies are split);
//   - a worker that dies (killed, crashed, exited) while it holds chunks:
//     their results fail with Aborted, naming the worker's pid and how it
//     ended (concurrent.futures' BrokenProcessPool); the pool starts a
//     replacement and goes on with the other work;
//   - terminate(): every unfinished result fails with Cancelled.
// Workers die with the pool's owner process (process.h).
//
// Thread-safety: Pool and AsyncResult are thread-safe.
#ifndef EMBER_MULTIPROCESSING_POOL_H_
#define EMBER_MULTIPROCESSING_POOL_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "multiprocessing/value.h"

namespace ember::multiprocessing {

// What a pool runs: a task's arguments (map: the one item; starmap and
// apply: the argument list) to its result.
using PoolFunction = absl::StatusOr<Value> (*)(absl::Span<const Value> args);
// Registers `fn` under `name` (at start-up, e.g. via the macro below).
void register_pool_function(const std::string& name, PoolFunction fn);
#define EMBER_REGISTER_POOL_FUNCTION(name, fn)                  \
  static const bool ember_pool_function_##fn = [] {             \
    ::ember::multiprocessing::register_pool_function(name, fn); \
    return true;                                                \
  }()

namespace internal {
struct PoolJob;
struct PoolState;
}  // namespace internal

// The result of an asynchronous call (multiprocessing.pool.AsyncResult).
class AsyncResult {
 public:
  // Waits up to `timeout` for the result: apply's value, or map's list.
  // DeadlineExceeded while not ready; otherwise the task's outcome (see the
  // header comment for the errors).
  absl::StatusOr<Value> get(absl::Duration timeout = absl::InfiniteDuration()) const;
  // OK once ready, DeadlineExceeded while not ready after `timeout`.
  absl::Status wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  bool ready() const;
  // Whether it succeeded; FailedPrecondition while not ready.
  absl::StatusOr<bool> successful() const;

 private:
  friend class Pool;
  AsyncResult() = default;
  std::shared_ptr<internal::PoolJob> job_;
};

struct PoolOptions {
  // Worker processes; unset: the number of online CPUs (os.cpu_count()).
  std::optional<int> processes;
  // "fork", "spawn" or "forkserver"; "": the process-wide start method
  // (get_start_method()).
  std::string start_method;
  // Chunks a worker runs before it is replaced by a fresh one; unset: no
  // limit.
  std::optional<int> maxtasksperchild;
};

class Pool {
 public:
  // Starts the workers. InvalidArgument for processes or maxtasksperchild
  // < 1 or an unknown start method (each named); the errors of starting a
  // process (process.h).
  static absl::StatusOr<Pool> create(PoolOptions options = {});

  Pool(Pool&&) noexcept;
  Pool& operator=(Pool&&) noexcept;
  // terminate(), then waits for the workers.
  ~Pool();

  // Runs `fn(args...)` in a worker and waits up to `timeout` for its result.
  absl::StatusOr<Value> apply(const std::string& fn, Value::List args = {},
                              absl::Duration timeout = absl::InfiniteDuration());
  // The same without waiting. NotFound for a function never registered;
  // FailedPrecondition once the pool is closed or terminated.
  absl::StatusOr<AsyncResult> apply_async(const std::string& fn, Value::List args = {});

  // `fn(item)` for each item, in order; chunksize 0: the default above.
  absl::StatusOr<Value::List> map(const std::string& fn, Value::List items, int chunksize = 0,
                                  absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<AsyncResult> map_async(const std::string& fn, Value::List items,
                                        int chunksize = 0);
  // `fn(args...)` for each argument list, in order.
  absl::StatusOr<Value::List> starmap(const std::string& fn, std::vector<Value::List> arg_lists,
                                      int chunksize = 0,
                                      absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<AsyncResult> starmap_async(const std::string& fn,
                                            std::vector<Value::List> arg_lists,
                                            int chunksize = 0);

  // No more work may be submitted; the workers exit once what was submitted
  // is done.
  void close();
  // Stops the workers now (SIGKILL); unfinished results fail with
  // Cancelled. Returns once they are gone.
  void terminate();
  // Waits up to `timeout` for the workers to exit after close() or
  // terminate(): FailedPrecondition while the pool still runs,
  // DeadlineExceeded when they are still working.
  absl::Status join(absl::Duration timeout = absl::InfiniteDuration());

  int processes() const;
  // The pids of the workers now running (replacements change them).
  std::vector<pid_t> pids() const;

 private:
  Pool() = default;
  // Queues `payload` (map's items, or starmap's and apply's argument lists
  // as list Values when `star`) in chunks.
  absl::StatusOr<AsyncResult> Submit(const std::string& fn, Value::List payload, bool star,
                                     int chunksize, bool single);
  // The result of `r`, moved out (for the blocking calls, whose AsyncResult
  // nobody else holds).
  static absl::StatusOr<Value> Take(AsyncResult& r, absl::Duration timeout);
  static absl::StatusOr<Value::List> TakeList(AsyncResult& r, absl::Duration timeout);
  std::unique_ptr<internal::PoolState> state_;
};

}  // namespace ember::multiprocessing

#endif  // EMBER_MULTIPROCESSING_POOL_H_
