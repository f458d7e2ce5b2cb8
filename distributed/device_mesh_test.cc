// init_device_mesh on forked ranks over a file:// rendezvous, with the tcp
// and gloo backends: the layout, each dimension's group (checked by
// all_reduce of the global ranks along it), sub-meshes, coordinates and the
// errors.
#include "distributed/device_mesh.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

absl::Status Init(const Rank& me, const std::string& backend) {
  return init_process_group({.backend = backend,
                             .init_method = absl::StrCat("file://", me.temp_dir, "/rendezvous"),
                             .world_size = me.world_size,
                             .rank = me.rank,
                             .timeout = absl::Seconds(30)});
}

void ExpectAllExitedZero(const std::vector<ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
  }
}

// The sum of the global ranks in this rank's group.
absl::StatusOr<double> SumOfRanks(const Group& group) {
  Tensor t = full({1}, static_cast<double>(get_rank()));
  EMBER_RETURN_IF_ERROR(all_reduce(t, ReduceOp::kSum, group));
  return t.item<double>();
}

struct Case {
  std::string backend;
  int rows;
  int cols;
};

class DeviceMeshTest : public ::testing::TestWithParam<Case> {};

// A rows x cols mesh named ("dp", "tp"): rank r sits at (r / cols, r % cols).
TEST_P(DeviceMeshTest, TwoDimensionalLayoutGroupsAndSubMeshes) {
  const Case c = GetParam();
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllExitedZero(RunRankProcesses(
      c.rows * c.cols,
      [c](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, c.backend));
        EMBER_ASSIGN_OR_RETURN(DeviceMesh mesh,
                               init_device_mesh("cpu", {c.rows, c.cols}, {"dp", "tp"}));
        const int row = me.rank / c.cols;
        const int col = me.rank % c.cols;
        EMBER_RETURN_IF_ERROR(Check(mesh.ndim() == 2 && mesh.size() == c.rows * c.cols, "size"));
        EMBER_RETURN_IF_ERROR(
            Check(mesh.get_coordinate() == std::vector<int>{row, col}, "coordinate"));
        EMBER_ASSIGN_OR_RETURN(int tp_rank, mesh.get_local_rank("tp"));
        EMBER_ASSIGN_OR_RETURN(int dp_rank, mesh.get_local_rank(0));
        EMBER_RETURN_IF_ERROR(Check(tp_rank == col && dp_rank == row, "local ranks"));
        EMBER_ASSIGN_OR_RETURN(int64_t tp_size, mesh.size(1));
        EMBER_RETURN_IF_ERROR(Check(tp_size == c.cols, "size(1)"));

        // The "tp" group is this rank's row: ranks row*cols .. row*cols+cols-1.
        EMBER_ASSIGN_OR_RETURN(Group tp, mesh.get_group("tp"));
        EMBER_RETURN_IF_ERROR(
            Check(get_world_size(tp) == c.cols && get_rank(tp) == col,
                  absl::StrCat("tp group size ", get_world_size(tp), " rank ", get_rank(tp))));
        double row_sum = 0;
        for (int j = 0; j < c.cols; ++j) row_sum += row * c.cols + j;
        EMBER_ASSIGN_OR_RETURN(double tp_sum, SumOfRanks(tp));
        EMBER_RETURN_IF_ERROR(Check(tp_sum == row_sum, absl::StrCat("tp sum ", tp_sum)));

        // The "dp" group is this rank's column: col, col+cols, ...
        EMBER_ASSIGN_OR_RETURN(Group dp, mesh.get_group(0));
        EMBER_RETURN_IF_ERROR(
            Check(get_world_size(dp) == c.rows && get_rank(dp) == row, "dp group size and rank"));
        double col_sum = 0;
        for (int i = 0; i < c.rows; ++i) col_sum += i * c.cols + col;
        EMBER_ASSIGN_OR_RETURN(double dp_sum, SumOfRanks(dp));
        EMBER_RETURN_IF_ERROR(Check(dp_sum == col_sum, absl::StrCat("dp sum ", dp_sum)));

        // Sub-meshes: this rank's row and column, with the parent's groups.
        EMBER_ASSIGN_OR_RETURN(DeviceMesh tp_mesh, mesh["tp"]);
        std::vector<int> row_ranks;
        for (int j = 0; j < c.cols; ++j) row_ranks.push_back(row * c.cols + j);
        EMBER_RETURN_IF_ERROR(Check(tp_mesh.ranks() == row_ranks,
                                    absl::StrCat("tp sub-mesh ", tp_mesh.DebugString())));
        EMBER_RETURN_IF_ERROR(
            Check(tp_mesh.get_coordinate() == std::vector<int>{col}, "tp sub-mesh coordinate"));
        EMBER_ASSIGN_OR_RETURN(Group tp_again, tp_mesh.get_group());
        EMBER_RETURN_IF_ERROR(Check(tp_again == tp, "the sub-mesh reuses the group"));
        EMBER_ASSIGN_OR_RETURN(DeviceMesh dp_mesh, mesh["dp"]);
        std::vector<int> col_ranks;
        for (int i = 0; i < c.rows; ++i) col_ranks.push_back(i * c.cols + col);
        EMBER_RETURN_IF_ERROR(Check(dp_mesh.ranks() == col_ranks,
                                    absl::StrCat("dp sub-mesh ", dp_mesh.DebugString())));
        const std::vector<std::string> dp_tp = {"dp", "tp"};
        EMBER_ASSIGN_OR_RETURN(DeviceMesh both, mesh[dp_tp]);
        EMBER_RETURN_IF_ERROR(Check(both.ranks() == mesh.ranks(), "the whole mesh"));

        // Errors name the values.
        absl::StatusOr<DeviceMesh> bad = mesh["pp"];
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(bad.status()) &&
                                        absl::StrContains(bad.status().message(), "'pp'") &&
                                        absl::StrContains(bad.status().message(), "('dp', 'tp')"),
                                    absl::StrCat("unknown name: ", bad.status().ToString())));
        const std::vector<std::string> tp_dp = {"tp", "dp"};
        absl::StatusOr<DeviceMesh> reversed = mesh[tp_dp];
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(reversed.status()),
                                    absl::StrCat("reversed: ", reversed.status().ToString())));
        absl::StatusOr<Group> out_of_range = mesh.get_group(2);
        EMBER_RETURN_IF_ERROR(
            Check(absl::IsInvalidArgument(out_of_range.status()) &&
                      absl::StrContains(out_of_range.status().message(), "dimension 2"),
                  absl::StrCat("dim 2: ", out_of_range.status().ToString())));
        absl::StatusOr<Group> no_dim = mesh.get_group();
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(no_dim.status()), "get_group()"));

        // The same ranks as a 1-D mesh use the default group.
        EMBER_ASSIGN_OR_RETURN(DeviceMesh flat, init_device_mesh("cpu", {c.rows * c.cols}));
        EMBER_ASSIGN_OR_RETURN(Group world, flat.get_group());
        EMBER_ASSIGN_OR_RETURN(Group default_group, get_default_group());
        EMBER_RETURN_IF_ERROR(Check(world == default_group, "1-D mesh group"));
        return destroy_process_group();
      },
      options, absl::Seconds(120)));
}

INSTANTIATE_TEST_SUITE_P(Meshes, DeviceMeshTest,
                         ::testing::Values(Case{"tcp", 2, 2}, Case{"gloo", 2, 2}, Case{"tcp", 2, 3},
                                           Case{"gloo", 3, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.backend, "_", info.param.rows, "x",
                                               info.param.cols);
                         });

// A 2 x 2 x 1 mesh at 4 ranks: the groups of the middle dimension are the
// pairs {0, 2}, {1, 3}, and the size-1 dimension gives every rank its own.
TEST(DeviceMeshTest3D, GroupsOfEveryDimension) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllExitedZero(RunRankProcesses(
      4,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "tcp"));
        EMBER_ASSIGN_OR_RETURN(DeviceMesh mesh, init_device_mesh("cpu", {2, 2, 1}));
        // Rank r: (r / 2, r % 2, 0); flat index r * 1.
        EMBER_ASSIGN_OR_RETURN(Group middle, mesh.get_group(1));
        EMBER_ASSIGN_OR_RETURN(double sum, SumOfRanks(middle));
        const double expected = me.rank < 2 ? 0 + 1 : 2 + 3;
        EMBER_RETURN_IF_ERROR(Check(sum == expected, absl::StrCat("middle sum ", sum)));
        EMBER_ASSIGN_OR_RETURN(Group last, mesh.get_group(2));
        EMBER_RETURN_IF_ERROR(Check(get_world_size(last) == 1, "size-1 dimension"));
        EMBER_ASSIGN_OR_RETURN(Group first, mesh.get_group(0));
        EMBER_ASSIGN_OR_RETURN(double first_sum, SumOfRanks(first));
        EMBER_RETURN_IF_ERROR(Check(first_sum == (me.rank % 2 == 0 ? 0 + 2 : 1 + 3),
                                    absl::StrCat("first sum ", first_sum)));
        return destroy_process_group();
      },
      options, absl::Seconds(120)));
}

TEST(DeviceMeshErrorsTest, BadShapesAndNamesNameTheValues) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllExitedZero(RunRankProcesses(
      4,
      [](Rank& me) -> absl::Status {
        absl::StatusOr<DeviceMesh> early = init_device_mesh("cpu", {2, 2});
        EMBER_RETURN_IF_ERROR(Check(absl::IsFailedPrecondition(early.status()),
                                    absl::StrCat("before init: ", early.status().ToString())));
        EMBER_RETURN_IF_ERROR(Init(me, "tcp"));
        absl::StatusOr<DeviceMesh> wrong = init_device_mesh("cpu", {2, 3});
        EMBER_RETURN_IF_ERROR(
            Check(absl::IsInvalidArgument(wrong.status()) &&
                      absl::StrContains(wrong.status().message(), "(2, 3)") &&
                      absl::StrContains(wrong.status().message(), "world size is 4"),
                  absl::StrCat("shape: ", wrong.status().ToString())));
        absl::StatusOr<DeviceMesh> dup = init_device_mesh("cpu", {2, 2}, {"tp", "tp"});
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(dup.status()) &&
                                        absl::StrContains(dup.status().message(), "'tp' twice"),
                                    absl::StrCat("duplicate: ", dup.status().ToString())));
        absl::StatusOr<DeviceMesh> count = init_device_mesh("cpu", {2, 2}, {"dp"});
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(count.status()) &&
                                        absl::StrContains(count.status().message(), "('dp')"),
                                    absl::StrCat("count: ", count.status().ToString())));
        absl::StatusOr<DeviceMesh> zero = init_device_mesh("cpu", {4, 0});
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(zero.status()) &&
                                        absl::StrContains(zero.status().message(), "size 0"),
                                    absl::StrCat("zero: ", zero.status().ToString())));
        absl::StatusOr<DeviceMesh> device = init_device_mesh("tpu", {4});
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(device.status()) &&
                                        absl::StrContains(device.status().message(), "'tpu'"),
                                    absl::StrCat("device: ", device.status().ToString())));
        EMBER_ASSIGN_OR_RETURN(DeviceMesh unnamed, init_device_mesh("cpu", {2, 2}));
        absl::StatusOr<int> by_name = unnamed.get_local_rank("tp");
        EMBER_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(by_name.status()) &&
                                        absl::StrContains(by_name.status().message(), "'tp'"),
                                    absl::StrCat("unnamed: ", by_name.status().ToString())));
        EMBER_RETURN_IF_ERROR(Check(unnamed.DebugString() == "DeviceMesh('cpu', [[0, 1], [2, 3]])",
                                    unnamed.DebugString()));
        return destroy_process_group();
      },
      options, absl::Seconds(120)));
}

}  // namespace
}  // namespace ember::distributed
