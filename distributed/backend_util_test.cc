// The helpers the tcp, gloo and mpi backends share (backend_util.h).
#include "distributed/backend_util.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "distributed/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"

namespace ember::distributed {
namespace {

using ::testing::HasSubstr;

BackendOptions WithStore(int rank, int size) {
  return {.store = std::make_shared<HashStore>(), .rank = rank, .size = size};
}

TEST(CheckBackendOptionsTest, AcceptsEveryRankOfTheGroup) {
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(CheckBackendOptions("tcp", WithStore(rank, 3)).ok()) << rank;
  }
}

TEST(CheckBackendOptionsTest, MissingStoreNamesTheBackend) {
  BackendOptions options = WithStore(0, 1);
  options.store = nullptr;
  absl::Status s = CheckBackendOptions("gloo", options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "gloo backend: no store was given");
}

TEST(CheckBackendOptionsTest, RankOutsideTheGroupNamesRankAndSize) {
  for (auto [rank, size] : {std::pair(2, 2), std::pair(-1, 4), std::pair(0, 0)}) {
    absl::Status s = CheckBackendOptions("tcp", WithStore(rank, size));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << rank << " of " << size;
    EXPECT_EQ(s.message(), absl::StrCat("tcp backend: rank ", rank, " is invalid for world size ",
                                        size, " (need 0 <= rank < world_size)"));
  }
}

TEST(RefuseAvgTest, RefusesOnlyAvgNamingTheOpAndTheBackend) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    EXPECT_TRUE(RefuseAvg(OpType::kAllReduce, op, "gloo").ok()) << reduce_op_name(op);
  }
  absl::Status s = RefuseAvg(OpType::kReduceScatter, ReduceOp::kAvg, "mpi");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(),
            "reduce_scatter: ReduceOp.AVG is not supported by the 'mpi' backend (as in "
            "PyTorch); use SUM and divide by the group size, or the 'tcp' backend");
}

TEST(StagingTest, AContiguousTensorIsItsOwnStaging) {
  Tensor t = arange(6).to(kFloat32).view({2, 3});
  Tensor staging = ContiguousStaging(t);
  EXPECT_TRUE(staging.is_same(t));
  // The op wrote the caller's memory already; copying back changes nothing.
  staging.fill_(7);
  CopyBackFromStaging(t, staging);
  EXPECT_TRUE(t.equal(full({2, 3}, 7, TensorOptions(kFloat32))));
}

TEST(StagingTest, ANonContiguousTensorIsStagedAndCopiedBack) {
  Tensor base = arange(6).to(kFloat32).view({2, 3});
  Tensor t = base.t();  // [3, 2], not contiguous
  ASSERT_FALSE(t.is_contiguous());
  Tensor staging = ContiguousStaging(t);
  EXPECT_FALSE(staging.is_same(t));
  EXPECT_TRUE(staging.is_contiguous());
  EXPECT_TRUE(staging.equal(t));
  // What the op writes into the staging reaches the caller's tensor, and so
  // its base, only through the copy back.
  staging.mul_(10);
  EXPECT_TRUE(base.equal(arange(6).to(kFloat32).view({2, 3})));
  CopyBackFromStaging(t, staging);
  EXPECT_TRUE(base.equal(arange(0, 60, 10).to(kFloat32).view({2, 3})));
}

TEST(MonitoredBarrierTimeoutTest, NamesTheMissingRanksAndTheTimeout) {
  absl::Status one = MonitoredBarrierTimeout({2}, absl::Milliseconds(500));
  EXPECT_EQ(one.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(one.message(), "monitored_barrier: rank 2 failed to pass monitoredBarrier in 500 ms");
  absl::Status two = MonitoredBarrierTimeout({1, 3}, absl::Seconds(2));
  EXPECT_THAT(std::string(two.message()),
              HasSubstr("ranks 1, 3 failed to pass monitoredBarrier in 2000 ms"));
}

}  // namespace
}  // namespace ember::distributed
