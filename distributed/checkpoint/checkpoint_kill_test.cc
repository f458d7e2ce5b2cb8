// A rank killed (SIGKILL) in the middle of a save, with real processes: the
// previous checkpoint stays loadable, the surviving ranks return an error
// instead of hanging, and the next save cleans up after the dead one.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;

constexpr int kWorld = 4;
constexpr int64_t kRowsPerRank = 1024;
constexpr int64_t kCols = 4096;  // 16 MiB of float32 per rank

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / absl::StrCat("dcp_kill_", ::getpid()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Rank r's rows of version v: every element equals v * 100 + r.
StateDict Version(int v, int r, int world) {
  return {{"w", shard(full({kRowsPerRank, kCols}, v * 100.0 + r), {world * kRowsPerRank, kCols},
                      {r * kRowsPerRank, 0})},
          {"version", replicated(scalar_tensor(int64_t{v}, kInt64))}};
}

// Whether rank `rank`'s data file exists in a temporary directory of `path`.
bool DataFileStarted(const std::string& path, int rank) {
  const fs::path p(path);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p.parent_path(), ec)) {
    if (e.path().filename().string().rfind(p.filename().string() + ".tmp-", 0) == 0 &&
        fs::exists(e.path() / absl::StrCat("__", rank, "_0.distcp"), ec)) {
      return true;
    }
  }
  return false;
}

std::string Describe(const std::vector<ProcessResult>& results) {
  std::string out;
  for (size_t r = 0; r < results.size(); ++r) {
    absl::StrAppend(&out, "rank ", r, ": exit ", results[r].exit_code, " signal ",
                    results[r].signal, " ", results[r].output, "\n");
  }
  return out;
}

void ExpectVersion(const std::string& path, int v, int world) {
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> sd = load_full_state_dict(path);
  ASSERT_TRUE(sd.ok()) << sd.status();
  ASSERT_EQ(sd->size(), 2u);
  EXPECT_EQ((*sd)[1].second.item<int64_t>(), v);
  const Tensor& w = (*sd)[0].second;
  ASSERT_EQ(w.size(0), world * kRowsPerRank);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(w.narrow(0, r * kRowsPerRank, kRowsPerRank).equal(full({kRowsPerRank, kCols}, v * 100.0 + r)))
        << "rows of rank " << r << " are not version " << v;
  }
}

class KillMidSaveTest : public ::testing::TestWithParam<int> {};

TEST_P(KillMidSaveTest, PreviousCheckpointSurvives) {
  const int victim = GetParam();
  const std::string path = FreshDir(absl::StrCat("victim", victim)) + "/ckpt";
  std::vector<ProcessResult> first = RunRankProcesses(kWorld, [&](Rank& me) {
    return save(Version(1, me.rank, kWorld), {.path = path, .process_group = me.group});
  });
  for (const ProcessResult& p : first) ASSERT_EQ(p.exit_code, 0) << Describe(first);
  ExpectVersion(path, 1, kWorld);

  // Version 2: the victim dies as soon as its data file appears, while it is
  // still writing it.
  std::vector<ProcessResult> second = RunRankProcesses(
      kWorld,
      [&](Rank& me) -> absl::Status {
        const CheckpointOptions options{.path = path,
                                        .process_group = me.group,
                                        .timeout = absl::Seconds(30)};
        if (me.rank != victim) return save(Version(2, me.rank, kWorld), options);
        std::thread saver([&] { (void)save(Version(2, me.rank, kWorld), options); });
        while (!DataFileStarted(path, me.rank)) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        ::raise(SIGKILL);
        saver.join();
        return absl::InternalError("not reached");
      },
      {}, absl::Seconds(90));
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) {
      EXPECT_EQ(second[r].signal, SIGKILL) << Describe(second);
    } else {
      EXPECT_EQ(second[r].exit_code, 1) << "a survivor must fail, not commit or hang\n"
                                        << Describe(second);
      EXPECT_THAT(second[r].output, ::testing::HasSubstr("distributed checkpoint save"));
    }
  }
  ExpectVersion(path, 1, kWorld);
  bool temp_left = false;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    if (e.path().filename().string().rfind("ckpt.tmp-", 0) == 0) temp_left = true;
  }
  EXPECT_TRUE(temp_left) << "the dead save's directory is expected beside the checkpoint";

  // The job resumes on 2 ranks and saves version 3: committed, and the dead
  // save's temporary directory is removed.
  std::vector<ProcessResult> third = RunRankProcesses(2, [&](Rank& me) {
    return save(Version(3, me.rank, 2), {.path = path, .process_group = me.group});
  });
  for (const ProcessResult& p : third) ASSERT_EQ(p.exit_code, 0) << Describe(third);
  ExpectVersion(path, 3, 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    names.push_back(e.path().filename());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("ckpt"));
}

// Rank 0 commits; rank 2 is one of the others.
INSTANTIATE_TEST_SUITE_P(Victims, KillMidSaveTest, ::testing::Values(0, 2),
                         [](const auto& info) { return absl::StrCat("rank", info.param); });

}  // namespace
}  // namespace ember::distributed::checkpoint
