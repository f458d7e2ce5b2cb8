// A rank of an mpi post-mortem job (started by mpirun; multihost_test runs
// it across two network namespaces): joins through
// init_process_group({.backend = "mpi"}) with no store (Note [mpi's store])
// and --timeout_ms (default 3000), runs three all_reduces of 8 float32
// (collectives #0-#2), and then every rank runs all_reduce #3 except
// --fault_rank (default: the last rank), which does --fault instead:
//   none        runs it too
//   skip        stays in its own code (sleeps a minute)
//   sigstop     stops itself (SIGSTOP); when continued, sleeps a minute
//   sigkill     kills itself (SIGKILL)
//   other_size  passes 16 elements instead of 8
// The faulty rank waits 300 ms first (skip, sigstop and sigkill), so that
// its progress is published (EMBER_DESYNC_PUBLISH_MS, Note [Desync
// reports]). Every other rank prints one line:
//   mpi_fault_worker rank R of N on HOST: all_reduce #3 failed after MS ms: STATUS
// (or "... all_reduce #3 succeeded after MS ms") and, on a failure, ends
// with exit code 1 without finalizing MPI (its collective is still inside
// MPI; ending the job is mpirun's business), rank 0 two seconds later than
// the others, since it serves the group's store.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "distributed/distributed.h"
#include "distributed/testing/flags.h"
#include "tensor/factories.h"

namespace {

using ::ember::distributed::testing::Flag;

[[noreturn]] void End(int code) {
  std::fflush(nullptr);
  _exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  namespace dist = ember::distributed;
  const std::string fault = Flag(argc, argv, "fault", "none");
  int timeout_ms = 0, fault_rank = -1;
  if (!absl::SimpleAtoi(Flag(argc, argv, "timeout_ms", "3000"), &timeout_ms) || timeout_ms <= 0 ||
      !absl::SimpleAtoi(Flag(argc, argv, "fault_rank", "-1"), &fault_rank)) {
    std::fprintf(stderr, "mpi_fault_worker: --timeout_ms must be a positive number of "
                         "milliseconds and --fault_rank a rank\n");
    return 2;
  }
  if (fault != "none" && fault != "skip" && fault != "sigstop" && fault != "sigkill" &&
      fault != "other_size") {
    std::fprintf(stderr,
                 "mpi_fault_worker: --fault=%s is none of none, skip, sigstop, sigkill, "
                 "other_size\n",
                 fault.c_str());
    return 2;
  }
  absl::Status init = dist::init_process_group(
      {.backend = "mpi", .timeout = absl::Milliseconds(timeout_ms)});
  if (!init.ok()) {
    std::fprintf(stderr, "mpi_fault_worker: init_process_group: %s\n", init.ToString().c_str());
    End(1);
  }
  const int rank = dist::get_rank(), size = dist::get_world_size();
  if (fault_rank < 0) fault_rank = size - 1;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  for (int k = 0; k < 3; ++k) {
    ember::Tensor t = ember::ones({8});
    if (absl::Status s = dist::all_reduce(t); !s.ok()) {
      std::fprintf(stderr, "mpi_fault_worker rank %d: all_reduce #%d: %s\n", rank, k,
                   s.ToString().c_str());
      End(1);
    }
  }
  if (rank == fault_rank && fault != "none" && fault != "other_size") {
    absl::SleepFor(absl::Milliseconds(300));
    if (fault == "sigkill") raise(SIGKILL);
    if (fault == "sigstop") raise(SIGSTOP);
    absl::SleepFor(absl::Seconds(60));
    End(0);
  }
  const bool bigger = rank == fault_rank && fault == "other_size";
  const absl::Time start = absl::Now();
  absl::Status s = dist::all_reduce(ember::ones({bigger ? 16 : 8}));
  const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - start);
  if (s.ok()) {
    std::printf("mpi_fault_worker rank %d of %d on %s: all_reduce #3 succeeded after %lld ms\n",
                rank, size, host, static_cast<long long>(ms));
    (void)dist::destroy_process_group();
    return 0;
  }
  std::printf("mpi_fault_worker rank %d of %d on %s: all_reduce #3 failed after %lld ms: %s\n",
              rank, size, host, static_cast<long long>(ms), s.ToString().c_str());
  // Rank 0 serves the group's store: it stays a little longer, while the
  // others read their desync reports from it.
  std::fflush(nullptr);
  absl::SleepFor(rank == 0 ? absl::Seconds(2) : absl::Milliseconds(500));
  End(1);
}
