// A worker for post_mortem_test: joins the job through env:// with a 3 s
// timeout, runs three all_reduces of 8 float32 (collectives #0-#2), and then
// every rank runs all_reduce #3, except --fault_rank, which does --fault:
//   skip         stays in its own code (sleeps a minute) instead
//   sigstop      stops itself (SIGSTOP)
//   sigkill      kills itself (SIGKILL)
//   other_op     runs a broadcast instead
//   other_size   passes 16 elements instead of 8
//   other_dtype  passes int64 instead of float32
// Without a fault every rank checks the result (world_size^4 everywhere).
// main runs through distributed::record, so a failure lands in
// TORCHELASTIC_ERROR_FILE. Flags: --backend=tcp|gloo.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/distributed.h"
#include "distributed/error_file.h"
#include "distributed/testing/flags.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace {

using ::ember::distributed::testing::Flag;

}  // namespace

int main(int argc, char** argv) {
  namespace dist = ember::distributed;
  const std::string backend = Flag(argc, argv, "backend", "tcp");
  const std::string fault = Flag(argc, argv, "fault", "none");
  const int fault_rank = std::atoi(Flag(argc, argv, "fault_rank", "1").c_str());
  return dist::record([&]() -> absl::Status {
    EMBER_RETURN_IF_ERROR(
        dist::init_process_group({.backend = backend, .timeout = absl::Seconds(3)}));
    const int rank = dist::get_rank();
    ember::Tensor t = ember::ones({8});
    for (int k = 0; k < 3; ++k) EMBER_RETURN_IF_ERROR(dist::all_reduce(t));
    if (rank == fault_rank) {
      if (fault == "skip") {
        absl::SleepFor(absl::Seconds(60));
        return absl::OkStatus();
      }
      if (fault == "sigstop") raise(SIGSTOP);
      if (fault == "sigkill") raise(SIGKILL);
      if (fault == "other_op") return dist::broadcast(t, 0);
      if (fault == "other_size") return dist::all_reduce(ember::ones({16}));
      if (fault == "other_dtype") return dist::all_reduce(ember::ones({8}, ember::kInt64));
    }
    EMBER_RETURN_IF_ERROR(dist::all_reduce(t));
    // Four sums of ones over the world: world^4 in every element.
    const double world = dist::get_world_size();
    const double want = world * world * world * world;
    if (t.max().item<double>() != want || t.min().item<double>() != want) {
      return absl::InternalError(absl::StrCat("rank ", rank, ": all_reduce gave ", t.ToString(),
                                              ", want ", want, " everywhere"));
    }
    return dist::destroy_process_group();
  });
}
