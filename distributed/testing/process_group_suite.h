// The behaviour suite every process-group backend runs (testonly): each op
// for world sizes 1-4, every dtype and reduce op checked against values
// computed here, non-contiguous tensors, tags and any-source receives, and
// the failures (a rank that never joins, a monitored barrier, abort, a rank
// process killed or stopped mid all_reduce). A backend's test instantiates
// it with its name:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupSuite,
//                            ::testing::ValuesIn(WorldSizes({.backend = "gloo"})),
//                            SuiteParamName);
//   INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupFailureSuite, ::testing::Values("gloo"));
//
// The helpers below (Input, Expected, ...) are shared with the backends'
// own tests.
#ifndef EMBER_DISTRIBUTED_TESTING_PROCESS_GROUP_SUITE_H_
#define EMBER_DISTRIBUTED_TESTING_PROCESS_GROUP_SUITE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "distributed/process_group.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace ember::distributed::testing {

// A tensor of `n` elements of `dtype` holding `values`.
Tensor MakeTensor(const std::vector<double>& values, int64_t n, Dtype dtype);
// A small value that every dtype holds exactly: 1, 2 or 3 (0/1 for bool).
double Value(int rank, int64_t i, Dtype dtype);
// Rank `rank`'s input: element i is Value(rank, i, dtype).
Tensor Input(int rank, int64_t n, Dtype dtype);
// What `op` gives for element i over `world` ranks' Inputs, in double.
double Expected(ReduceOp op, int world, int64_t i, Dtype dtype);

struct SuiteParam {
  std::string backend;
  int world_size = 1;
  // Whether the backend has ReduceOp::kAvg (gloo refuses it, as in PyTorch).
  bool avg = true;
};
// The backend at world sizes 1 to 4.
std::vector<SuiteParam> WorldSizes(const SuiteParam& backend);
std::string SuiteParamName(const ::testing::TestParamInfo<SuiteParam>& info);

class ProcessGroupSuite : public ::testing::TestWithParam<SuiteParam> {
 protected:
  RunRanksOptions Options() const;
};

// Parametrised by the backend's name.
class ProcessGroupFailureSuite : public ::testing::TestWithParam<std::string> {
 protected:
  RunRanksOptions Options() const;
};

// Rank 0's all_reduce of `numel` floats when rank 1 never joins it (group
// timeout 600 ms); expects it to fail within 1.5 s and returns its status.
absl::Status AllReduceWithoutRank1(const std::string& backend, int64_t numel);

// Three rank processes all_reduce 16 MiB and all_gather 1 MiB each.
void ExpectAllReduceAcrossProcesses(const std::string& backend);

// Rank 2 of three processes raises `fault` (SIGKILL or SIGSTOP) in the
// middle of an all_reduce; the survivors' all_reduce must fail within about
// the timeout (3 s), naming rank 2 and the op.
void ExpectSurvivorsFail(const std::string& backend, int fault);

}  // namespace ember::distributed::testing

#endif  // EMBER_DISTRIBUTED_TESTING_PROCESS_GROUP_SUITE_H_
