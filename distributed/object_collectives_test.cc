#include "distributed/object_collectives.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::testing::HasSubstr;

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

absl::Status Same(const PickleValue& got, const PickleValue& want, const std::string& what) {
  if (got == want) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": got ", got.DebugString(), ", want ", want.DebugString()));
}

// Rank r's object: a dict of every kind the pickle carries.
PickleValue Obj(int r) {
  return PickleValue::Dict(
      {{"rank", r},
       {"name", absl::StrCat("rank-", r)},
       {7, PickleValue::List({r * 1.5, nullptr, r % 2 == 0, PickleValue::Bytes("\x01\x02")})},
       {"nested", PickleValue::Tuple({PickleValue::Dict({{"deep", PickleValue::List({r})}})})},
       {"t", full({2, 2}, r, kFloat32)}});
}

// A few MiB whose bytes depend on `seed`.
PickleValue Big(int seed) {
  std::string s(5 << 20, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 31 + seed) & 0xff);
  return PickleValue::Bytes(std::move(s));
}

absl::Status Everything(Rank& me, bool big) {
  const int r = me.rank, n = me.world_size;

  std::vector<PickleValue> all(n);
  EMBER_RETURN_IF_ERROR(all_gather_object(absl::MakeSpan(all), Obj(r)));
  for (int p = 0; p < n; ++p) {
    EMBER_RETURN_IF_ERROR(Same(all[p], Obj(p), absl::StrCat("all_gather_object[", p, "]")));
  }

  // Objects of different sizes (the padding), a big one when asked.
  std::vector<PickleValue> gathered(r == n - 1 ? n : 0);
  const PickleValue mine = big && r == 0 ? Big(0) : PickleValue(std::string(r * 100, 'g'));
  EMBER_RETURN_IF_ERROR(gather_object(mine, absl::MakeSpan(gathered), /*dst=*/n - 1));
  for (int p = 0; p < static_cast<int>(gathered.size()); ++p) {
    const PickleValue want = big && p == 0 ? Big(0) : PickleValue(std::string(p * 100, 'g'));
    EMBER_RETURN_IF_ERROR(Same(gathered[p], want, absl::StrCat("gather_object[", p, "]")));
  }

  const int src = n - 1;
  std::vector<PickleValue> list = {nullptr, nullptr, nullptr};
  if (r == src) list = {Obj(src), "x", big ? Big(src) : PickleValue(PickleValue::List({}))};
  EMBER_RETURN_IF_ERROR(broadcast_object_list(absl::MakeSpan(list), src));
  EMBER_RETURN_IF_ERROR(Same(list[0], Obj(src), "broadcast_object_list[0]"));
  EMBER_RETURN_IF_ERROR(Same(list[1], "x", "broadcast_object_list[1]"));
  EMBER_RETURN_IF_ERROR(
      Same(list[2], big ? Big(src) : PickleValue::List({}), "broadcast_object_list[2]"));

  const int scatter_src = 1 % n;
  std::vector<PickleValue> inputs;
  if (r == scatter_src) {
    for (int p = 0; p < n; ++p) inputs.push_back(PickleValue::List({p, Obj(p)}));
  }
  std::vector<PickleValue> out(1);
  EMBER_RETURN_IF_ERROR(scatter_object_list(absl::MakeSpan(out), inputs, scatter_src));
  EMBER_RETURN_IF_ERROR(Same(out[0], PickleValue::List({r, Obj(r)}), "scatter_object_list"));

  // Pairs exchange: even r sends to r + 1, which answers to any source.
  const int peer = r % 2 == 0 ? r + 1 : r - 1;
  if (peer < n) {
    std::vector<PickleValue> got(2);
    if (r % 2 == 0) {
      EMBER_RETURN_IF_ERROR(send_object_list({Obj(r), PickleValue(r)}, peer));
      EMBER_ASSIGN_OR_RETURN(int from, recv_object_list(absl::MakeSpan(got)));
      EMBER_RETURN_IF_ERROR(Check(from == peer, "recv_object_list's sender"));
    } else {
      EMBER_ASSIGN_OR_RETURN(int from, recv_object_list(absl::MakeSpan(got), peer));
      EMBER_RETURN_IF_ERROR(Check(from == peer, "recv_object_list's sender"));
      EMBER_RETURN_IF_ERROR(send_object_list({Obj(r), PickleValue(r)}, peer));
    }
    EMBER_RETURN_IF_ERROR(Same(got[0], Obj(peer), "recv_object_list[0]"));
    EMBER_RETURN_IF_ERROR(Same(got[1], peer, "recv_object_list[1]"));
  }

  // Empty lists carry nothing.
  EMBER_RETURN_IF_ERROR(broadcast_object_list({}, 0));
  if (peer < n) {
    EMBER_RETURN_IF_ERROR(r % 2 == 0 ? send_object_list({}, peer)
                                     : recv_object_list({}, peer).status());
  }
  return barrier();
}

void RunJob(const std::string& backend, int world, bool big) {
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      world,
      [&](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(
            init_process_group({.backend = backend,
                                .init_method = absl::StrCat("file://", me.temp_dir, "/rendezvous"),
                                .world_size = me.world_size,
                                .rank = me.rank,
                                .timeout = absl::Seconds(60)}));
        EMBER_RETURN_IF_ERROR(Everything(me, big));
        return destroy_process_group();
      },
      options, absl::Seconds(180));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << backend << " rank " << r << ": " << results[r].output;
  }
}

TEST(ObjectCollectivesTest, TwoRanksTcpWithBigObjects) { RunJob("tcp", 2, /*big=*/true); }
TEST(ObjectCollectivesTest, TwoRanksGlooWithBigObjects) { RunJob("gloo", 2, /*big=*/true); }
TEST(ObjectCollectivesTest, ThreeRanksTcp) { RunJob("tcp", 3, /*big=*/true); }
TEST(ObjectCollectivesTest, ThreeRanksGloo) { RunJob("gloo", 3, /*big=*/true); }
TEST(ObjectCollectivesTest, SixteenRanksTcp) { RunJob("tcp", 16, /*big=*/false); }
TEST(ObjectCollectivesTest, SixteenRanksGloo) { RunJob("gloo", 16, /*big=*/false); }

TEST(ObjectCollectivesTest, BeforeInitAsksForInit) {
  std::vector<PickleValue> list(1);
  absl::Status s = all_gather_object(absl::MakeSpan(list), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("init_process_group"));
}

TEST(ObjectCollectivesTest, BadInput) {
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(
            init_process_group({.backend = "gloo",
                                .init_method = absl::StrCat("file://", me.temp_dir, "/rendezvous"),
                                .world_size = 3,
                                .rank = me.rank,
                                .timeout = absl::Seconds(60)}));
        // Every rank refuses these before sending anything.
        std::vector<PickleValue> two(2);
        absl::Status s = all_gather_object(absl::MakeSpan(two), 1);
        EMBER_RETURN_IF_ERROR(Check(s.code() == absl::StatusCode::kInvalidArgument &&
                                        absl::StrContains(s.message(), "object_list has 2") &&
                                        absl::StrContains(s.message(), "(3)"),
                                    s.ToString()));
        std::vector<PickleValue> three(3);
        s = all_gather_object(absl::MakeSpan(three), PickleValue("\xff\xfe"));
        EMBER_RETURN_IF_ERROR(Check(s.code() == absl::StatusCode::kInvalidArgument &&
                                        absl::StrContains(s.message(), "all_gather_object") &&
                                        absl::StrContains(s.message(), "not valid UTF-8"),
                                    s.ToString()));
        s = all_gather_object(absl::MakeSpan(three), PickleValue::Dict({{nullptr, 1}}));
        EMBER_RETURN_IF_ERROR(
            Check(absl::StrContains(s.message(), "dict key None is a NoneType"), s.ToString()));
        s = scatter_object_list({}, {}, 0);
        EMBER_RETURN_IF_ERROR(
            Check(absl::StrContains(s.message(),
                                    "scatter_object_output_list to be a list of size "
                                    "at least 1"),
                  s.ToString()));
        s = send_object_list({1}, me.rank);
        EMBER_RETURN_IF_ERROR(
            Check(absl::StrContains(s.message(), "Invalid destination rank"), s.ToString()));
        // The group still works after the refusals.
        EMBER_RETURN_IF_ERROR(all_gather_object(absl::MakeSpan(three), me.rank));
        EMBER_RETURN_IF_ERROR(Same(three[2], 2, "all_gather_object after refusals"));

        // A rank outside a group.
        EMBER_ASSIGN_OR_RETURN(Group pair, new_group({0, 1}));
        if (me.rank == 2) {
          s = all_gather_object(absl::MakeSpan(two), 1, pair);
          EMBER_RETURN_IF_ERROR(Check(s.code() == absl::StatusCode::kFailedPrecondition &&
                                          absl::StrContains(s.message(), "not a member"),
                                      s.ToString()));
        } else {
          EMBER_RETURN_IF_ERROR(all_gather_object(absl::MakeSpan(two), me.rank * 10, pair));
          EMBER_RETURN_IF_ERROR(Same(two[1], 10, "all_gather_object in new_group({0, 1})"));
        }

        // The group's timeout: rank 1 never sends.
        EMBER_ASSIGN_OR_RETURN(Group quick, new_group({0, 1}, {.timeout = absl::Seconds(1)}));
        if (me.rank == 0) {
          std::vector<PickleValue> one(1);
          absl::StatusOr<int> got = recv_object_list(absl::MakeSpan(one), 1, quick);
          EMBER_RETURN_IF_ERROR(Check(got.status().code() == absl::StatusCode::kDeadlineExceeded,
                                      absl::StrCat("recv_object_list past the group's timeout: ",
                                                   got.status().ToString())));
        }
        EMBER_RETURN_IF_ERROR(barrier());
        return destroy_process_group();
      },
      options, absl::Seconds(120));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
}

}  // namespace
}  // namespace ember::distributed
