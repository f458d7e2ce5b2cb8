// TORCH_DISTRIBUTED_DEBUG=DETAIL through real groups: a mismatch no backend
// check catches (broadcasts from different roots) fails at once on every
// rank with both sides' calls, on tcp and gloo; agreeing calls run; the
// level's parsing.
#include "distributed/debug.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

TEST(DebugLevelTest, ParsesPyTorchsValues) {
  unsetenv("TORCH_DISTRIBUTED_DEBUG");
  EXPECT_EQ(debug_level_from_env(), DebugLevel::kOff);
  setenv("TORCH_DISTRIBUTED_DEBUG", "detail", 1);
  EXPECT_EQ(debug_level_from_env(), DebugLevel::kDetail);
  setenv("TORCH_DISTRIBUTED_DEBUG", "INFO", 1);
  EXPECT_EQ(debug_level_from_env(), DebugLevel::kInfo);
  setenv("TORCH_DISTRIBUTED_DEBUG", "LOUD", 1);
  EXPECT_EQ(debug_level_from_env(), DebugLevel::kOff);
  unsetenv("TORCH_DISTRIBUTED_DEBUG");
}

class DetailTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DetailTest, MismatchedRootsFailAtOnceNamingBothCalls) {
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  testing::RunRanksOptions options;
  options.backend = GetParam();
  options.timeout = absl::Seconds(20);
  std::vector<absl::Status> results = testing::RunRanksEach(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(ones({8}))));  // agreeing calls run
        const absl::Time start = absl::Now();
        absl::Status s = Finish(me.group->broadcast(ones({8}), {.root = me.rank}));
        if (absl::Now() - start > absl::Seconds(10)) {
          return absl::InternalError("the mismatch was found only at the timeout");
        }
        return s;
      },
      options);
  unsetenv("TORCH_DISTRIBUTED_DEBUG");
  EXPECT_TRUE(absl::IsFailedPrecondition(results[0])) << results[0];
  EXPECT_THAT(results[0].message(),
              HasSubstr("mismatched collectives: broadcast (collective #1): rank 1 ran broadcast "
                        "of 32 B float32 with root 1 but this rank (0) ran broadcast of 32 B "
                        "float32 with root 0"));
  EXPECT_THAT(results[1].message(),
              HasSubstr("rank 0 ran broadcast of 32 B float32 with root 0 but this rank (1) ran "
                        "broadcast of 32 B float32 with root 1"));
}

INSTANTIATE_TEST_SUITE_P(Backends, DetailTest, ::testing::Values("tcp", "gloo"));

}  // namespace
}  // namespace ember::distributed
