// Distributed checkpoints saved by N ranks (threads, each with its own tcp
// process group) and loaded by M ranks with other placements. Expected
// values come from the global tensors the test builds (arange), never from
// the code under test.
#include "distributed/checkpoint/checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
using ::ember::distributed::testing::RunRanksEach;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("dcp_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// The global tensors of the tests: distinct values everywhere.
Tensor Global(IntArrayRef shape, Dtype dtype, double start) {
  return arange(Numel(shape), kFloat64).add(start).view(shape).to(dtype);
}

absl::Status ExpectEqual(const std::string& what, const Tensor& got, const Tensor& want) {
  if (got.sizes() == want.sizes() && got.dtype() == want.dtype() && got.equal(want)) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(what, ": got ", got.ToString(), " want ",
                                          want.ToString()));
}

// Rows [start, start + n) of `t`.
Tensor Rows(const Tensor& t, int64_t start, int64_t n) { return t.narrow(0, start, n); }

// Elements [start, start + n) of t's row-major flattening.
Tensor Flat(const Tensor& t, int64_t start, int64_t n) {
  return t.contiguous().view({t.numel()}).narrow(0, start, n);
}

constexpr int64_t kRowStarts[] = {0, 3, 6, 8, 10};  // 10 rows over 4 ranks: 3, 3, 2, 2

// What rank r of 4 saves.
StateDict SavedBy(int r) {
  const Tensor w = Global({10, 6}, kFloat32, 0);
  const Tensor flat = Global({5, 7}, kFloat64, 1000);
  const int64_t flat_start = 9 * r, flat_n = r < 3 ? 9 : 8;  // 35 = 9 + 9 + 9 + 8
  return {
      {"w", shard(Rows(w, kRowStarts[r], kRowStarts[r + 1] - kRowStarts[r]).clone(), {10, 6},
                  {kRowStarts[r], 0})},
      {"b", replicated(Global({6}, kBFloat16, -3))},
      {"flat", flat_shard(Flat(flat, flat_start, flat_n).clone(), {5, 7}, flat_start)},
      {"step", replicated(scalar_tensor(int64_t{41}, kInt64))},
  };
}

absl::Status SaveFromFour(const std::string& path) {
  return RunRanks(4, [&](Rank& me) {
    return save(SavedBy(me.rank), {.path = path, .process_group = me.group});
  });
}

TEST(CheckpointTest, OneProcessRoundTripOfFullTensors) {
  const std::string path = FreshDir("one") + "/ckpt";
  StateDict sd = {
      {"a", replicated(Global({3, 4}, kFloat32, 1))},
      {"half", replicated(Global({5}, kFloat16, 2))},
      {"ids", replicated(Global({2, 2, 2}, kInt64, -4))},
      {"mask", replicated(Global({4}, kFloat32, 0).gt(1.5))},
      {"scalar", replicated(scalar_tensor(2.5, kFloat64))},
      {"empty", replicated(zeros({0, 3}))},
      {"strided", replicated(Global({4, 3}, kFloat32, 7).t())},
  };
  ASSERT_TRUE(save(sd, {.path = path}).ok());
  StateDict back;
  for (const auto& [k, item] : sd) back.push_back({k, replicated(zeros_like(item.tensor))});
  absl::Status s = load(back, {.path = path});
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_TRUE(ExpectEqual(sd[i].first, back[i].second.tensor, sd[i].second.tensor).ok())
        << sd[i].first;
  }
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> all = load_full_state_dict(path);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ((*all)[i].first, sd[i].first);  // the save order
    EXPECT_TRUE(ExpectEqual(sd[i].first, (*all)[i].second, sd[i].second.tensor.contiguous()).ok());
  }
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Note [Direct writes]: the data file is the same with and without O_DIRECT,
// for tensors the writer takes from their own memory (2 MiB, aligned),
// gathered ones (odd sizes, an unaligned view) and one after the other.
TEST(CheckpointTest, DirectAndBufferedSavesWriteTheSameFiles) {
  const Tensor big = Global({512, 1024}, kFloat32, 3);  // 2 MiB
  StateDict sd = {
      {"big", replicated(big)},
      {"odd", replicated(Global({1001}, kFloat32, 5))},
      {"big_again", replicated(Global({256, 1024}, kFloat32, -9))},
      {"view", replicated(big.narrow(0, 1, 300).view({300 * 1024}).narrow(0, 3, 70000))},
      {"tail", replicated(Global({7}, kInt64, 1))},
  };
  const std::string direct = FreshDir("direct") + "/ckpt";
  const std::string buffered = FreshDir("buffered") + "/ckpt";
  ASSERT_TRUE(save(sd, {.path = direct, .direct_io = true}).ok());
  ASSERT_TRUE(save(sd, {.path = buffered, .direct_io = false}).ok());
  const std::string direct_bytes = FileBytes(direct + "/__0_0.distcp");
  const std::string buffered_bytes = FileBytes(buffered + "/__0_0.distcp");
  int64_t total = 0;
  for (const auto& [k, item] : sd) total += static_cast<int64_t>(item.tensor.nbytes());
  EXPECT_EQ(static_cast<int64_t>(direct_bytes.size()), total);
  EXPECT_TRUE(direct_bytes == buffered_bytes) << "the data files differ";
  StateDict back;
  for (const auto& [k, item] : sd) back.push_back({k, replicated(zeros_like(item.tensor))});
  ASSERT_TRUE(load(back, {.path = direct}).ok());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_TRUE(ExpectEqual(sd[i].first, back[i].second.tensor, sd[i].second.tensor).ok())
        << sd[i].first;
  }
}

TEST(CheckpointTest, SavedByFourLoadsIntoThreeTwoAndOne) {
  const std::string path = FreshDir("reshard") + "/ckpt";
  absl::Status s = SaveFromFour(path);
  ASSERT_TRUE(s.ok()) << s;

  absl::StatusOr<Metadata> md = read_metadata(path);
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_EQ(md->world_size, 4);
  EXPECT_EQ(md->find("w")->chunks.size(), 4u);
  EXPECT_EQ(md->find("b")->chunks.size(), 1u) << "a replicated tensor is written once";
  EXPECT_EQ(md->find("step")->chunks.size(), 1u);
  EXPECT_EQ(md->find("b")->dtype, kBFloat16);

  const Tensor w = Global({10, 6}, kFloat32, 0);
  const Tensor flat = Global({5, 7}, kFloat64, 1000);
  const Tensor b = Global({6}, kBFloat16, -3);

  // Three ranks: w by columns, flat by rows (2, 2, 1).
  s = RunRanks(3, [&](Rank& me) -> absl::Status {
    const int r = me.rank;
    const int64_t row0[] = {0, 2, 4, 5};
    StateDict want = {
        {"w", shard(zeros({10, 2}), {10, 6}, {0, 2 * r})},
        {"flat", shard(zeros({row0[r + 1] - row0[r], 7}, kFloat64), {5, 7}, {row0[r], 0})},
        {"b", replicated(zeros({6}, kBFloat16))},
        {"step", replicated(scalar_tensor(int64_t{0}, kInt64))},
    };
    EMBER_RETURN_IF_ERROR(load(want, {.path = path}));
    EMBER_RETURN_IF_ERROR(ExpectEqual("w", want[0].second.tensor, w.narrow(1, 2 * r, 2)));
    EMBER_RETURN_IF_ERROR(
        ExpectEqual("flat", want[1].second.tensor, Rows(flat, row0[r], row0[r + 1] - row0[r])));
    EMBER_RETURN_IF_ERROR(ExpectEqual("b", want[2].second.tensor, b));
    return ExpectEqual("step", want[3].second.tensor, scalar_tensor(int64_t{41}, kInt64));
  });
  EXPECT_TRUE(s.ok()) << s;

  // Two ranks: both as flat shards, split elsewhere than the save's.
  s = RunRanks(2, [&](Rank& me) -> absl::Status {
    const int r = me.rank;
    StateDict want = {
        {"w", flat_shard(zeros({30}), {10, 6}, 30 * r)},
        {"flat", flat_shard(zeros({r == 0 ? 18 : 17}, kFloat64), {5, 7}, 18 * r)},
    };
    EMBER_RETURN_IF_ERROR(load(want, {.path = path}));
    EMBER_RETURN_IF_ERROR(ExpectEqual("w", want[0].second.tensor, Flat(w, 30 * r, 30)));
    return ExpectEqual("flat", want[1].second.tensor, Flat(flat, 18 * r, r == 0 ? 18 : 17));
  });
  EXPECT_TRUE(s.ok()) << s;

  // One process: whole tensors (a plain module's state_dict), in place, with
  // a dtype conversion.
  StateDict plain = {{"w", replicated(zeros({10, 6}, kFloat64))}, {"flat", replicated(zeros({5, 7}, kFloat64))}};
  s = load(plain, {.path = path});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(ExpectEqual("w", plain[0].second.tensor, w.to(kFloat64)).ok());
  EXPECT_TRUE(ExpectEqual("flat", plain[1].second.tensor, flat).ok());
}

// The plan and commit exchanges use only all_gather, which every backend
// has: the same save over gloo.
TEST(CheckpointTest, SavesOverGloo) {
  const std::string path = FreshDir("gloo") + "/ckpt";
  absl::Status s = RunRanks(
      4,
      [&](Rank& me) { return save(SavedBy(me.rank), {.path = path, .process_group = me.group}); },
      {.backend = "gloo"});
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> all = load_full_state_dict(path);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(ExpectEqual("w", (*all)[0].second, Global({10, 6}, kFloat32, 0)).ok());
  EXPECT_TRUE(ExpectEqual("flat", (*all)[2].second, Global({5, 7}, kFloat64, 1000)).ok());
}

TEST(CheckpointTest, FlatShardsThatStraddleRowsInThreeDims) {
  // Flat ranges that start and end mid-row in every dim, saved by 3 ranks
  // and read back by 2 with boxes.
  const std::string path = FreshDir("flat3d") + "/ckpt";
  const Tensor g = Global({3, 4, 5}, kFloat32, 0);
  const int64_t cut[] = {0, 23, 41, 60};
  absl::Status s = RunRanks(3, [&](Rank& me) {
    const int r = me.rank;
    StateDict sd = {{"g", flat_shard(Flat(g, cut[r], cut[r + 1] - cut[r]).clone(), {3, 4, 5},
                                     cut[r])}};
    return save(sd, {.path = path, .process_group = me.group});
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    StateDict want = {{"g", shard(zeros({3, 2, 5}), {3, 4, 5}, {0, 2 * r, 0})}};
    s = load(want, {.path = path});
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(ExpectEqual("g", want[0].second.tensor, g.narrow(1, 2 * r, 2)).ok());
  }
  // A flat target that is a strided view of a larger buffer.
  Tensor buffer = zeros({120});
  Tensor every_other = buffer.as_strided({60}, {2}, 0);
  s = load({{"g", flat_shard(every_other, {3, 4, 5}, 0)}}, {.path = path});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(ExpectEqual("g", every_other.contiguous(), Flat(g, 0, 60)).ok());
}

TEST(CheckpointTest, LoadReadsOnlyTheBlocksItNeeds) {
  const std::string path = FreshDir("partial") + "/ckpt";
  const Tensor g = Global({1000, 10}, kFloat32, 0);  // 40000 bytes: 10 blocks of 4096
  ASSERT_TRUE(save({{"g", replicated(g)}}, {.path = path, .checksum_block_bytes = 4096}).ok());
  // Damage the first block.
  {
    std::fstream f(path + "/__0_0.distcp", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  StateDict tail = {{"g", shard(zeros({100, 10}), {1000, 10}, {900, 0})}};
  absl::Status s = load(tail, {.path = path});
  ASSERT_TRUE(s.ok()) << "rows 900.. do not touch the damaged block: " << s;
  EXPECT_TRUE(ExpectEqual("tail", tail[0].second.tensor, Rows(g, 900, 100)).ok());
  StateDict head = {{"g", shard(zeros({5, 10}), {1000, 10}, {0, 0})}};
  s = load(head, {.path = path});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("__0_0.distcp: bytes [0, 4096) fail their checksum"));
}

TEST(CheckpointTest, EachRankReadsOnlyTheFilesItNeeds) {
  const std::string path = FreshDir("files") + "/ckpt";
  ASSERT_TRUE(SaveFromFour(path).ok());
  // Rank 3's file holds rows 8 and 9 of w (and no replicated tensor: those
  // went to the ranks with fewer bytes first). Cut it short.
  const std::string rank3 = path + "/__3_0.distcp";
  ASSERT_TRUE(fs::exists(rank3));
  absl::StatusOr<Metadata> md = read_metadata(path);
  ASSERT_TRUE(md.ok());
  fs::resize_file(rank3, 4);
  StateDict first_rows = {{"w", shard(zeros({6, 6}), {10, 6}, {0, 0})}};
  absl::Status s = load(first_rows, {.path = path});
  EXPECT_TRUE(s.ok()) << s;
  StateDict all_rows = {{"w", replicated(zeros({10, 6}))}};
  s = load(all_rows, {.path = path});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("__3_0.distcp is truncated"));
}

TEST(CheckpointTest, ASaveReplacesTheCheckpointWhole) {
  const std::string dir = FreshDir("replace");
  const std::string path = dir + "/ckpt";
  ASSERT_TRUE(SaveFromFour(path).ok());
  // Two ranks now save something else under the same path.
  absl::Status s = RunRanks(2, [&](Rank& me) {
    StateDict sd = {{"only", shard(full({2}, me.rank + 1.0), {4}, {2 * me.rank})}};
    return save(sd, {.path = path, .process_group = me.group});
  });
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> all = load_full_state_dict(path);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_TRUE(ExpectEqual("only", (*all)[0].second, tensor({1.0f, 1.0f, 2.0f, 2.0f})).ok());
  EXPECT_FALSE(fs::exists(path + "/__3_0.distcp")) << "files of the old checkpoint are gone";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  EXPECT_THAT(names, ::testing::ElementsAre("ckpt")) << "no temporary directory is left";
}

TEST(CheckpointTest, RanksThatDisagreeFailTogetherAndWriteNothing) {
  const std::string path = FreshDir("disagree") + "/ckpt";
  auto statuses = [&](std::function<StateDict(int)> make) {
    return RunRanksEach(3, [&](Rank& me) {
      return save(make(me.rank), {.path = path, .process_group = me.group});
    });
  };
  auto expect_all = [&](const std::vector<absl::Status>& got, const std::string& text) {
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r].code(), absl::StatusCode::kInvalidArgument) << "rank " << r << got[r];
      EXPECT_THAT(got[r].message(), HasSubstr(text)) << "rank " << r;
    }
    EXPECT_FALSE(fs::exists(path));
  };
  expect_all(statuses([](int r) {
               return StateDict{{"x", shard(zeros({2}), {r == 1 ? 7 : 6}, {2 * r})}};
             }),
             "is float32 [6] on rank 0 but float32 [7] on rank 1");
  expect_all(statuses([](int r) {
               return StateDict{{"x", shard(zeros({3}), {7}, {2 * r})}};
             }),
             "overlaps the piece");
  expect_all(statuses([](int r) {
               return StateDict{{"x", shard(zeros({1}), {6}, {2 * r})}};
             }),
             "cover 3 of its 6 elements");
  expect_all(statuses([](int r) {
               StateDict sd = {{"x", replicated(zeros({2}))}};
               if (r == 2) sd.push_back({"y", replicated(zeros({1}))});
               return sd;
             }),
             "rank 2 saves \"y\" but rank 0 does not");
  expect_all(statuses([](int r) {
               return StateDict{{"x", r == 2 ? replicated(Tensor()) : replicated(zeros({2}))}};
             }),
             "failed on rank 2: INVALID_ARGUMENT: state_dict[\"x\"] is undefined");
  expect_all(statuses([](int r) {
               return StateDict{{"x", shard(zeros({2, 2}), {4, 2}, {3, 0})}};
             }),
             "leaves the global shape [4, 2] in dim 0");
}

TEST(CheckpointTest, LoadErrorsNameTheKeyAndShapes) {
  const std::string path = FreshDir("loaderr") + "/ckpt";
  ASSERT_TRUE(save({{"w", replicated(zeros({2, 3}))}}, {.path = path}).ok());
  absl::Status s = load({{"v", replicated(zeros({2, 3}))}}, {.path = path});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("has no tensor \"v\""));
  s = load({{"w", replicated(zeros({3, 2}))}}, {.path = path});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("saved with shape [2, 3] but is loaded as [3, 2]"));
  s = load({{"w", replicated(zeros({2, 3}))}}, {.path = path + "_missing"});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, RefusesToReplaceWhatIsNotACheckpoint) {
  const std::string dir = FreshDir("refuse");
  std::ofstream(dir + "/notes.txt") << "keep me";
  absl::Status s = save({{"w", replicated(zeros({2}))}}, {.path = dir});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("refusing to replace what is not a distributed checkpoint"));
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  s = save({{"w", replicated(zeros({2}))}}, {.path = ""});
  EXPECT_THAT(s.message(), HasSubstr("path is empty"));
}

// FSDP x TP's layout: a [6, 8] tensor split by columns over 2 "tp" ranks
// (boxes [6, 4] at column 0 and 4), each box flattened and split over 2
// "dp" ranks (12 elements each), on 4 ranks; loaded whole, by rows on 2
// ranks, and as flat ranges of other boxes on 2 ranks.
TEST(CheckpointTest, FlatRangesOfBoxesReshard) {
  const std::string path = FreshDir("flat_in_box") + "/ckpt";
  const Tensor g = Global({6, 8}, kFloat32, 100);
  absl::Status s = RunRanks(4, [&](Rank& me) {
    const int tp = me.rank % 2, dp = me.rank / 2;
    const Tensor box = g.narrow(1, 4 * tp, 4);
    return save({{"w", flat_shard(Flat(box, 12 * dp, 12).clone(), {6, 8}, 12 * dp, {0, 4 * tp},
                                  {6, 4})}},
                {.path = path, .process_group = me.group});
  });
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> all = load_full_state_dict(path);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(ExpectEqual("whole", (*all)[0].second, g).ok());
  for (int r = 0; r < 2; ++r) {
    Tensor rows = zeros({3, 8});
    ASSERT_TRUE(load({{"w", shard(rows, {6, 8}, {3 * r, 0})}}, {.path = path}).ok());
    EXPECT_TRUE(ExpectEqual("rows", rows, Rows(g, 3 * r, 3)).ok());
    // Rows [3r, 3r + 3) as a box, its last 10 elements as a flat range.
    Tensor tail = zeros({10});
    ASSERT_TRUE(load({{"w", flat_shard(tail, {6, 8}, 14, {3 * r, 0}, {3, 8})}}, {.path = path}).ok());
    EXPECT_TRUE(ExpectEqual("flat tail", tail, Flat(Rows(g, 3 * r, 3), 14, 10)).ok());
  }
  // A box that leaves the global shape, and a range that leaves its box.
  absl::Status bad = load({{"w", flat_shard(zeros({4}), {6, 8}, 0, {0, 6}, {6, 4})}}, {.path = path});
  EXPECT_THAT(bad.message(), HasSubstr("the box of sizes [6, 4] at offsets [0, 6] leaves the "
                                       "global shape [6, 8] in dim 1"));
  bad = load({{"w", flat_shard(zeros({4}), {6, 8}, 22, {0, 0}, {6, 4})}}, {.path = path});
  EXPECT_THAT(bad.message(), HasSubstr("flat shard [22, 26) leaves the box of shape [6, 4]"));
  bad = load({{"w", flat_shard(zeros({4}), {6, 8}, 0, {0}, {6, 4})}}, {.path = path});
  EXPECT_THAT(bad.message(), HasSubstr("one offset and one box size per dimension"));
}

}  // namespace
}  // namespace ember::distributed::checkpoint
