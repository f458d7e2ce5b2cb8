// Asynchronous saves and cached save plans: ranks are threads with their own
// tcp process groups (distributed/testing/ranks.h). Expected values are the
// tensors the tests build, never what the code under test returns.
#include "distributed/checkpoint/async_save.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("async_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

Tensor Values(int64_t n, double start) { return arange(n, kFloat32).add(start); }

absl::Status ExpectEqual(const std::string& what, const Tensor& got, const Tensor& want) {
  if (got.sizes() == want.sizes() && got.dtype() == want.dtype() && got.equal(want)) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat(what, ": got ", got.ToString(), " want ", want.ToString()));
}

absl::StatusOr<Tensor> LoadWhole(const std::string& path, const std::string& key) {
  EMBER_ASSIGN_OR_RETURN(auto all, load_full_state_dict(path, {key}));
  return all.at(0).second;
}

TEST(AsyncSaveTest, TheCheckpointHoldsTheValuesOfTheCallNotLaterWrites) {
  const std::string dir = FreshDir("staged");
  Tensor w = Values(1000, 0);
  AsyncCheckpointer checkpointer;
  absl::StatusOr<std::shared_ptr<Future>> written =
      checkpointer.async_save({{"w", replicated(w)}}, {.path = dir + "/a"});
  ASSERT_TRUE(written.ok()) << written.status();
  w.fill_(-1);  // training goes on: the staged copy is what gets written
  ASSERT_TRUE((*written)->wait().ok()) << (*written)->status();
  EXPECT_TRUE((*written)->done());
  absl::StatusOr<Tensor> got = LoadWhole(dir + "/a", "w");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(ExpectEqual("w", *got, Values(1000, 0)).ok());
  EXPECT_EQ(checkpointer.staging_bytes(), 4000);
}

TEST(AsyncSaveTest, EachSaveWaitsForThePreviousAndReusesItsStaging) {
  const std::string dir = FreshDir("sequence");
  Tensor w = Values(256, 0);
  Tensor step = scalar_tensor(int64_t{0}, kInt64);
  AsyncCheckpointer checkpointer;
  std::vector<std::shared_ptr<Future>> futures;
  for (int i = 0; i < 5; ++i) {
    w.add_(1.0);
    step.fill_(i);
    absl::StatusOr<std::shared_ptr<Future>> f = checkpointer.async_save(
        {{"w", replicated(w)}, {"step", replicated(step)}}, {.path = absl::StrCat(dir, "/", i)});
    ASSERT_TRUE(f.ok()) << f.status();
    // The previous save is committed once the next call returns.
    if (i > 0) {
      EXPECT_TRUE(futures.back()->done());
    }
    futures.push_back(*f);
    EXPECT_EQ(checkpointer.staging_bytes(), 256 * 4 + 8);
  }
  ASSERT_TRUE(checkpointer.wait().ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(futures[i]->wait().ok());
    absl::StatusOr<Tensor> got = LoadWhole(absl::StrCat(dir, "/", i), "w");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(ExpectEqual(absl::StrCat("save ", i), *got, Values(256, i + 1)).ok());
    absl::StatusOr<Tensor> s = LoadWhole(absl::StrCat(dir, "/", i), "step");
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->item<int64_t>(), i);
  }
}

TEST(AsyncSaveTest, AFailedWriteIsReportedOnceAtTheNextCallIfUnseen) {
  const std::string dir = FreshDir("failure");
  const std::string blocker = dir + "/file";
  std::ofstream(blocker) << "not a checkpoint";
  Tensor w = Values(16, 0);
  AsyncCheckpointer checkpointer;
  // A path that is a file: the background save refuses to replace it.
  absl::StatusOr<std::shared_ptr<Future>> bad =
      checkpointer.async_save({{"w", replicated(w)}}, {.path = blocker});
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::StatusOr<std::shared_ptr<Future>> next =
      checkpointer.async_save({{"w", replicated(w)}}, {.path = dir + "/good"});
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(next.status().message(), HasSubstr("the previous asynchronous save, to " + blocker));
  EXPECT_THAT(next.status().message(), HasSubstr("exists and is not a directory"));
  EXPECT_FALSE(fs::exists(dir + "/good"));  // nothing was started
  // Reported once: the next call saves.
  next = checkpointer.async_save({{"w", replicated(w)}}, {.path = dir + "/good"});
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE((*next)->wait().ok());
  EXPECT_TRUE(fs::exists(dir + "/good"));
  // A failure seen through the future is not reported again.
  bad = checkpointer.async_save({{"w", replicated(w)}}, {.path = blocker});
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE((*bad)->wait().ok());
  next = checkpointer.async_save({{"w", replicated(w)}}, {.path = dir + "/again"});
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(checkpointer.wait().ok());
}

TEST(AsyncSaveTest, BadInputIsRefusedBeforeAnythingIsStaged) {
  const std::string dir = FreshDir("bad");
  AsyncCheckpointer limited({.max_staging_bytes = 1000});
  absl::StatusOr<std::shared_ptr<Future>> big =
      limited.async_save({{"w", replicated(Values(300, 0))}}, {.path = dir + "/big"});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(),
              HasSubstr("holds 1200 bytes, more than max_staging_bytes (1000)"));
  EXPECT_EQ(limited.staging_bytes(), 0);
  absl::StatusOr<std::shared_ptr<Future>> twice = limited.async_save(
      {{"w", replicated(Values(3, 0))}, {"w", replicated(Values(3, 0))}}, {.path = dir + "/twice"});
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("the key \"w\" appears twice"));
  absl::StatusOr<std::shared_ptr<Future>> undefined =
      limited.async_save({{"w", replicated(Tensor())}}, {.path = dir + "/undefined"});
  ASSERT_FALSE(undefined.ok());
  EXPECT_THAT(undefined.status().message(), HasSubstr("the tensor of \"w\" is undefined"));
  EXPECT_TRUE(limited.wait().ok());  // nothing ran
}

// Rank r of `world` holds rows [2r, 2r + 2) of a [2 * world, 5] weight.
StateDict Sharded(int rank, int world, double start) {
  Tensor w = arange(10 * world, kFloat32).add(start).view({2 * world, 5});
  return {{"w", shard(w.narrow(0, 2 * rank, 2).clone(), {2 * world, 5}, {2 * rank, 0})},
          {"bias", replicated(Values(5, start))}};
}

TEST(AsyncSaveTest, RanksSaveShardsInTheBackgroundAndReuseThePlan) {
  const std::string dir = FreshDir("ranks");
  for (int world : {2, 3}) {
    ASSERT_TRUE(
        RunRanks(world, [&](Rank& me) -> absl::Status {
          AsyncCheckpointer checkpointer;
          for (int i = 0; i < 3; ++i) {
            StateDict sd = Sharded(me.rank, world, 100.0 * i);
            EMBER_ASSIGN_OR_RETURN(
                auto f, checkpointer.async_save(sd, {.path = absl::StrCat(dir, "/", world, "_", i),
                                                     .process_group = me.group}));
            sd[0].second.tensor.fill_(-5);  // the live shard changes at once
          }
          EMBER_RETURN_IF_ERROR(checkpointer.wait());
          // The first save planned; the two after it reused the plan.
          if (checkpointer.plan_cache()->misses() != 1 || checkpointer.plan_cache()->hits() != 2) {
            return absl::InternalError(
                absl::StrCat("plan cache: ", checkpointer.plan_cache()->hits(), " hits, ",
                             checkpointer.plan_cache()->misses(), " misses"));
          }
          return absl::OkStatus();
        }).ok());
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<Tensor> w = LoadWhole(absl::StrCat(dir, "/", world, "_", i), "w");
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_TRUE(
          ExpectEqual("w", *w, arange(10 * world, kFloat32).add(100.0 * i).view({2 * world, 5}))
              .ok());
    }
  }
}

TEST(AsyncSaveTest, ACachedPlanIsReplannedWhenOneRankChangesItsLayout) {
  const std::string dir = FreshDir("replan");
  const absl::Status ran = RunRanks(3, [&](Rank& me) -> absl::Status {
    auto cache = std::make_shared<SavePlanCache>();
    CheckpointOptions options{.process_group = me.group, .sync_files = false, .plan_cache = cache};
    options.path = dir + "/0";
    EMBER_RETURN_IF_ERROR(save(Sharded(me.rank, 3, 0), options));
    options.path = dir + "/1";
    EMBER_RETURN_IF_ERROR(save(Sharded(me.rank, 3, 1), options));
    // Ranks 1 and 2 move a row between them (rows [2, 3) and [3, 6)); rank
    // 0's layout stays as it was.
    StateDict changed = Sharded(me.rank, 3, 2);
    if (me.rank > 0) {
      const Tensor all = arange(30, kFloat32).add(2).view({6, 5});
      const int64_t start = me.rank == 1 ? 2 : 3, rows = me.rank == 1 ? 1 : 3;
      changed[0].second = shard(all.narrow(0, start, rows).clone(), {6, 5}, {start, 0});
    }
    options.path = dir + "/2";
    EMBER_RETURN_IF_ERROR(save(changed, options));
    options.path = dir + "/3";
    EMBER_RETURN_IF_ERROR(save(changed, options));
    if (cache->misses() != 2 || cache->hits() != 2) {
      return absl::InternalError(
          absl::StrCat("plan cache: ", cache->hits(), " hits, ", cache->misses(), " misses"));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(ran.ok()) << ran;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Tensor> w = LoadWhole(absl::StrCat(dir, "/", i), "w");
    ASSERT_TRUE(w.ok()) << w.status();
    // Saves 2 and 3 both hold the changed state dict (values from 2).
    EXPECT_TRUE(ExpectEqual("w", *w, arange(30, kFloat32).add(std::min(i, 2)).view({6, 5})).ok());
  }
}

TEST(AsyncSaveTest, ADeadPeerFailsTheBackgroundSaveWithinTheTimeout) {
  const std::string dir = FreshDir("dead");
  ASSERT_TRUE(RunRanks(2, [&](Rank& me) -> absl::Status {
                if (me.rank == 1) return absl::OkStatus();  // never saves: as good as dead
                AsyncCheckpointer checkpointer;
                EMBER_ASSIGN_OR_RETURN(
                    auto f,
                    checkpointer.async_save(Sharded(0, 2, 0), {.path = dir + "/x",
                                                               .process_group = me.group,
                                                               .timeout = absl::Seconds(2)}));
                const absl::Status status = f->wait(absl::Seconds(30));
                const bool still_running =
                    status.message().find("is still being written") != std::string::npos;
                if (status.ok() || still_running) {
                  return absl::InternalError(
                      absl::StrCat("the save did not fail in time: ", status.ToString()));
                }
                if (fs::exists(dir + "/x"))
                  return absl::InternalError("a failed save left a checkpoint");
                return absl::OkStatus();
              }).ok());
}

TEST(AsyncSaveTest, TheProcessWideAsyncSaveWrites) {
  const std::string dir = FreshDir("free_function");
  absl::StatusOr<std::shared_ptr<Future>> f =
      async_save({{"w", replicated(Values(8, 3))}}, {.path = dir + "/a"});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->wait().ok());
  absl::StatusOr<Tensor> got = LoadWhole(dir + "/a", "w");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(ExpectEqual("w", *got, Values(8, 3)).ok());
}

}  // namespace
}  // namespace ember::distributed::checkpoint
