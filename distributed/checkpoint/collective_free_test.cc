// Collective-free saves (Note [Collective-free saves] in checkpoint.h): ranks
// are threads with their own tcp process groups, which name the rank and the
// world size but carry no collective of the save. Expected values are the
// global tensors the tests build.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/checkpoint/metadata.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("cfree_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

Tensor Weight(int world) { return arange(10 * world, kFloat32).view({2 * world, 5}); }
Tensor Bias() { return arange(5, kFloat64).add(-2); }

// Rank r holds rows [2r, 2r + 2) of the weight, every rank the bias.
StateDict Held(int rank, int world) {
  return {{"w", shard(Weight(world).narrow(0, 2 * rank, 2).clone(), {2 * world, 5}, {2 * rank, 0})},
          {"bias", replicated(Bias())}};
}

absl::Status SaveRanks(int world, const std::string& path, const std::vector<int>& savers) {
  return RunRanks(world, [&](Rank& me) -> absl::Status {
    if (std::find(savers.begin(), savers.end(), me.rank) == savers.end()) return absl::OkStatus();
    return save(Held(me.rank, world),
                {.path = path, .process_group = me.group, .collective_free = true});
  });
}

TEST(CollectiveFreeTest, EveryRankWritesItsPartAndLoadsMergeThem) {
  for (int world : {1, 3, 8}) {
    const std::string path = FreshDir(absl::StrCat("whole_", world)) + "/ckpt";
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    ASSERT_TRUE(SaveRanks(world, path, all).ok());
    EXPECT_FALSE(fs::exists(fs::path(path) / kMetadataFileName));
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(fs::exists(fs::path(path) / absl::StrCat("metadata.rank", r, ".json")));
    }
    absl::StatusOr<Metadata> md = read_metadata(path);
    ASSERT_TRUE(md.ok()) << md.status();
    EXPECT_EQ(md->world_size, world);
    ASSERT_EQ(md->tensors.size(), 2u);
    EXPECT_EQ(md->tensors[0].second.chunks.size(), static_cast<size_t>(world));
    EXPECT_EQ(md->tensors[1].second.chunks.size(), 1u);  // rank 0 writes the bias
    absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got = load_full_state_dict(path);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 2u);
    EXPECT_TRUE((*got)[0].second.equal(Weight(world)));
    EXPECT_TRUE((*got)[1].second.equal(Bias()));
  }
}

TEST(CollectiveFreeTest, LoadsReshardLikeAnyCheckpoint) {
  const std::string path = FreshDir("reshard") + "/ckpt";
  ASSERT_TRUE(SaveRanks(3, path, {0, 1, 2}).ok());
  // Two loaders: rows [0, 4) and [4, 6), each reading across the savers' parts.
  for (auto [start, rows] : {std::pair<int64_t, int64_t>{0, 4}, {4, 2}}) {
    Tensor mine = zeros({rows, 5}, kFloat32);
    Tensor bias = zeros({5}, kFloat64);
    ASSERT_TRUE(
        load({{"w", shard(mine, {6, 5}, {start, 0})}, {"bias", replicated(bias)}}, {.path = path})
            .ok());
    EXPECT_TRUE(mine.equal(Weight(3).narrow(0, start, rows)));
    EXPECT_TRUE(bias.equal(Bias()));
  }
}

TEST(CollectiveFreeTest, AnIncompleteSaveIsRefusedNamingTheMissingRanks) {
  const std::string path = FreshDir("incomplete") + "/ckpt";
  ASSERT_TRUE(SaveRanks(4, path, {0, 2}).ok());
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got = load_full_state_dict(path);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("the parts of ranks 1, 3 of 4 are missing"));

  const std::string no_zero = FreshDir("no_zero") + "/ckpt";
  ASSERT_TRUE(SaveRanks(2, no_zero, {1}).ok());
  got = load_full_state_dict(no_zero);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("the part of rank 0 is missing"));
}

TEST(CollectiveFreeTest, ADirectoryIsWrittenOnce) {
  const std::string path = FreshDir("once") + "/ckpt";
  ASSERT_TRUE(SaveRanks(2, path, {0, 1}).ok());
  const absl::Status again = save(Held(0, 1), {.path = path, .collective_free = true});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("already holds this rank's part"));
  // A collective checkpoint's directory too.
  const std::string collective = FreshDir("collective") + "/ckpt";
  ASSERT_TRUE(save(Held(0, 1), {.path = collective}).ok());
  const absl::Status over = save(Held(0, 1), {.path = collective, .collective_free = true});
  EXPECT_EQ(over.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over.message(), HasSubstr("already holds a checkpoint"));
  // The checkpoints are unchanged.
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got = load_full_state_dict(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].second.equal(Weight(2)));
}

TEST(CollectiveFreeTest, PartsThatDisagreeAreRefusedAtLoad) {
  const std::string path = FreshDir("disagree") + "/ckpt";
  ASSERT_TRUE(RunRanks(2, [&](Rank& me) -> absl::Status {
                StateDict sd = Held(me.rank, 2);
                if (me.rank == 1) {  // another global shape for the same key
                  sd[0].second = shard(zeros({2, 5}), {5, 5}, {2, 0});
                }
                return save(sd, {.path = path, .process_group = me.group, .collective_free = true});
              }).ok());
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got = load_full_state_dict(path);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("\"w\" is float32 [4, 5] in an earlier rank's part "
                                                "but float32 [5, 5] in rank 1's"));
}

TEST(CollectiveFreeTest, ReplicasOfOnePieceAreReadOnce) {
  // Ranks {0, 1} and {2, 3} are two replicas of a 2-way sharding (HSDP):
  // each piece is written twice, and loads read one copy.
  const std::string path = FreshDir("replicas") + "/ckpt";
  ASSERT_TRUE(RunRanks(4, [&](Rank& me) -> absl::Status {
                const int shard_index = me.rank % 2;
                return save({{"w", shard(Weight(2).narrow(0, 2 * shard_index, 2).clone(), {4, 5},
                                         {2 * shard_index, 0})}},
                            {.path = path, .process_group = me.group, .collective_free = true});
              }).ok());
  absl::StatusOr<Metadata> md = read_metadata(path);
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_EQ(md->tensors[0].second.chunks.size(), 2u);
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got = load_full_state_dict(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].second.equal(Weight(2)));
}

TEST(CollectiveFreeTest, ACoverageGapIsDataLossAtLoad) {
  const std::string path = FreshDir("gap") + "/ckpt";
  ASSERT_TRUE(RunRanks(2, [&](Rank& me) -> absl::Status {
                // Rank 1 holds rows [3, 4) only: row 2 of the [4, 5] weight is nobody's.
                StateDict sd = Held(me.rank, 2);
                if (me.rank == 1)
                  sd[0].second = shard(Weight(2).narrow(0, 3, 1).clone(), {4, 5}, {3, 0});
                return save(sd, {.path = path, .process_group = me.group, .collective_free = true});
              }).ok());
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> got = load_full_state_dict(path);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("cover 15 of the 20 elements"));
}

}  // namespace
}  // namespace ember::distributed::checkpoint
