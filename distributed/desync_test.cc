// Desync reports through real groups of rank processes: a rank that stays
// in its own code before collective #1 is named, with where it is, in the
// others' timeout errors, on tcp and gloo.
#include "distributed/desync.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/process_group.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Rank;
using ::testing::HasSubstr;

class DesyncTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DesyncTest, ATimeoutNamesTheRankThatIsBehindAndWhereItIs) {
  testing::RunRanksOptions options;
  options.backend = GetParam();
  options.timeout = absl::Seconds(2);
  const int world = 3;
  std::vector<testing::ProcessResult> results = testing::RunRankProcesses(
      world,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(ones({8}))));  // collective #0
        if (me.rank == 2) {
          absl::SleepFor(absl::Seconds(5));  // its own code, before #1
          return absl::OkStatus();
        }
        absl::Status s = Finish(me.group->allreduce(ones({8})));  // #1
        if (s.ok()) return absl::InternalError("all_reduce #1 succeeded without rank 2");
        return absl::InternalError(absl::StrCat("as expected: ", s.message()));
      },
      options, absl::Seconds(40));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(results[r].output);
    EXPECT_THAT(results[r].output,
                HasSubstr("desync report: rank 2 is behind: its last collective is #0 all_reduce "
                          "(completed #0)"));
    EXPECT_THAT(results[r].output, ::testing::Not(HasSubstr("rank 1 is behind")));
    EXPECT_THAT(results[r].output, ::testing::Not(HasSubstr("rank 0 is behind")));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DesyncTest, ::testing::Values("tcp", "gloo"));

}  // namespace
}  // namespace ember::distributed
