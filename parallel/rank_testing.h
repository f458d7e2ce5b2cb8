// What the parallel area's multi-rank tests share (testonly): running a
// rank's body with thrown ember::Errors as statuses, reading the outcome of
// forked ranks, and running a PyTorch 2.x script once per test binary.
//
//   using ::ember::parallel::rank_testing::ExpectAllSucceeded;
//   ExpectAllSucceeded(distributed::testing::RunRankProcesses(2, [](auto& me) {
//     return rank_testing::Guard([&] { return TrainOneStep(me); });
//   }));
//   const rank_testing::TorchRun& torch =
//       rank_testing::RunTorchOnce("parallel/testdata/torch_x.py", "torch_x");
//   if (absl::IsNotFound(torch.status)) GTEST_SKIP() << torch.status.message();
//
// Thread-safety: RunTorchOnce is safe from any thread; the rest are plain
// functions.
#ifndef EMBER_PARALLEL_RANK_TESTING_H_
#define EMBER_PARALLEL_RANK_TESTING_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "distributed/testing/ranks.h"
#include "serialization/state_dict.h"
#include "tensor/tensor.h"

namespace ember::parallel::rank_testing {

// body(), or Internal with the message of the ember::Error it threw (the
// modules and autograd report through exceptions).
absl::Status Guard(const std::function<absl::Status()>& body);

// One line per rank: its exit code, signal and output.
std::string Describe(const std::vector<distributed::testing::ProcessResult>& results);
// EXPECTs every rank to have exited 0, describing all of them otherwise.
void ExpectAllSucceeded(const std::vector<distributed::testing::ProcessResult>& results);

// The tensor called `name` in `state`; undefined when there is none.
Tensor Get(const StateDict& state, const std::string& name);

// A PyTorch 2.x script's run: its status (NotFound when the peer is not
// installed: skip) and the directory it wrote into.
struct TorchRun {
  absl::Status status;
  std::string dir;
};
// Runs `script` (a path in the test's data) with a fresh directory
// $TEST_TMPDIR/<dir_name> as its only argument, on the PyTorch 2.x peer
// (base/testing/peers.h), the first time it is asked for in this process;
// later calls return that run. The script must print "done" on success.
const TorchRun& RunTorchOnce(const std::string& script, const std::string& dir_name);

}  // namespace ember::parallel::rank_testing

#endif  // EMBER_PARALLEL_RANK_TESTING_H_
