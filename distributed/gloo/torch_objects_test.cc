// Object collectives between PyTorch and Ember ranks of one gloo group (Note
// [Object collectives on the wire] in distributed/object_collectives.cc):
// forked processes over an Ember FileStore, the PyTorch ones running
// testdata/torch_objects_rank.py. Both sides run every object collective,
// each with Ember and PyTorch ranks as source, destination and peer, and
// check what they receive against literal values both build the same way.
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "distributed/distributed.h"
#include "distributed/file_store.h"
#include "distributed/object_collectives.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::gloo {
namespace {

using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;

constexpr char kTorchRank[] = "distributed/gloo/testdata/torch_objects_rank.py";

absl::Status Same(const PickleValue& got, const PickleValue& want, const std::string& what) {
  if (got == want) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("ember: ", what, ": got ", got.DebugString(), ", want ", want.DebugString()));
}

// torch_objects_rank.py's obj(r).
PickleValue Obj(int r) {
  return PickleValue::Dict(
      {{"rank", r},
       {"name", absl::StrCat("rank-", r)},
       {7, PickleValue::List({r * 1.5, nullptr, r % 2 == 0, PickleValue::Bytes("\x01\x02")})},
       {"nested", PickleValue::Tuple({PickleValue::Dict({{"deep", PickleValue::List({r})}})})},
       {"t", full({2, 2}, r, kFloat32)}});
}

// torch_objects_rank.py's run(), on an Ember rank.
absl::Status RunEmberRank(int r, int n) {
  std::vector<PickleValue> all(n);
  EMBER_RETURN_IF_ERROR(all_gather_object(absl::MakeSpan(all), Obj(r)));
  for (int p = 0; p < n; ++p) {
    EMBER_RETURN_IF_ERROR(Same(all[p], Obj(p), absl::StrCat("all_gather_object[", p, "]")));
  }

  std::vector<PickleValue> gathered(r == n - 1 ? n : 0);
  EMBER_RETURN_IF_ERROR(
      gather_object(std::string(r * 100, 'g'), absl::MakeSpan(gathered), /*dst=*/n - 1));
  for (int p = 0; p < static_cast<int>(gathered.size()); ++p) {
    EMBER_RETURN_IF_ERROR(
        Same(gathered[p], std::string(p * 100, 'g'), absl::StrCat("gather_object[", p, "]")));
  }

  const int src = n - 1;
  std::vector<PickleValue> list = {nullptr, nullptr, nullptr};
  if (r == src) list = {Obj(src), "x", PickleValue::List({})};
  EMBER_RETURN_IF_ERROR(broadcast_object_list(absl::MakeSpan(list), src));
  EMBER_RETURN_IF_ERROR(Same(PickleValue::List(list),
                             PickleValue::List({Obj(src), "x", PickleValue::List({})}),
                             "broadcast_object_list"));

  const int scatter_src = 1 % n;
  std::vector<PickleValue> inputs;
  if (r == scatter_src) {
    for (int p = 0; p < n; ++p) inputs.push_back(PickleValue::List({p, Obj(p)}));
  }
  std::vector<PickleValue> out(1);
  EMBER_RETURN_IF_ERROR(scatter_object_list(absl::MakeSpan(out), inputs, scatter_src));
  EMBER_RETURN_IF_ERROR(Same(out[0], PickleValue::List({r, Obj(r)}), "scatter_object_list"));

  const int peer = r % 2 == 0 ? r + 1 : r - 1;
  if (peer < n) {
    std::vector<PickleValue> got(2);
    if (r % 2 == 0) {
      EMBER_RETURN_IF_ERROR(send_object_list({Obj(r), PickleValue(r)}, peer));
      EMBER_RETURN_IF_ERROR(recv_object_list(absl::MakeSpan(got), peer).status());
    } else {
      EMBER_RETURN_IF_ERROR(recv_object_list(absl::MakeSpan(got), peer).status());
      EMBER_RETURN_IF_ERROR(send_object_list({Obj(r), PickleValue(r)}, peer));
    }
    EMBER_RETURN_IF_ERROR(
        Same(PickleValue::List(got), PickleValue::List({Obj(peer), peer}), "recv_object_list"));
  }
  return barrier();
}

// Which PyTorch the PyTorch ranks run: 1.13 (/usr/bin/python3) or the
// PyTorch 2.15 peer, whose newer gloo meets Ember's ranks in its own dialect
// (Note [Two gloo dialects] in mesh.cc).
enum class Peer { kTorch1, kTorch2 };

void RunMixedJob(int world, const std::set<int>& torch_ranks, Peer peer = Peer::kTorch1) {
  std::string python = "/usr/bin/python3";
  if (peer == Peer::kTorch2) {
    absl::StatusOr<std::string> p = ember::testing::torch2_python();
    if (!p.ok()) GTEST_SKIP() << p.status().message();
    python = *p;
  } else if (std::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is not installed; no PyTorch rank can join";
  }
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      world,
      [&](Rank& me) -> absl::Status {
        const std::string store_path = me.temp_dir + "/store";
        if (torch_ranks.contains(me.rank)) {
          const std::string rank = std::to_string(me.rank), size = std::to_string(world);
          // argv[0] is the interpreter's path, so that a virtual environment's
          // python finds its own site-packages.
          execl(python.c_str(), python.c_str(), kTorchRank, store_path.c_str(), rank.c_str(),
                size.c_str(), static_cast<char*>(nullptr));
          return absl::InternalError(absl::StrCat("exec of ", python, " failed: ", strerror(errno)));
        }
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store,
                               FileStore::open(store_path, absl::Seconds(60)));
        EMBER_RETURN_IF_ERROR(init_process_group({.backend = "gloo",
                                                  .world_size = world,
                                                  .rank = me.rank,
                                                  .timeout = absl::Seconds(60),
                                                  .store = store}));
        EMBER_RETURN_IF_ERROR(RunEmberRank(me.rank, world));
        return destroy_process_group();
      },
      options, absl::Seconds(150));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << (torch_ranks.contains(r) ? "PyTorch" : "Ember")
                                       << " rank " << r << ": " << results[r].output;
  }
}

// PyTorch rank 0 is the scatter's destination and the gather's source; Ember
// rank 1 is the broadcast's and scatter's source and the gather's dst.
TEST(TorchObjectsTest, PyTorchRankZeroAndAnEmberRank) { RunMixedJob(2, {0}); }

// Ember rank 0, PyTorch ranks 1 (scatter source) and 2 (broadcast source,
// gather destination), and an Ember rank 3 as rank 2's send/recv peer.
TEST(TorchObjectsTest, TwoPyTorchAndTwoEmberRanks) { RunMixedJob(4, {1, 2}); }

// The same with PyTorch 2.15 ranks.
TEST(TorchObjectsTest, Torch2RankZeroAndAnEmberRank) { RunMixedJob(2, {0}, Peer::kTorch2); }

TEST(TorchObjectsTest, TwoTorch2AndTwoEmberRanks) { RunMixedJob(4, {1, 2}, Peer::kTorch2); }

}  // namespace
}  // namespace ember::distributed::gloo
