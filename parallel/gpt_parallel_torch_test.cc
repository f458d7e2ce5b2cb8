// The small GPT of parallel/gpt_parallel_testing.h trained in each layout
// (TP=2; PP=2 under GPipe, 1F1B, Interleaved1F1B and InterleavedZeroBubble;
// FSDP x TP on a 2 x 2 mesh) by Ember over gloo and by PyTorch 2.15
// (parallel/testdata/torch_gpt_parallel.py: torch.distributed.tensor.parallel,
// torch.distributed.pipelining, FSDP2's fully_shard) from the same starting
// weights and tokens, both written by torch. Every parameter an Ember rank
// holds must be within 1e-5 relative (max |a - b| / max |b|) of its part of
// torch's trained value; rank 0 prints the largest difference.
#include <cstdio>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "parallel/gpt_parallel_testing.h"
#include "parallel/rank_testing.h"
#include "serialization/serialization.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;
using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::parallel::rank_testing::Get;
using ::ember::parallel::rank_testing::Guard;
using namespace ::ember::parallel::testing;  // NOLINT: the GPT's pieces

const rank_testing::TorchRun& Torch() {
  return rank_testing::RunTorchOnce("parallel/testdata/torch_gpt_parallel.py", "torch_gpt");
}

absl::Status Train(const Rank& me, const std::string& dir, const std::string& layout) {
  const GptConfig config;
  EMBER_ASSIGN_OR_RETURN(StateDict init, load(absl::StrCat(dir, "/init.pt")));
  EMBER_ASSIGN_OR_RETURN(StateDict data, load(absl::StrCat(dir, "/data.pt")));
  StateDict theirs;  // every torch rank's trained parameters
  for (int r = 0; r < me.world_size; ++r) {
    EMBER_ASSIGN_OR_RETURN(StateDict part,
                           load(absl::StrCat(dir, "/final_", layout, "_rank", r, ".pt")));
    theirs.insert(theirs.end(), part.begin(), part.end());
  }
  EMBER_ASSIGN_OR_RETURN(std::vector<LocalParameter> mine,
                         TrainGpt(layout, config, init, Get(data, "tokens"), Get(data, "targets")));
  if (mine.empty()) return absl::InternalError("this rank holds no parameters");
  EMBER_ASSIGN_OR_RETURN(double rel, MaxRelativeDifference(mine, theirs));
  if (me.rank == 0) {
    std::fprintf(stderr, "largest relative difference from torch, %s: %.3g\n", layout.c_str(), rel);
  }
  if (rel > 1e-5) {
    return absl::InternalError(
        absl::StrCat(layout, " rank ", me.rank, ": relative difference from torch ", rel));
  }
  return absl::OkStatus();
}

class GptParallelTorchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GptParallelTorchTest, MatchesTorch) {
  const rank_testing::TorchRun& torch = Torch();
  if (absl::IsNotFound(torch.status)) GTEST_SKIP() << torch.status.message();
  ASSERT_TRUE(torch.status.ok()) << torch.status;
  const std::string layout = GetParam();
  RunRanksOptions options;
  options.make_group = false;
  const std::vector<ProcessResult> results = RunRankProcesses(
      GptLayoutRanks(layout),
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(
            dist::init_process_group({.backend = "gloo",
                                      .init_method = absl::StrCat("file://", me.temp_dir, "/rdv"),
                                      .world_size = me.world_size,
                                      .rank = me.rank,
                                      .timeout = absl::Seconds(60)}));
        EMBER_RETURN_IF_ERROR(Guard([&] { return Train(me, torch.dir, layout); }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(180));
  rank_testing::ExpectAllSucceeded(results);
  std::cout << results[0].output;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GptParallelTorchTest, ::testing::ValuesIn(GptLayouts()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ember::parallel
