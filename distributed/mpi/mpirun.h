// Runs this test binary again as the ranks of an mpirun job (testonly), so
// that a Bazel test can check the mpi backend, whose processes only mpirun
// can start.
//
//   TEST(MpiTest, SuiteAtThreeRanks) {
//     if (ember::distributed::testing::launched_job()) GTEST_SKIP() << "inside the job";
//     MpirunResult job = RunThisTestUnderMpirun(3, "Mpi/*");
//     EXPECT_EQ(job.exit_code, 0) << job.output;
//   }
//
// The job runs on loopback only (shared memory between the ranks, TCP over
// `lo`), with --oversubscribe (more ranks than cores) and as root when the
// test runs as root. Each rank runs the tests `gtest_filter` selects; the
// ranks meet through a FileStore in a fresh directory (EMBER_TEST_JOB_STORE,
// see distributed/testing/ranks.h), so RunRanks and RunRankProcesses run one
// rank per process there. mpirun is stopped (and with it the job) at
// the timeout: a hang fails instead of blocking the test.
//
// Thread-safety: call from one thread at a time; it forks.
#ifndef EMBER_DISTRIBUTED_MPI_MPIRUN_H_
#define EMBER_DISTRIBUTED_MPI_MPIRUN_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ember::distributed::mpi {

struct MpirunResult {
  int exit_code = -1;      // mpirun's exit code (0: every rank passed)
  bool timed_out = false;  // stopped at the timeout
  std::string output;      // what mpirun and the ranks printed
};

struct MpirunOptions {
  absl::Duration timeout = absl::Minutes(4);
  // Every process of the job starts MPI as it starts (MPI_Init is collective
  // over the job, so a rank outside a test's world size must call it too).
  // Off for a test that starts MPI itself.
  bool start_mpi = true;
  // More mpirun flags (after the helper's own), e.g. {"--mca",
  // "odls_base_sigkill_timeout", "6"}.
  std::vector<std::string> mpirun_args;
};

MpirunResult RunThisTestUnderMpirun(int ranks, const std::string& gtest_filter,
                                    const MpirunOptions& options = {});

}  // namespace ember::distributed::mpi

#endif  // EMBER_DISTRIBUTED_MPI_MPIRUN_H_
