// The call check (Note [Call checks] in process_group.cc) through real
// groups on tcp and gloo: by default a mismatch the backends' transports
// cannot see (same bytes, another dtype; another reduce op) fails on every
// rank with the same message on both backends, and EMBER_CHECK_COLLECTIVES=0
// turns it off; at TORCH_DISTRIBUTED_DEBUG=DETAIL broadcasts from different
// roots and other shapes fail at once with both sides' calls; agreeing calls
// run; the levels' parsing.
#include "distributed/debug.h"

#include <cstdlib>
#include <functional>
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

TEST(CallCheckLevelTest, DetailWinsAndZeroTurnsItOff) {
  unsetenv("TORCH_DISTRIBUTED_DEBUG");
  unsetenv("EMBER_CHECK_COLLECTIVES");
  unsetenv("EMBER_GLOO_CHECK_COLLECTIVES");
  EXPECT_EQ(call_check_level_from_env(), CallCheckLevel::kDefault);
  setenv("EMBER_GLOO_CHECK_COLLECTIVES", "0", 1);
  EXPECT_EQ(call_check_level_from_env(), CallCheckLevel::kOff);
  unsetenv("EMBER_GLOO_CHECK_COLLECTIVES");
  setenv("EMBER_CHECK_COLLECTIVES", "0", 1);
  EXPECT_EQ(call_check_level_from_env(), CallCheckLevel::kOff);
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  EXPECT_EQ(call_check_level_from_env(), CallCheckLevel::kDetail);
  unsetenv("TORCH_DISTRIBUTED_DEBUG");
  unsetenv("EMBER_CHECK_COLLECTIVES");
}

class CallCheckTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::vector<absl::Status> Run(int ranks, std::function<absl::Status(Rank&)> body) {
    testing::RunRanksOptions options;
    options.backend = GetParam();
    options.timeout = absl::Seconds(20);
    const absl::Time start = absl::Now();
    std::vector<absl::Status> results = testing::RunRanksEach(ranks, std::move(body), options);
    // A mismatch is found when the ranks meet, not at the 20 s timeout.
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    return results;
  }
};

// float32 and int32 tensors of the same bytes: each backend's transport
// would carry them; only the call check sees the dtype.
TEST_P(CallCheckTest, SameBytesOtherDtypeFailsOnEveryRankWithOneMessage) {
  unsetenv("EMBER_CHECK_COLLECTIVES");
  std::vector<absl::Status> results = Run(3, [](Rank& me) -> absl::Status {
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(ones({8}))));
    return Finish(me.group->allreduce(ones({8}, me.rank == 2 ? kInt32 : kFloat32)));
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(results[r])) << r << ": " << results[r];
  }
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("mismatched collectives: all_reduce (collective #1): rank 2 ran "
                        "all_reduce of 32 B int32 (SUM) but this rank (0) ran all_reduce of 32 B "
                        "float32 (SUM); every rank must run the same collectives in the same "
                        "order with tensors of the same size and dtype"));
  EXPECT_THAT(std::string(results[2].message()),
              HasSubstr("rank 0 ran all_reduce of 32 B float32 (SUM) but this rank (2) ran "
                        "all_reduce of 32 B int32 (SUM)"));
}

TEST_P(CallCheckTest, OtherReduceOpFails) {
  std::vector<absl::Status> results = Run(2, [](Rank& me) -> absl::Status {
    return Finish(
        me.group->allreduce(ones({4}), {.op = me.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax}));
  });
  EXPECT_THAT(results[0].message(),
              HasSubstr("rank 1 ran all_reduce of 16 B float32 (MAX) but this rank (0) ran "
                        "all_reduce of 16 B float32 (SUM)"));
  EXPECT_TRUE(absl::IsFailedPrecondition(results[1])) << results[1];
}

TEST_P(CallCheckTest, OffLetsAgreeingBytesThrough) {
  setenv("EMBER_CHECK_COLLECTIVES", "0", 1);
  std::vector<absl::Status> results = Run(2, [](Rank& me) -> absl::Status {
    return Finish(
        me.group->allreduce(ones({4}), {.op = me.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax}));
  });
  unsetenv("EMBER_CHECK_COLLECTIVES");
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST_P(CallCheckTest, DetailComparesShapes) {
  auto shapes = [](Rank& me) -> absl::Status {
    return Finish(me.group->allreduce(me.rank == 0 ? ones({2, 4}) : ones({4, 2})));
  };
  std::vector<absl::Status> by_default = Run(2, shapes);
  EXPECT_TRUE(by_default[0].ok()) << by_default[0];
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  std::vector<absl::Status> detail = Run(2, shapes);
  unsetenv("TORCH_DISTRIBUTED_DEBUG");
  EXPECT_THAT(detail[0].message(),
              HasSubstr("rank 1 ran all_reduce of 32 B float32 (SUM), shape [4, 2] but this rank "
                        "(0) ran all_reduce of 32 B float32 (SUM), shape [2, 4]"));
  EXPECT_TRUE(absl::IsFailedPrecondition(detail[1])) << detail[1];
}

TEST_P(CallCheckTest, AllToAllCountsAreComparedPerPair) {
  std::vector<absl::Status> results = Run(2, [](Rank& me) -> absl::Status {
    // Rank 1 sends 3 elements to rank 0, which expects 2.
    std::vector<Tensor> in = {ones({2}), ones({me.rank == 1 ? 3 : 2})};
    std::vector<Tensor> out = {zeros({2}), zeros({2})};
    if (me.rank == 1) in = {ones({3}), ones({2})};
    return Finish(me.group->alltoall(out, in));
  });
  EXPECT_THAT(results[0].message(),
              HasSubstr("rank 1 sends 3 elements to this rank (0) but this rank expects 2"));
}

INSTANTIATE_TEST_SUITE_P(Backends, CallCheckTest, ::testing::Values("tcp", "gloo"));

}  // namespace
}  // namespace ember::distributed
