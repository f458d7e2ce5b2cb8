// Test helpers (testonly) that run N ranks of a process group in one test:
// as threads over one in-process HashStore (fast; the default for unit
// tests), or as forked processes over a FileStore in a temporary directory.
//
//   absl::Status s = ember::distributed::testing::RunRanks(
//       4, [](ember::distributed::testing::Rank& me) -> absl::Status {
//         ember::Tensor t = ember::full({8}, me.rank);
//         EMBER_ASSIGN_OR_RETURN(auto work, me.group->allreduce(t));
//         return work->wait();
//       });
//   EXPECT_TRUE(s.ok()) << s;
//
// Each rank's group is built with the registered backend named in the
// options (the tcp backend by default), so the code under test is the real
// backend over real shared memory and sockets.
//
// A backend whose processes only its own launcher can start (mpi) runs the
// same tests inside a launched job (distributed/mpi/mpirun.h starts one):
// each test process is one rank, and RunRanks, RunRanksEach and
// RunRankProcesses run `body` only for this process's rank, over the job's
// ranks 0..world_size-1 (a process beyond them runs nothing), then exchange
// every rank's result through the job's FileStore, so that every process
// returns every rank's result, as the in-process forms do. Rank::store is then
// that FileStore (a fresh prefix per run), so ranks that count or signal
// through it work in both forms.
//
// Thread-safety: RunRanks may be called from any one thread at a time per
// test; the rank functions run concurrently.
#ifndef EMBER_DISTRIBUTED_TESTING_RANKS_H_
#define EMBER_DISTRIBUTED_TESTING_RANKS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/backend_registry.h"
#include "distributed/process_group.h"
#include "distributed/store.h"

namespace ember::distributed::testing {

struct Rank {
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<ProcessGroup> group;  // null when make_group is off
  std::shared_ptr<Store> store;
  // A directory shared by the ranks of one run (processes only).
  std::string temp_dir;
};

struct RunRanksOptions {
  std::string backend = "tcp";
  // The group's timeout (every op's default).
  absl::Duration timeout = absl::Seconds(20);
  std::string store_prefix = "test/";
  // Off: `body` builds what it needs itself (e.g. init_process_group with
  // file://<temp_dir>/...); Rank::group and Rank::store are then null.
  bool make_group = true;
  // The backend's own options (BackendOptions::pg_options).
  std::shared_ptr<const BackendSpecificOptions> pg_options;
};

// Runs `body` on `world_size` threads, each with its own group over one
// shared HashStore; blocks until all return. OK when every rank returned OK,
// else the errors of the failing ranks, each prefixed "rank r: ".
absl::Status RunRanks(int world_size, const std::function<absl::Status(Rank&)>& body,
                      const RunRanksOptions& options = {});

// The per-rank results of RunRanks, for tests that expect some ranks to fail.
std::vector<absl::Status> RunRanksEach(int world_size,
                                       const std::function<absl::Status(Rank&)>& body,
                                       const RunRanksOptions& options = {});

// How a rank process ended.
struct ProcessResult {
  int exit_code = -1;    // when it exited
  int signal = 0;        // when a signal killed it
  bool stopped = false;  // it was found stopped, not continued since (and then killed)
  std::string output;    // what it wrote to stderr (its errors)
};

// Forks `world_size` processes that rendezvous through a FileStore in a
// fresh temporary directory, builds each one's group and runs `body`; a
// rank exits 0 when `body` returns OK, else prints the error and exits 1.
// Waits for all children up to `wait`; children still running then, and
// children left stopped (SIGSTOP) once all others have ended, are killed.
// Call only while the test process has a single thread.
std::vector<ProcessResult> RunRankProcesses(int world_size,
                                            const std::function<absl::Status(Rank&)>& body,
                                            const RunRanksOptions& options = {},
                                            absl::Duration wait = absl::Seconds(60));

// This process's place in a launched job: set when the launcher's rank
// variables (Open MPI's OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE) and
// EMBER_TEST_JOB_STORE (the path of the job's FileStore) are in the
// environment.
struct LaunchedJob {
  int rank = 0;
  int world_size = 1;
  std::string store_path;
};
std::optional<LaunchedJob> launched_job();

// Runs an op to its end: the error of the call that issued it, else what
// its Work's wait() returns.
//   EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
absl::Status Finish(const absl::StatusOr<std::shared_ptr<Work>>& work);

}  // namespace ember::distributed::testing

#endif  // EMBER_DISTRIBUTED_TESTING_RANKS_H_
