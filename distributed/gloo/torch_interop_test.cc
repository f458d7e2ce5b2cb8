// PyTorch and Ember ranks in one gloo group (Note [Joining PyTorch ranks] in
// process_group_gloo.cc): the ranks are forked processes over an Ember
// FileStore, or over the TCPStore that rank 0 hosts (init_method env://,
// MASTER_ADDR/MASTER_PORT; Ember's TcpStore or PyTorch's); the PyTorch ones
// exec python3 (PyTorch 1.13, or the PyTorch 2.15 peer) on
// testdata/torch_rank.py, the Ember ones call init_process_group("gloo") on
// the same store. Both sides
// run the same op sequence (every collective PyTorch's gloo backend has,
// send/recv, a new_group) and check every result themselves.
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "distributed/distributed.h"
#include "distributed/file_store.h"
#include "distributed/testing/free_port.h"
#include "distributed/testing/ranks.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::gloo {
namespace {

using ::ember::distributed::testing::FreePort;
using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;

constexpr char kTorchRank[] = "distributed/gloo/testdata/torch_rank.py";

bool HaveTorch() {
  return std::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") == 0;
}

absl::Status Expect(const std::string& what, const Tensor& got, const Tensor& want) {
  if (got.equal(want)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("ember: ", what, ": got ", got.ToString(), ", want ", want.ToString()));
}

// The op sequence of torch_rank.py's run(), on an Ember rank.
absl::Status RunEmberRank(int rank, int world) {
  Tensor t = full({5}, rank + 1.0, kFloat32);
  EMBER_RETURN_IF_ERROR(all_reduce(t));
  EMBER_RETURN_IF_ERROR(
      Expect("all_reduce SUM", t, full({5}, world * (world + 1) / 2.0, kFloat32)));

  t = tensor({int64_t{rank} * 10, -int64_t{rank}});
  EMBER_RETURN_IF_ERROR(all_reduce(t, ReduceOp::kMax));
  EMBER_RETURN_IF_ERROR(Expect("all_reduce MAX", t, tensor({int64_t{world - 1} * 10, int64_t{0}})));

  for (int src : {0, world - 1}) {
    t = arange(6, kFloat64).add(100.0 * rank);
    EMBER_RETURN_IF_ERROR(broadcast(t, src));
    EMBER_RETURN_IF_ERROR(
        Expect(absl::StrCat("broadcast from ", src), t, arange(6, kFloat64).add(100.0 * src)));
  }

  std::vector<Tensor> outs;
  for (int p = 0; p < world; ++p) outs.push_back(zeros({3}, kInt32));
  EMBER_RETURN_IF_ERROR(all_gather(outs, full({3}, rank, kInt32)));
  for (int p = 0; p < world; ++p) {
    EMBER_RETURN_IF_ERROR(
        Expect(absl::StrCat("all_gather[", p, "]"), outs[p], full({3}, p, kInt32)));
  }

  t = full({4}, rank, kFloat32);
  EMBER_RETURN_IF_ERROR(reduce(t, /*dst=*/world - 1));
  if (rank == world - 1) {
    EMBER_RETURN_IF_ERROR(Expect("reduce", t, full({4}, world * (world - 1) / 2.0, kFloat32)));
  }

  Tensor mine = full({2}, rank * rank, kFloat32);
  outs.clear();
  if (rank == 0) {
    for (int p = 0; p < world; ++p) outs.push_back(zeros({2}));
  }
  EMBER_RETURN_IF_ERROR(gather(mine, outs, /*dst=*/0));
  for (int p = 0; p < static_cast<int>(outs.size()); ++p) {
    EMBER_RETURN_IF_ERROR(
        Expect(absl::StrCat("gather[", p, "]"), outs[p], full({2}, p * p, kFloat32)));
  }

  std::vector<Tensor> pieces;
  if (rank == 0) {
    for (int p = 0; p < world; ++p) pieces.push_back(full({2}, 5.0 + p, kFloat32));
  }
  Tensor out = zeros({2});
  EMBER_RETURN_IF_ERROR(scatter(out, pieces, /*src=*/0));
  EMBER_RETURN_IF_ERROR(Expect("scatter", out, full({2}, 5.0 + rank, kFloat32)));

  EMBER_RETURN_IF_ERROR(barrier());

  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  EMBER_ASSIGN_OR_RETURN(auto sent, isend(full({4}, rank, kFloat32), next, nullptr, /*tag=*/7));
  Tensor got = zeros({4});
  EMBER_RETURN_IF_ERROR(recv(got, prev, nullptr, /*tag=*/7).status());
  EMBER_RETURN_IF_ERROR(sent->wait());
  EMBER_RETURN_IF_ERROR(Expect("recv", got, full({4}, prev, kFloat32)));

  EMBER_ASSIGN_OR_RETURN(Group pair, new_group({0, 1}));
  if (rank <= 1) {
    t = full({2}, rank + 1.0, kFloat32);
    EMBER_RETURN_IF_ERROR(all_reduce(t, ReduceOp::kSum, pair));
    EMBER_RETURN_IF_ERROR(Expect("all_reduce in new_group({0, 1})", t, full({2}, 3.0, kFloat32)));
  }
  return barrier();
}

// Which PyTorch the PyTorch ranks run, and how every rank finds the store.
enum class Peer { kTorch1, kTorch2 };
enum class Rendezvous { kFileStore, kEnv };

// Runs a job of `world` ranks, `torch_ranks` of them PyTorch processes.
// `init_barrier`: every rank runs with TORCH_DIST_INIT_BARRIER=1, so the
// store barriers after init_process_group and new_group wait on both sides.
void RunMixedJob(int world, const std::set<int>& torch_ranks, Peer peer = Peer::kTorch1,
                 Rendezvous rendezvous = Rendezvous::kFileStore, bool init_barrier = false) {
  std::string python = "/usr/bin/python3";
  if (peer == Peer::kTorch2) {
    absl::StatusOr<std::string> p = ember::testing::torch2_python();
    if (!p.ok()) GTEST_SKIP() << p.status().message();
    python = *p;
  } else if (!HaveTorch()) {
    GTEST_SKIP() << "python3-torch is not installed; no PyTorch rank can join";
  }
  const std::string port = std::to_string(FreePort());
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      world,
      [&](Rank& me) -> absl::Status {
        const std::string store_path = me.temp_dir + "/store";
        if (init_barrier) setenv("TORCH_DIST_INIT_BARRIER", "1", 1);
        if (rendezvous == Rendezvous::kEnv) {
          setenv("MASTER_ADDR", "127.0.0.1", 1);
          setenv("MASTER_PORT", port.c_str(), 1);
        }
        if (torch_ranks.contains(me.rank)) {
          const std::string rank = std::to_string(me.rank), size = std::to_string(world);
          const std::string where = rendezvous == Rendezvous::kEnv ? "env" : store_path;
          // argv[0] is the interpreter's path, so that a virtual environment's
          // python finds its own site-packages.
          execl(python.c_str(), python.c_str(), kTorchRank, where.c_str(), rank.c_str(), size.c_str(),
                static_cast<char*>(nullptr));
          return absl::InternalError(absl::StrCat("exec of ", python, " failed: ", strerror(errno)));
        }
        if (rendezvous == Rendezvous::kEnv) {
          EMBER_RETURN_IF_ERROR(init_process_group({.backend = "gloo",
                                                    .init_method = "env://",
                                                    .world_size = world,
                                                    .rank = me.rank,
                                                    .timeout = absl::Seconds(60)}));
        } else {
          EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store,
                                 FileStore::open(store_path, absl::Seconds(60)));
          EMBER_RETURN_IF_ERROR(init_process_group({.backend = "gloo",
                                                    .world_size = world,
                                                    .rank = me.rank,
                                                    .timeout = absl::Seconds(60),
                                                    .store = store}));
        }
        EMBER_RETURN_IF_ERROR(RunEmberRank(me.rank, world));
        return destroy_process_group();
      },
      options, absl::Seconds(150));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << (torch_ranks.contains(r) ? "PyTorch" : "Ember")
                                       << " rank " << r << ": " << results[r].output;
  }
}

TEST(TorchInteropTest, PyTorchRankZeroAndAnEmberRank) { RunMixedJob(2, {0}); }

TEST(TorchInteropTest, EmberRanksZeroAndTwoAroundAPyTorchRank) { RunMixedJob(3, {1}); }

// The same with PyTorch 2.15 ranks, over the FileStore and over env://
// with Ember (rank 0) or PyTorch (rank 0) hosting the TCPStore. PyTorch 2.15
// links a newer gloo than Debian's libgloo, which meets its peers in another
// dialect (Note [Two gloo dialects] in mesh.cc); over env:// its ranks count
// themselves in at the TCPStore's "init/" only (Note [Rendezvous protocol]
// in rendezvous.cc) and run no store barrier after init unless
// TORCH_DIST_INIT_BARRIER=1.
TEST(TorchInteropTest, Torch2RankZeroAndAnEmberRank) {
  RunMixedJob(2, {0}, Peer::kTorch2);
}

TEST(TorchInteropTest, Torch2EmberRanksZeroAndTwoAroundAPyTorchRank) {
  RunMixedJob(3, {1}, Peer::kTorch2);
}

TEST(TorchInteropTest, Torch2OverEmbersTcpStore) {
  RunMixedJob(3, {1, 2}, Peer::kTorch2, Rendezvous::kEnv);
}

TEST(TorchInteropTest, Torch2OverPyTorchsTcpStore) {
  RunMixedJob(3, {0, 2}, Peer::kTorch2, Rendezvous::kEnv);
}

// With TORCH_DIST_INIT_BARRIER=1 PyTorch 2.15 ranks wait at their own
// barrier keys, which Ember's ranks count in at too.
TEST(TorchInteropTest, Torch2WithInitBarrier) {
  RunMixedJob(3, {1}, Peer::kTorch2, Rendezvous::kFileStore, /*init_barrier=*/true);
}

TEST(TorchInteropTest, Torch1WithInitBarrier) {
  RunMixedJob(3, {1}, Peer::kTorch1, Rendezvous::kFileStore, /*init_barrier=*/true);
}

}  // namespace
}  // namespace ember::distributed::gloo
