// The analyser on hand-written dumps in the documented format: ranks that
// never entered a collective, mismatched calls, ranks stuck inside one,
// ranks with no dump, and malformed files.
#include "tools/launch/flight_analysis.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch::flight {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Header(int rank) {
  return absl::StrCat(
      "# Ember flight recorder dump, format 1\n"
      "process rank=",
      rank, " host=node", rank, " pid=", 100 + rank, " time_us=5000 reason=\"SIGUSR1\"\n");
}
std::string Group(int rank, int size, int64_t last) {
  return absl::StrCat("group name=0 backend=tcp rank=", rank, " size=", size,
                      " capacity=2000 recorded=", last + 1, " last_enqueued=", last,
                      " last_started=", last, " last_completed=", last, "\n");
}
std::string Op(int64_t seq, const std::string& op, const std::string& dtype, int64_t bytes,
               const std::string& state, int peer = -1, const std::string& error = "") {
  return absl::StrCat("op group=0 id=", seq, " seq=", seq, " kind=collective op=", op,
                      " dtype=", dtype, " in_numel=1 out_numel=1 bytes=", bytes, " peer=", peer,
                      " tag=0 timeout_ms=5000 state=", state, " created_us=", 1000 + seq,
                      " started_us=", 1000 + seq, " finished_us=0 error=\"", error, "\"\n");
}

RankDump Parse(const std::string& text) {
  absl::StatusOr<RankDump> d = ParseDump(text, "dump");
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : RankDump{};
}

TEST(FlightAnalysisTest, ARankThatNeverEnteredIsNamedWithItsLastCompletedOp) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 4; ++r) {
    std::string text = Header(r) + Group(r, 4, r == 1 ? 56 : 57);
    text += Op(55, "all_reduce", "float32", 4 << 20, "completed");
    text += Op(56, "broadcast", "int64", 8, "completed", 0);
    if (r != 1) text += Op(57, "all_reduce", "float32", 4 << 20, "started");
    dumps.push_back(Parse(text + "end\n"));
  }
  Verdict v = Analyse(dumps, 4);
  EXPECT_TRUE(v.diverged);
  EXPECT_EQ(v.text,
            "all_reduce #57 (group 0, 4 MiB float32): ranks 0, 2, 3 entered it; rank 1 never did, "
            "its last completed op is #56 broadcast");
  EXPECT_THAT(v.culprits, ElementsAre(1));
  EXPECT_EQ(v.seq, 57);
}

TEST(FlightAnalysisTest, MismatchedCallsShowBothSides) {
  std::vector<RankDump> dumps;
  dumps.push_back(Parse(Header(0) + Group(0, 2, 3) + Op(3, "all_reduce", "float32", 32, "failed") +
                        "end\n"));
  dumps.push_back(Parse(Header(1) + Group(1, 2, 3) +
                        Op(3, "broadcast", "int64", 16, "failed", 0) + "end\n"));
  Verdict v = Analyse(dumps, 2);
  EXPECT_EQ(v.text,
            "collective #3 (group 0): the ranks disagree: rank 0 ran all_reduce of 32 B float32; "
            "rank 1 ran broadcast of 16 B int64 with root 0");
  EXPECT_THAT(v.culprits, ElementsAre(1));
}

TEST(FlightAnalysisTest, TheMinorityOfAMismatchIsAtFault) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 3; ++r) {
    dumps.push_back(Parse(Header(r) + Group(r, 3, 0) +
                          Op(0, "all_reduce", "float32", r == 0 ? 64 : 32, "failed") + "end\n"));
  }
  Verdict v = Analyse(dumps, 3);
  EXPECT_THAT(v.text, HasSubstr("rank 0 ran all_reduce of 64 B float32; ranks 1, 2 ran all_reduce "
                                "of 32 B float32"));
  EXPECT_THAT(v.culprits, ElementsAre(0));
}

TEST(FlightAnalysisTest, ARankStillInsideWhileTheOthersFailedIsNamed) {
  std::vector<RankDump> dumps;
  dumps.push_back(Parse(Header(0) + Group(0, 2, 0) +
                        Op(0, "all_gather", "int32", 1536, "failed", -1, "timed out \\\"x\\\"") +
                        "end\n"));
  dumps.push_back(
      Parse(Header(1) + Group(1, 2, 0) + Op(0, "all_gather", "int32", 1536, "started") + "end\n"));
  Verdict v = Analyse(dumps, 2);
  EXPECT_EQ(v.text,
            "all_gather #0 (group 0, 1.5 KiB int32): every rank entered it; rank 1 did not finish "
            "it; rank 0 failed it: timed out \"x\"");
  EXPECT_THAT(v.culprits, ElementsAre(1));
}

TEST(FlightAnalysisTest, ARankWithoutADumpIsNamed) {
  std::vector<RankDump> dumps;
  for (int r : {0, 2}) {
    dumps.push_back(Parse(Header(r) + Group(r, 3, 1) + Op(0, "barrier", "-", 0, "completed") +
                          Op(1, "all_reduce", "float64", 8, "started") + "end\n"));
  }
  Verdict v = Analyse(dumps, 3);
  EXPECT_EQ(v.text,
            "all_reduce #1 (group 0, 8 B float64): ranks 0, 2 entered it; rank 1 left no dump "
            "(killed or stopped?)");
  EXPECT_THAT(v.culprits, ElementsAre(1));
}

// One node's dumps of a larger job (world size unknown): missing ranks are
// not blamed, and ranks that all failed are not blamed either.
TEST(FlightAnalysisTest, WithoutTheWorldSizeMissingRanksAreNotJudged) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 2; ++r) {
    dumps.push_back(Parse(Header(r) + Group(r, 4, 3) +
                          Op(3, "all_reduce", "float32", 32, "failed", -1, "timed out") + "end\n"));
  }
  Verdict v = Analyse(dumps, 0);
  EXPECT_EQ(v.text,
            "all_reduce #3 (group 0, 32 B float32): every rank with a dump here entered it; ranks "
            "0, 1 failed it: timed out");
  EXPECT_TRUE(v.culprits.empty());
}

TEST(FlightAnalysisTest, AgreeingRanksHaveNoDivergence) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 2; ++r) {
    dumps.push_back(
        Parse(Header(r) + Group(r, 2, 0) + Op(0, "barrier", "-", 0, "completed") + "end\n"));
  }
  Verdict v = Analyse(dumps, 2);
  EXPECT_FALSE(v.diverged);
  EXPECT_THAT(v.text, HasSubstr("agree"));
}

TEST(FlightAnalysisTest, MalformedDumpsAreRefusedNamingTheLine) {
  absl::StatusOr<RankDump> cut = ParseDump(Header(0) + Group(0, 1, 0), "r0");
  EXPECT_THAT(cut.status().message(), HasSubstr("r0: the dump has no 'end' line"));
  absl::StatusOr<RankDump> odd = ParseDump(Header(0) + "bogus x=1\nend\n", "r0");
  EXPECT_THAT(odd.status().message(), HasSubstr("r0:3: unknown line kind 'bogus'"));
  absl::StatusOr<RankDump> none = ParseDump("hello\n", "r0");
  EXPECT_FALSE(none.ok());
}

TEST(FlightAnalysisTest, HumanBytes) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(4096), "4 KiB");
  EXPECT_EQ(HumanBytes(4 << 20), "4 MiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
}

}  // namespace
}  // namespace ember::launch::flight
