// A small GPT (parallel/gpt_parallel_testing.h) trained for three SGD steps
// with momentum in each layout of model parallelism, on forked ranks over
// tcp and gloo (file:// rendezvous): TP=2, PP=2 under GPipe, 1F1B,
// Interleaved1F1B and the interleaved zero-bubble schedule, and FSDP x TP
// on a 2 x 2 mesh. Every rank also trains the same model on the whole batch
// alone; each parameter a rank holds must be within 1e-5 relative
// (max |a - b| / max |b|) of its part of the lone model's. The lone model's
// parameters must have moved from their start (the check could fail), and a
// layout on the wrong number of ranks is refused by name. Checkpoints: two
// steps in one layout (FSDP x TP, TP, one process) saved as a distributed
// checkpoint with the optimizer's momentum, the third step in another layout
// loaded from it, equal to three steps of one process.
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "parallel/gpt_parallel_testing.h"
#include "parallel/rank_testing.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::parallel {
namespace {

namespace dist = ::ember::distributed;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::parallel::rank_testing::ExpectAllSucceeded;
using ::ember::parallel::rank_testing::Guard;
using namespace ::ember::parallel::testing;  // NOLINT: the GPT's pieces

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;

struct Data {
  StateDict init;
  Tensor tokens, targets;  // [steps, batch, seq]
};

Data MakeData(const GptConfig& config) {
  manual_seed(2024);
  Data d;
  d.init = MakeGpt(config)->state_dict();
  Tensor text = randint(0, config.vocab, {kSteps, kBatch, config.seq + 1});
  d.tokens = text.narrow(2, 0, config.seq).contiguous();
  d.targets = text.narrow(2, 1, config.seq).contiguous();
  return d;
}

absl::Status Init(const Rank& me, const std::string& backend) {
  return dist::init_process_group({.backend = backend,
                                   .init_method = absl::StrCat("file://", me.temp_dir, "/rdv"),
                                   .world_size = me.world_size,
                                   .rank = me.rank,
                                   .timeout = absl::Seconds(60)});
}

struct Case {
  std::string layout;
  std::string backend;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.layout << " over " << c.backend; }

class GptParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(GptParallelTest, EqualsOneProcessOnTheWholeBatch) {
  const Case c = GetParam();
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      GptLayoutRanks(c.layout),
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, c.backend));
        EMBER_RETURN_IF_ERROR(Guard([&]() -> absl::Status {
          const GptConfig config;
          const Data d = MakeData(config);
          EMBER_ASSIGN_OR_RETURN(std::vector<LocalParameter> mine,
                                 TrainGpt(c.layout, config, d.init, d.tokens, d.targets));
          EMBER_ASSIGN_OR_RETURN(StateDict alone,
                                 TrainGptAlone(config, d.init, d.tokens, d.targets));
          if (mine.empty()) return absl::InternalError("this rank holds no parameters");
          EMBER_ASSIGN_OR_RETURN(double moved, MaxRelativeDifference(
                                                   {{.name = "0.wte.weight",
                                                     .value = rank_testing::Get(d.init, "0.wte.weight")}},
                                                   alone));
          if (moved < 1e-3) return absl::InternalError("training did not move the embeddings");
          EMBER_ASSIGN_OR_RETURN(double rel, MaxRelativeDifference(mine, alone));
          if (rel > 1e-5) {
            return absl::InternalError(
                absl::StrCat(c.layout, " rank ", me.rank, ": relative difference ", rel));
          }
          return absl::OkStatus();
        }));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(180)));
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const std::string& layout : GptLayouts()) {
    for (const char* backend : {"tcp", "gloo"}) cases.push_back({layout, backend});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GptParallelTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.layout, "_", info.param.backend);
                         });

// Runs `body` on the ranks `layout` needs ("alone": in this process).
void OnRanks(const std::string& layout, const std::string& backend,
             const std::function<absl::Status()>& body) {
  if (GptLayoutRanks(layout) == 1) {
    EXPECT_TRUE(Guard(body).ok()) << Guard(body);
    return;
  }
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      GptLayoutRanks(layout),
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, backend));
        EMBER_RETURN_IF_ERROR(Guard(body));
        return dist::destroy_process_group();
      },
      options, absl::Seconds(180)));
}

struct Reshard {
  std::string saved_by;
  std::string loaded_by;
  std::string backend;
};

void PrintTo(const Reshard& c, std::ostream* os) {
  *os << c.saved_by << " -> " << c.loaded_by << " over " << c.backend;
}

class GptCheckpointTest : public ::testing::TestWithParam<Reshard> {};

// Two steps in one layout and a checkpoint (model and momentum), then the
// third step in another layout from that checkpoint: the parameters equal
// three steps of one process on the whole batch.
TEST_P(GptCheckpointTest, ReshardsToAnotherLayout) {
  const Reshard c = GetParam();
  const std::string dir = absl::StrCat(::testing::TempDir(), "/gpt_", c.saved_by, "_",
                                       c.loaded_by, "_", c.backend);
  const GptConfig config;
  const Data d = MakeData(config);
  OnRanks(c.saved_by, c.backend, [&]() -> absl::Status {
    return TrainGpt(c.saved_by, config, d.init, d.tokens.narrow(0, 0, 2),
                    d.targets.narrow(0, 0, 2), dir)
        .status();
  });
  OnRanks(c.loaded_by, c.backend, [&]() -> absl::Status {
    EMBER_ASSIGN_OR_RETURN(std::vector<LocalParameter> mine,
                           ResumeGpt(c.loaded_by, config, dir, d.tokens.narrow(0, 2, 1),
                                     d.targets.narrow(0, 2, 1)));
    EMBER_ASSIGN_OR_RETURN(StateDict alone, TrainGptAlone(config, d.init, d.tokens, d.targets));
    EMBER_ASSIGN_OR_RETURN(double rel, MaxRelativeDifference(mine, alone));
    if (rel > 1e-5) {
      return absl::InternalError(absl::StrCat(c.saved_by, " -> ", c.loaded_by,
                                              ": relative difference ", rel));
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GptCheckpointTest,
    ::testing::Values(Reshard{"fsdp_tp", "alone", "gloo"}, Reshard{"fsdp_tp", "tp", "gloo"},
                      Reshard{"fsdp_tp", "fsdp_tp", "tcp"}, Reshard{"tp", "fsdp_tp", "tcp"},
                      Reshard{"alone", "fsdp_tp", "gloo"}),
    [](const ::testing::TestParamInfo<Reshard>& info) {
      return absl::StrCat(info.param.saved_by, "_to_", info.param.loaded_by, "_",
                          info.param.backend);
    });

TEST(GptParallelErrorsTest, WrongRankCountAndUnknownLayout) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllSucceeded(RunRankProcesses(
      2,
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "tcp"));
        const GptConfig config;
        const Data d = MakeData(config);
        absl::StatusOr<std::vector<LocalParameter>> wrong =
            TrainGpt("fsdp_tp", config, d.init, d.tokens, d.targets);
        if (wrong.ok() || !absl::StrContains(wrong.status().message(), "runs on 4 ranks, not 2")) {
          return absl::InternalError(absl::StrCat("fsdp_tp on 2 ranks: ", wrong.status().ToString()));
        }
        absl::StatusOr<std::vector<LocalParameter>> unknown =
            TrainGpt("pp_3d", config, d.init, d.tokens, d.targets);
        if (unknown.ok() || !absl::StrContains(unknown.status().message(), "\"pp_3d\"")) {
          return absl::InternalError(absl::StrCat("pp_3d: ", unknown.status().ToString()));
        }
        return dist::destroy_process_group();
      },
      options, absl::Seconds(60)));
}

}  // namespace
}  // namespace ember::parallel
