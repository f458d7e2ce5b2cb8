// new_group's split hook (Note [Splitting new groups] in distributed.cc):
// every rank of the job, members of the new group or not, gives the default
// group's backend its turn with the new group's options, in order; a mixed
// default group passes it to each of its backends with their part of the
// prefix; a new group of another backend gets none. The backend here records
// the calls it gets (the nccl backend, which splits for real, is tested in
// distributed/nccl on GPUs); ranks are processes over a file:// rendezvous.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "distributed/backend_registry.h"
#include "distributed/distributed.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;

// The calls this process's recording groups got: "prefix+part rank size [ranks]".
std::vector<std::string>& Calls() {
  static auto* calls = new std::vector<std::string>;
  return *calls;
}

// A group that runs no op and records new_group's hook.
class RecordingGroup : public ProcessGroup {
 public:
  explicit RecordingGroup(const BackendOptions& o)
      : ProcessGroup(o.rank, o.size, "split_recorder", SupportTable(), o.timeout) {}
  void abort() override {}
  absl::Status split_for_new_group(const BackendOptions& group, const std::string& part) override {
    Calls().push_back(absl::StrCat(group.store_prefix, part, " ", group.rank, " ", group.size, " [",
                                   absl::StrJoin(group.ranks, ","), "]"));
    return absl::OkStatus();
  }

 protected:
  absl::Status No() const { return absl::UnimplementedError("the recording backend runs no op"); }
  absl::StatusOr<std::shared_ptr<Work>> DoBroadcast(const Tensor&,
                                                    const BroadcastOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduce(const Tensor&,
                                                    const AllReduceOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoReduce(const Tensor&, const ReduceOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllGather(absl::Span<const Tensor>, const Tensor&,
                                                    const AllGatherOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllGatherIntoTensor(const Tensor&, const Tensor&,
                                                              const AllGatherOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoGather(absl::Span<const Tensor>, const Tensor&,
                                                 const GatherOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoScatter(const Tensor&, absl::Span<const Tensor>,
                                                  const ScatterOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoReduceScatter(const Tensor&, absl::Span<const Tensor>,
                                                        const ReduceScatterOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllToAll(absl::Span<const Tensor>,
                                                   absl::Span<const Tensor>,
                                                   const AllToAllOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoBarrier(const BarrierOptions&) override { return No(); }
  absl::StatusOr<std::shared_ptr<Work>> DoMonitoredBarrier(
      const MonitoredBarrierOptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoSend(const Tensor&, int, const P2POptions&) override {
    return No();
  }
  absl::StatusOr<std::shared_ptr<RecvWork>> DoRecv(const Tensor&, int, const P2POptions&) override {
    return No();
  }
};

EMBER_REGISTER_BACKEND(split_recorder,
                       BackendInfo{.name = "split_recorder",
                                   .create = [](const BackendOptions& o)
                                       -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
                                     return std::make_shared<RecordingGroup>(o);
                                   }});

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus()
            : absl::InternalError(absl::StrCat("check failed: ", what, "; calls: ",
                                               absl::StrJoin(Calls(), "; ")));
}

absl::Status Init(const Rank& me, const std::string& backend) {
  return init_process_group({.backend = backend,
                             .init_method = absl::StrCat("file://", me.temp_dir, "/rendezvous"),
                             .world_size = me.world_size,
                             .rank = me.rank,
                             .timeout = absl::Seconds(20)});
}

void ExpectAllExitedZero(const std::vector<ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
  }
}

TEST(NewGroupSplitTest, EveryRankGetsTheHookWithTheNewGroupsOptions) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllExitedZero(RunRankProcesses(
      3,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "split_recorder"));
        EMBER_RETURN_IF_ERROR(Check(Calls().empty(), "no call before new_group"));
        EMBER_ASSIGN_OR_RETURN(Group pair, new_group({2, 0}));
        EMBER_RETURN_IF_ERROR(Check(Calls().size() == 1, "one call per new_group"));
        // Rank 1 is no member (-1); ranks 0 and 2 are the group's 0 and 1.
        const int in_group = me.rank == 0 ? 0 : me.rank == 2 ? 1 : -1;
        const std::string tail = absl::StrCat("1/ ", in_group, " 2 [0,2]");
        EMBER_RETURN_IF_ERROR(Check(
            Calls()[0].size() >= tail.size() &&
                Calls()[0].compare(Calls()[0].size() - tail.size(), tail.size(), tail) == 0,
            absl::StrCat("the call ends with '", tail, "'")));
        // A new group of another backend splits nothing from this one.
        EMBER_ASSIGN_OR_RETURN(Group other, new_group({0, 1, 2}, {.backend = "tcp"}));
        EMBER_RETURN_IF_ERROR(Check(Calls().size() == 1, "no call for a tcp group"));
        EMBER_ASSIGN_OR_RETURN(Group all, new_group());
        EMBER_RETURN_IF_ERROR(Check(Calls().size() == 2, "a call for new_group()"));
        EMBER_RETURN_IF_ERROR(Check(
            absl::StrContains(Calls()[1], absl::StrCat("3/ ", me.rank, " 3 [0,1,2]")),
            "the third group's options"));
        return destroy_process_group();
      },
      options));
}

TEST(NewGroupSplitTest, AMixedDefaultGroupPassesTheHookToEachBackendWithItsPart) {
  RunRanksOptions options;
  options.make_group = false;
  ExpectAllExitedZero(RunRankProcesses(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me, "cpu:tcp,cuda:split_recorder"));
        EMBER_ASSIGN_OR_RETURN(Group one, new_group({1}));
        // tcp ignores it; the recording backend gets the new group's prefix
        // and its own part of it, as the mixed backend makes its parts.
        EMBER_RETURN_IF_ERROR(Check(Calls().size() == 1, "one call, from the cuda part"));
        EMBER_RETURN_IF_ERROR(Check(
            absl::StrContains(Calls()[0], absl::StrCat("1/cuda/ ", me.rank == 1 ? 0 : -1, " 1 [1]")),
            "the cuda part's prefix and the new group's rank"));
        return destroy_process_group();
      },
      options));
}

}  // namespace
}  // namespace ember::distributed
