#include "distributed/testing/process_group_suite.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/testing.h"

namespace ember::distributed::testing {

using ::ember::testing::Values;
using ::testing::HasSubstr;

Tensor MakeTensor(const std::vector<double>& values, int64_t n, Dtype dtype) {
  Tensor t = empty({n}, TensorOptions(dtype));
  VisitDtype(dtype, [&]<typename T>() {
    T* p = static_cast<T*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = CastTo<T>(values[i]);
  });
  return t;
}

double Value(int rank, int64_t i, Dtype dtype) {
  if (dtype == kBool) return (rank + i) % 2;
  return 1 + (rank + i) % 3;
}

Tensor Input(int rank, int64_t n, Dtype dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, i, dtype);
  return MakeTensor(v, n, dtype);
}

double Expected(ReduceOp op, int world, int64_t i, Dtype dtype) {
  double acc = Value(0, i, dtype);
  for (int r = 1; r < world; ++r) {
    double v = Value(r, i, dtype);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (dtype == kBool) return acc != 0;
  if (op == ReduceOp::kAvg) acc /= world;
  return acc;
}

std::vector<SuiteParam> WorldSizes(const SuiteParam& backend) {
  std::vector<SuiteParam> params;
  for (int world = 1; world <= 4; ++world) {
    SuiteParam p = backend;
    p.world_size = world;
    params.push_back(p);
  }
  return params;
}

std::string SuiteParamName(const ::testing::TestParamInfo<SuiteParam>& info) {
  return absl::StrCat(info.param.backend, "_", info.param.world_size, "ranks");
}

// Binaries that use only the helpers (e.g. fault tests) instantiate neither.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ProcessGroupSuite);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ProcessGroupFailureSuite);

RunRanksOptions ProcessGroupSuite::Options() const {
  RunRanksOptions options;
  options.backend = GetParam().backend;
  return options;
}

RunRanksOptions ProcessGroupFailureSuite::Options() const {
  RunRanksOptions options;
  options.backend = GetParam();
  return options;
}

absl::Status AllReduceWithoutRank1(const std::string& backend, int64_t numel) {
  RunRanksOptions options;
  options.backend = backend;
  options.timeout = absl::Milliseconds(600);
  std::vector<absl::Status> results = RunRanksEach(
      2,
      [numel](Rank& me) -> absl::Status {
        if (me.rank == 1) {
          absl::SleepFor(absl::Seconds(2));  // never joins the all_reduce
          return absl::OkStatus();
        }
        const absl::Time start = absl::Now();
        Tensor t = ones({numel}, kFloat32);
        absl::Status s = Finish(me.group->allreduce(t));
        EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
        return s;
      },
      options);
  return results[0];
}

TEST_P(ProcessGroupSuite, AllReduceEveryDtypeAndOp) {
  const int world = GetParam().world_size;
  const int64_t n = 37;  // not a multiple of the world size: uneven segments
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        for (Dtype dtype : kAllDtypes) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                              ReduceOp::kAvg}) {
            if (op == ReduceOp::kAvg && (!is_floating_point(dtype) || !GetParam().avg)) continue;
            Tensor t = Input(me.rank, n, dtype);
            EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t, {.op = op})));
            std::vector<double> got = Values(t);
            for (int64_t i = 0; i < n; ++i) {
              double want = Expected(op, world, i, dtype);
              double tol = op == ReduceOp::kAvg ? 1e-2 * std::abs(want) : 0;
              EXPECT_NEAR(got[i], want, tol) << dtype_name(dtype) << " " << reduce_op_name(op)
                                             << " element " << i << " rank " << me.rank;
            }
          }
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, BroadcastEveryDtype) {
  const int world = GetParam().world_size;
  const int root = world - 1;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        for (Dtype dtype : kAllDtypes) {
          Tensor t = me.rank == root ? Input(root, 19, dtype) : zeros({19}, dtype);
          EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(t, {.root = root})));
          EXPECT_EQ(Values(t), Values(Input(root, 19, dtype))) << dtype_name(dtype);
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, ReduceLandsOnTheRootOnly) {
  const int world = GetParam().world_size;
  const int root = 1 % world;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        for (Dtype dtype : {kFloat32, kInt64, kFloat16, kUInt8}) {
          Tensor t = Input(me.rank, 23, dtype);
          EMBER_RETURN_IF_ERROR(Finish(me.group->reduce(t, {.root = root, .op = ReduceOp::kSum})));
          std::vector<double> got = Values(t);
          for (int64_t i = 0; i < 23; ++i) {
            double want = me.rank == root ? Expected(ReduceOp::kSum, world, i, dtype)
                                          : Value(me.rank, i, dtype);
            EXPECT_EQ(got[i], want) << dtype_name(dtype) << " rank " << me.rank;
          }
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, AllGatherGatherAndScatter) {
  const int world = GetParam().world_size;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        for (Dtype dtype : kAllDtypes) {
          Tensor in = Input(me.rank, 5, dtype);
          std::vector<Tensor> outs;
          for (int r = 0; r < world; ++r) outs.push_back(zeros({5}, dtype));
          EMBER_RETURN_IF_ERROR(Finish(me.group->allgather(outs, in)));
          for (int r = 0; r < world; ++r) EXPECT_EQ(Values(outs[r]), Values(Input(r, 5, dtype)));

          Tensor flat = zeros({world * 5}, dtype);
          EMBER_RETURN_IF_ERROR(Finish(me.group->allgather_into_tensor(flat, in)));
          for (int r = 0; r < world; ++r) {
            EXPECT_EQ(Values(flat.narrow(0, r * 5, 5)), Values(Input(r, 5, dtype)));
          }

          const int root = world / 2;
          std::vector<Tensor> gathered;
          if (me.rank == root) {
            for (int r = 0; r < world; ++r) gathered.push_back(zeros({5}, dtype));
          }
          EMBER_RETURN_IF_ERROR(Finish(me.group->gather(gathered, in, {.root = root})));
          for (size_t r = 0; r < gathered.size(); ++r) {
            EXPECT_EQ(Values(gathered[r]), Values(Input(r, 5, dtype)));
          }

          std::vector<Tensor> pieces;
          if (me.rank == root) {
            for (int r = 0; r < world; ++r) pieces.push_back(Input(r + 10, 5, dtype));
          }
          Tensor mine = zeros({5}, dtype);
          EMBER_RETURN_IF_ERROR(Finish(me.group->scatter(mine, pieces, {.root = root})));
          EXPECT_EQ(Values(mine), Values(Input(me.rank + 10, 5, dtype)));
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

// torch's Work.result() and Work.synchronize(): the tensors an op wrote,
// the very ones passed in (same storage), and a wait on CPU.
TEST_P(ProcessGroupSuite, WorkResultIsWhatTheOpWrote) {
  const int world = GetParam().world_size;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        Tensor t = Input(me.rank, 3, kFloat32);
        EMBER_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, me.group->allreduce(t));
        EMBER_RETURN_IF_ERROR(work->synchronize());
        EXPECT_EQ(work->result().size(), 1u);
        if (work->result().size() == 1) {
          EXPECT_TRUE(work->result()[0].is_same(t));
        }
        std::vector<Tensor> outs;
        for (int r = 0; r < world; ++r) outs.push_back(zeros({3}));
        EMBER_ASSIGN_OR_RETURN(work, me.group->allgather(outs, Input(me.rank, 3, kFloat32)));
        EMBER_RETURN_IF_ERROR(work->wait());
        EXPECT_EQ(work->result().size(), static_cast<size_t>(world));
        for (size_t r = 0; r < work->result().size(); ++r) {
          EXPECT_TRUE(work->result()[r].is_same(outs[r]));
          EXPECT_EQ(Values(work->result()[r]), Values(Input(r, 3, kFloat32)));
        }
        EMBER_ASSIGN_OR_RETURN(work, me.group->barrier());
        EMBER_RETURN_IF_ERROR(work->wait());
        EXPECT_TRUE(work->result().empty());
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, ReduceScatterAndAllToAll) {
  const int world = GetParam().world_size;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        for (Dtype dtype : {kFloat32, kFloat64, kInt32, kBFloat16, kInt8}) {
          // inputs[j] on rank r holds Input(r + j, ...).
          std::vector<Tensor> inputs;
          for (int j = 0; j < world; ++j) inputs.push_back(Input(me.rank + j, 7, dtype));
          Tensor out = zeros({7}, dtype);
          EMBER_RETURN_IF_ERROR(
              Finish(me.group->reduce_scatter(out, inputs, {.op = ReduceOp::kMax})));
          std::vector<double> got = Values(out);
          for (int64_t i = 0; i < 7; ++i) {
            double want = 0;
            for (int r = 0; r < world; ++r) want = std::max(want, Value(r + me.rank, i, dtype));
            EXPECT_EQ(got[i], want) << dtype_name(dtype);
          }

          std::vector<Tensor> outputs;
          for (int j = 0; j < world; ++j) outputs.push_back(zeros({7}, dtype));
          EMBER_RETURN_IF_ERROR(Finish(me.group->alltoall(outputs, inputs)));
          // outputs[j] <- rank j's inputs[me] = Input(j + me).
          for (int j = 0; j < world; ++j) {
            EXPECT_EQ(Values(outputs[j]), Values(Input(j + me.rank, 7, dtype)));
          }
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, BarrierWaitsForEveryRank) {
  const int world = GetParam().world_size;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        // Counted in the store, which the ranks share whether they are
        // threads or the processes of a launched job.
        const bool monitored =
            me.group->support().supports(OpType::kMonitoredBarrier, DeviceType::kCPU);
        for (int round = 1; round <= 3; ++round) {
          absl::SleepFor(absl::Milliseconds(me.rank * 20));
          EMBER_RETURN_IF_ERROR(me.store->add("barrier/arrived", 1).status());
          EMBER_RETURN_IF_ERROR(Finish(me.group->barrier()));
          EMBER_ASSIGN_OR_RETURN(int64_t arrived, me.store->add("barrier/arrived", 0));
          EXPECT_GE(arrived, world * round);
          if (monitored) EMBER_RETURN_IF_ERROR(Finish(me.group->monitored_barrier()));
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, NonContiguousTensors) {
  const int world = GetParam().world_size;
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        // A transposed 3x4 view: every op stages it and writes back through it.
        Tensor base = Input(me.rank, 12, kFloat64).view({3, 4});
        Tensor view = base.t();
        EXPECT_FALSE(view.is_contiguous());
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(view)));
        std::vector<double> got = Values(base);
        for (int64_t i = 0; i < 12; ++i)
          EXPECT_EQ(got[i], Expected(ReduceOp::kSum, world, i, kFloat64));

        // Broadcast into every other element of a buffer.
        Tensor buf = zeros({10}, kInt32);
        Tensor strided = buf.slice(0, 0, 10, 2);
        if (me.rank == 0) strided.copy_(Input(0, 5, kInt32));
        EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(strided, {.root = 0})));
        EXPECT_EQ(Values(strided), Values(Input(0, 5, kInt32)));
        EXPECT_EQ(Values(buf.slice(0, 1, 10, 2)), std::vector<double>(5, 0.0));

        // all_gather into strided outputs.
        std::vector<Tensor> outs;
        Tensor grid = zeros({2, world}, kInt16);
        for (int r = 0; r < world; ++r) outs.push_back(grid.select(1, r));
        EMBER_RETURN_IF_ERROR(Finish(me.group->allgather(outs, Input(me.rank, 2, kInt16))));
        for (int r = 0; r < world; ++r)
          EXPECT_EQ(Values(grid.select(1, r)), Values(Input(r, 2, kInt16)));
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupSuite, SendRecvWithTagsAndAnySource) {
  const int world = GetParam().world_size;
  if (world == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        const int next = (me.rank + 1) % world, prev = (me.rank - 1 + world) % world;
        // Two messages to the next rank; it receives them in the opposite tag order.
        EMBER_ASSIGN_OR_RETURN(auto a,
                               me.group->send(full({3}, 100 + me.rank, kInt64), next, {.tag = 1}));
        EMBER_ASSIGN_OR_RETURN(auto b,
                               me.group->send(full({3}, 200 + me.rank, kInt64), next, {.tag = 2}));
        Tensor second = zeros({3}, kInt64), first = zeros({3}, kInt64);
        EMBER_ASSIGN_OR_RETURN(auto r2, me.group->recv(second, prev, {.tag = 2}));
        EMBER_ASSIGN_OR_RETURN(auto r1, me.group->recv(first, prev, {.tag = 1}));
        EMBER_RETURN_IF_ERROR(r2->wait());
        EMBER_RETURN_IF_ERROR(r1->wait());
        EMBER_RETURN_IF_ERROR(a->wait());
        EMBER_RETURN_IF_ERROR(b->wait());
        EXPECT_EQ(Values(first), std::vector<double>(3, 100 + prev));
        EXPECT_EQ(Values(second), std::vector<double>(3, 200 + prev));
        EXPECT_EQ(r1->source(), prev);

        // Everyone sends to rank 0, which receives from any source.
        if (me.rank != 0) {
          EMBER_RETURN_IF_ERROR(
              Finish(me.group->send(full({2}, me.rank, kFloat32), 0, {.tag = 7})));
        } else {
          std::set<int> sources;
          for (int i = 1; i < world; ++i) {
            Tensor t = zeros({2}, kFloat32);
            EMBER_ASSIGN_OR_RETURN(auto w, me.group->recv(t, kAnySource, {.tag = 7}));
            EMBER_RETURN_IF_ERROR(w->wait());
            EXPECT_EQ(Values(t), std::vector<double>(2, w->source()));
            sources.insert(w->source());
          }
          EXPECT_EQ(sources.size(), static_cast<size_t>(world - 1));
        }
        // A large message, into a non-contiguous receiver.
        Tensor big = arange(3 << 20, kFloat32);
        if (me.rank == 0) {
          EMBER_RETURN_IF_ERROR(Finish(me.group->send(big, world - 1, {.tag = 9})));
        } else if (me.rank == world - 1) {
          Tensor grid = zeros({3 << 10, 1 << 10}, kFloat32);
          Tensor into = grid.t();
          EMBER_ASSIGN_OR_RETURN(auto w, me.group->recv(into, 0, {.tag = 9}));
          EMBER_RETURN_IF_ERROR(w->wait());
          EXPECT_TRUE(into.equal(big.view({1 << 10, 3 << 10})));
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

// batch_p2p: every rank sends to and receives from every other in one
// batch, even ranks listing their receives first and odd ranks their sends
// (a batch pairs them whatever the order); one receiver is not contiguous.
// A batch with an op that is not a send or receive, or an empty one, is
// refused before anything is issued.
TEST_P(ProcessGroupSuite, BatchP2PPairsSendsAndReceivesInAnyOrder) {
  const int world = GetParam().world_size;
  if (world == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  absl::Status s = RunRanks(
      world,
      [&](Rank& me) -> absl::Status {
        std::vector<Tensor> outs(world), ins(world);
        std::vector<P2PRequest> sends, recvs;
        for (int peer = 0; peer < world; ++peer) {
          if (peer == me.rank) continue;
          outs[peer] = full({4}, 100 * me.rank + peer, kInt64);
          ins[peer] = peer == 0 ? zeros({4, 2}, kInt64).select(1, 1) : zeros({4}, kInt64);
          sends.push_back({.op = OpType::kSend, .tensor = outs[peer], .peer = peer,
                           .options = {.tag = 3}});
          recvs.push_back({.op = OpType::kRecv, .tensor = ins[peer], .peer = peer,
                           .options = {.tag = 3}});
        }
        std::vector<P2PRequest> ops = me.rank % 2 == 0 ? recvs : sends;
        for (const P2PRequest& op : me.rank % 2 == 0 ? sends : recvs) ops.push_back(op);

        Tensor t = zeros({4}, kInt64);
        absl::StatusOr<std::vector<std::shared_ptr<Work>>> bad =
            me.group->batch_p2p(std::vector<P2PRequest>{
                ops[0], {.op = OpType::kBroadcast, .tensor = t, .peer = 0}});
        EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(bad.status().message()),
                    HasSubstr("op 1 is broadcast; only isend and irecv may be batched"));
        EXPECT_EQ(me.group->batch_p2p({}).status().code(), absl::StatusCode::kInvalidArgument);

        EMBER_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Work>> works, me.group->batch_p2p(ops));
        EXPECT_EQ(works.size(), ops.size());
        for (const auto& w : works) EMBER_RETURN_IF_ERROR(w->wait());
        for (int peer = 0; peer < world; ++peer) {
          if (peer == me.rank) continue;
          EXPECT_EQ(Values(ins[peer]), std::vector<double>(4, 100 * peer + me.rank))
              << "from rank " << peer;
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupFailureSuite, TimeoutNamesTheMissingPeerAndTheOp) {
  absl::Status s = AllReduceWithoutRank1(GetParam(), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
}

TEST_P(ProcessGroupFailureSuite, MonitoredBarrierNamesTheRanksThatDidNotArrive) {
  std::vector<absl::Status> results = RunRanksEach(
      4,
      [](Rank& me) -> absl::Status {
        if (me.rank == 1 || me.rank == 3) {
          absl::SleepFor(absl::Seconds(1));
          return absl::OkStatus();
        }
        return Finish(me.group->monitored_barrier(
            {.timeout = absl::Milliseconds(300), .wait_all_ranks = true}));
      },
      Options());
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("ranks 1, 3 failed to pass monitoredBarrier"));
  EXPECT_FALSE(results[2].ok());
}

TEST_P(ProcessGroupFailureSuite, AbortWakesWaiters) {
  std::vector<absl::Status> results = RunRanksEach(
      2,
      [](Rank& me) -> absl::Status {
        if (me.rank == 0) {
          absl::SleepFor(absl::Milliseconds(800));
          return absl::OkStatus();
        }
        Tensor t = zeros({4}, kFloat32);
        EMBER_ASSIGN_OR_RETURN(auto recv, me.group->recv(t, 0));
        EMBER_ASSIGN_OR_RETURN(auto coll, me.group->allreduce(t));
        std::thread aborter([&] {
          absl::SleepFor(absl::Milliseconds(100));
          me.group->abort();
        });
        const absl::Time start = absl::Now();
        absl::Status a = recv->wait();
        absl::Status b = coll->wait();
        aborter.join();
        EXPECT_LT(absl::Now() - start, absl::Seconds(2));
        EXPECT_EQ(a.code(), absl::StatusCode::kAborted) << a;
        EXPECT_EQ(b.code(), absl::StatusCode::kAborted) << b;
        // Later ops fail at once too.
        return Finish(me.group->barrier());
      },
      Options());
  EXPECT_EQ(results[1].code(), absl::StatusCode::kAborted) << results[1];
}

void ExpectAllReduceAcrossProcesses(const std::string& backend) {
  RunRanksOptions options;
  options.backend = backend;
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [](Rank& me) -> absl::Status {
        Tensor t = full({4 << 20}, me.rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
        if (!t.equal(full({4 << 20}, 6, kFloat32))) return absl::InternalError("wrong sum");
        std::vector<Tensor> all = {zeros({1 << 18}), zeros({1 << 18}), zeros({1 << 18})};
        EMBER_RETURN_IF_ERROR(Finish(me.group->allgather(all, full({1 << 18}, me.rank, kFloat32))));
        for (int r = 0; r < 3; ++r) {
          if (!all[r].equal(full({1 << 18}, r, kFloat32))) return absl::InternalError("all_gather");
        }
        return absl::OkStatus();
      },
      options);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << backend << " rank " << r << ": " << results[r].output;
  }
}

void ExpectSurvivorsFail(const std::string& backend, int fault) {
  RunRanksOptions options;
  options.backend = backend;
  options.timeout = absl::Seconds(3);
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [fault](Rank& me) -> absl::Status {
        Tensor t = ones({4 << 20}, kFloat32);                   // 16 MiB: the op takes a while
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));  // everyone is up
        if (me.rank == 2) {
          // Inside its second all_reduce (which waits for the others) when
          // it is killed or stopped; the others join a moment later.
          EMBER_ASSIGN_OR_RETURN(auto work, me.group->allreduce(t));
          absl::SleepFor(absl::Milliseconds(50));
          if (work->is_completed()) return absl::InternalError("the all_reduce ended too soon");
          raise(fault);
          absl::SleepFor(absl::Seconds(30));
          return absl::InternalError("rank 2 survived its own signal");
        }
        absl::SleepFor(absl::Milliseconds(100));
        const absl::Time start = absl::Now();
        absl::Status s = Finish(me.group->allreduce(t));
        const absl::Duration took = absl::Now() - start;
        fprintf(stderr, "after %s: %s\n", absl::FormatDuration(took).c_str(), s.ToString().c_str());
        if (s.ok()) return absl::InternalError("all_reduce succeeded without rank 2");
        if (took > absl::Seconds(6)) return absl::InternalError("the error came too late");
        if (!absl::StrContains(s.message(), "rank 2") ||
            !absl::StrContains(s.message(), "all_reduce")) {
          return absl::InternalError("the error names neither the op nor rank 2");
        }
        return absl::OkStatus();
      },
      options, absl::Seconds(30));
  for (int r = 0; r < 2; ++r) {
    std::cerr << "rank " << r << " " << results[r].output;  // what the survivor saw
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
    EXPECT_THAT(results[r].output, HasSubstr("rank 2"));
  }
  EXPECT_EQ(results[2].signal, SIGKILL);  // by the signal, or by the runner after SIGSTOP
}

}  // namespace ember::distributed::testing
