#include "distributed/tcp/process_group_tcp.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/testing.h"

namespace ember::distributed::tcp {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::ember::distributed::testing::RunRanksEach;
using ::ember::testing::Values;
using ::testing::HasSubstr;

Tensor Make(const std::vector<double>& values, int64_t n, Dtype dtype) {
  Tensor t = empty({n}, TensorOptions(dtype));
  VisitDtype(dtype, [&]<typename T>() {
    T* p = static_cast<T*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = CastTo<T>(values[i]);
  });
  return t;
}

// A small value that every dtype holds exactly: 1, 2 or 3 (0/1 for bool).
double Value(int rank, int64_t i, Dtype dtype) {
  if (dtype == kBool) return (rank + i) % 2;
  return 1 + (rank + i) % 3;
}

Tensor Input(int rank, int64_t n, Dtype dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, i, dtype);
  return Make(v, n, dtype);
}

// What op gives for element i over `world` ranks, computed here in double.
double Expected(ReduceOp op, int world, int64_t i, Dtype dtype) {
  double acc = Value(0, i, dtype);
  for (int r = 1; r < world; ++r) {
    double v = Value(r, i, dtype);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (dtype == kBool) return acc != 0;
  if (op == ReduceOp::kAvg) acc /= world;
  return acc;
}

class TcpWorldTest : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(WorldSizes, TcpWorldTest, ::testing::Values(1, 2, 3, 4));

TEST_P(TcpWorldTest, AllReduceEveryDtypeAndOp) {
  const int world = GetParam();
  const int64_t n = 37;  // not a multiple of the world size: uneven segments
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    for (Dtype dtype : kAllDtypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kAvg}) {
        if (op == ReduceOp::kAvg && !is_floating_point(dtype)) continue;
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
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

// Large all_reduce, in the shared-memory arena and (EMBER_TCP_ARENA=0) as a
// ring: several chunks and a partial one, a length that no world size
// divides, every dtype and op, every element checked.
TEST_P(TcpWorldTest, LargeAllReduceEveryDtypeAndOpInBothAlgorithms) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "a group of one has no algorithm";
  const int64_t n = 3 * 65536 + 7;
  for (const char* arena : {"1", "0"}) {
    ScopedEnv env("EMBER_TCP_ARENA", arena);
    const std::string algorithm = std::string(arena) == "1" ? "arena" : "ring";
    absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
      auto* tcp = dynamic_cast<TcpProcessGroup*>(me.group.get());
      EXPECT_EQ(tcp->AllReduceAlgorithm(n), algorithm);
      for (Dtype dtype : kAllDtypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                            ReduceOp::kMax, ReduceOp::kAvg}) {
          if (op == ReduceOp::kAvg && !is_floating_point(dtype)) continue;
          Tensor t = Input(me.rank, n, dtype);
          EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t, {.op = op})));
          std::vector<double> got = Values(t);
          int64_t wrong = 0, first = -1;
          for (int64_t i = 0; i < n; ++i) {
            double want = Expected(op, world, i, dtype);
            double tol = op == ReduceOp::kAvg ? 1e-2 * std::abs(want) : 0;
            if (std::abs(got[i] - want) > tol && wrong++ == 0) first = i;
          }
          EXPECT_EQ(wrong, 0) << algorithm << " " << dtype_name(dtype) << " "
                              << reduce_op_name(op) << " rank " << me.rank
                              << ", first wrong element " << first;
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << algorithm << ": " << s;
  }
}

void ExpectTheSameBitsOnEveryRank(int world, const char* arena);

TEST_P(TcpWorldTest, AllReduceGivesTheSameBitsOnEveryRank) {
  for (const char* arena : {"1", "0"}) ExpectTheSameBitsOnEveryRank(GetParam(), arena);
}

void ExpectTheSameBitsOnEveryRank(int world, const char* arena) {
  ScopedEnv env("EMBER_TCP_ARENA", arena);
  SCOPED_TRACE(absl::StrCat("EMBER_TCP_ARENA=", arena));
  const int64_t n = (1 << 18) + 5;
  std::vector<std::vector<float>> results(world);
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    Generator gen(100 + me.rank);
    Tensor t = randn({n}, kFloat32, &gen);
    Tensor copy = t.clone();
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
    const float* p = t.data_ptr<float>();
    results[me.rank].assign(p, p + n);
    // Again, on the same input: the same bits.
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(copy)));
    EXPECT_EQ(std::memcmp(copy.raw_data(), t.raw_data(), t.nbytes()), 0);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), n * sizeof(float)), 0)
        << "rank " << r << " differs from rank 0";
  }
  // And the sum is right (to rounding).
  std::vector<double> want(n, 0.0);
  for (int r = 0; r < world; ++r) {
    Generator gen(100 + r);
    std::vector<double> v = Values(randn({n}, kFloat32, &gen));
    for (int64_t i = 0; i < n; ++i) want[i] += v[i];
  }
  for (int64_t i = 0; i < n; i += 997) EXPECT_NEAR(results[0][i], want[i], 1e-4);
}

TEST_P(TcpWorldTest, BroadcastEveryDtype) {
  const int world = GetParam();
  const int root = world - 1;
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    for (Dtype dtype : kAllDtypes) {
      Tensor t = me.rank == root ? Input(root, 19, dtype) : zeros({19}, dtype);
      EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(t, {.root = root})));
      EXPECT_EQ(Values(t), Values(Input(root, 19, dtype))) << dtype_name(dtype);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TcpWorldTest, ReduceLandsOnTheRootOnly) {
  const int world = GetParam();
  const int root = 1 % world;
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
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
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TcpWorldTest, AllGatherGatherAndScatter) {
  const int world = GetParam();
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
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
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TcpWorldTest, ReduceScatterAndAllToAll) {
  const int world = GetParam();
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    for (Dtype dtype : {kFloat32, kFloat64, kInt32, kBFloat16, kInt8}) {
      // inputs[j] on rank r holds Input(r + j, ...).
      std::vector<Tensor> inputs;
      for (int j = 0; j < world; ++j) inputs.push_back(Input(me.rank + j, 7, dtype));
      Tensor out = zeros({7}, dtype);
      EMBER_RETURN_IF_ERROR(Finish(me.group->reduce_scatter(out, inputs, {.op = ReduceOp::kMax})));
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
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TcpWorldTest, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  std::atomic<int> arrived{0};
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    for (int round = 1; round <= 3; ++round) {
      absl::SleepFor(absl::Milliseconds(me.rank * 20));
      arrived.fetch_add(1);
      EMBER_RETURN_IF_ERROR(Finish(me.group->barrier()));
      EXPECT_GE(arrived.load(), world * round);
      EMBER_RETURN_IF_ERROR(Finish(me.group->monitored_barrier()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TcpWorldTest, NonContiguousTensors) {
  const int world = GetParam();
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    // A transposed 3x4 view: every op stages it and writes back through it.
    Tensor base = Input(me.rank, 12, kFloat64).view({3, 4});
    Tensor view = base.t();
    EXPECT_FALSE(view.is_contiguous());
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(view)));
    std::vector<double> got = Values(base);
    for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(got[i], Expected(ReduceOp::kSum, world, i, kFloat64));

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
    for (int r = 0; r < world; ++r) EXPECT_EQ(Values(grid.select(1, r)), Values(Input(r, 2, kInt16)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TcpWorldTest, SendRecvWithTagsAndAnySource) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  absl::Status s = RunRanks(world, [&](Rank& me) -> absl::Status {
    const int next = (me.rank + 1) % world, prev = (me.rank - 1 + world) % world;
    // Two messages to the next rank; it receives them in the opposite tag order.
    EMBER_ASSIGN_OR_RETURN(auto a, me.group->send(full({3}, 100 + me.rank, kInt64), next, {.tag = 1}));
    EMBER_ASSIGN_OR_RETURN(auto b, me.group->send(full({3}, 200 + me.rank, kInt64), next, {.tag = 2}));
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
      EMBER_RETURN_IF_ERROR(Finish(me.group->send(full({2}, me.rank, kFloat32), 0, {.tag = 7})));
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
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(TcpProcessGroupTest, MismatchedSizesFailInsteadOfHanging) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results = RunRanksEach(3, [](Rank& me) -> absl::Status {
    Tensor t = ones({me.rank == 1 ? 8 : 4}, kFloat32);
    return Finish(me.group->allreduce(t));
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the group timeout is 20 s";
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("all_reduce")) << results[r];
  }
  EXPECT_THAT(results[0].ToString() + results[1].ToString() + results[2].ToString(),
              HasSubstr("same size"));
}

TEST(TcpProcessGroupTest, MismatchedOpsFail) {
  std::vector<absl::Status> results = RunRanksEach(2, [](Rank& me) -> absl::Status {
    Tensor t = ones({4}, kFloat32);
    if (me.rank == 0) return Finish(me.group->allreduce(t));
    return Finish(me.group->broadcast(t, {.root = 1}));
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kFailedPrecondition) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("broadcast"));
}

// Rank 0's all_reduce of `numel` floats when rank 1 never joins it (group
// timeout 600 ms); it must fail within 1.5 s.
absl::Status AllReduceWithoutRank1(int64_t numel) {
  ::ember::distributed::testing::RunRanksOptions options;
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

TEST(TcpProcessGroupTest, TimeoutNamesTheMissingPeerAndTheOp) {
  absl::Status s = AllReduceWithoutRank1(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
}

TEST(TcpProcessGroupTest, MonitoredBarrierNamesTheRanksThatDidNotArrive) {
  std::vector<absl::Status> results = RunRanksEach(4, [](Rank& me) -> absl::Status {
    if (me.rank == 1 || me.rank == 3) {
      absl::SleepFor(absl::Seconds(1));
      return absl::OkStatus();
    }
    return Finish(me.group->monitored_barrier(
        {.timeout = absl::Milliseconds(300), .wait_all_ranks = true}));
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("ranks 1, 3 failed to pass monitoredBarrier"));
  EXPECT_FALSE(results[2].ok());
}

TEST(TcpProcessGroupTest, AbortWakesWaiters) {
  std::vector<absl::Status> results = RunRanksEach(2, [](Rank& me) -> absl::Status {
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
  });
  EXPECT_EQ(results[1].code(), absl::StatusCode::kAborted) << results[1];
}

TEST(TcpProcessGroupTest, SocketsWhenSharedMemoryIsOff) {
  ScopedEnv sockets("EMBER_TCP_SHM", "0");
  absl::Status s = RunRanks(3, [](Rank& me) -> absl::Status {
    auto* tcp = dynamic_cast<TcpProcessGroup*>(me.group.get());
    EXPECT_NE(tcp, nullptr);
    for (int p = 0; p < 3; ++p) {
      if (p != me.rank) {
        EXPECT_THAT(tcp->TransportTo(p), HasSubstr("tcp "));
      }
    }
    EXPECT_EQ(tcp->AllReduceAlgorithm(400000), "ring");
    Tensor t = Input(me.rank, 100000, kFloat32);
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
    std::vector<double> got = Values(t);
    for (int64_t i = 0; i < 100000; i += 101) EXPECT_EQ(got[i], Expected(ReduceOp::kSum, 3, i, kFloat32));
    Tensor b = me.rank == 2 ? arange(1 << 20, kInt32) : zeros({1 << 20}, kInt32);
    EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(b, {.root = 2})));
    EXPECT_TRUE(b.equal(arange(1 << 20, kInt32)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(TcpProcessGroupTest, SharedMemoryBetweenRanksOnOneHost) {
  absl::Status s = RunRanks(2, [](Rank& me) -> absl::Status {
    auto* tcp = dynamic_cast<TcpProcessGroup*>(me.group.get());
    // Ranks that are threads of one process keep to the rings.
    EXPECT_EQ(tcp->TransportTo(1 - me.rank), "shared memory");
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(TcpProcessGroupTest, LargeMessagesThroughTheRingsWhenDirectReadsAreOff) {
  ScopedEnv no_direct_reads("EMBER_TCP_DIRECT", "0");
  ScopedEnv ring("EMBER_TCP_ARENA", "0");
  absl::Status s = RunRanks(3, [](Rank& me) -> absl::Status {
    auto* tcp = dynamic_cast<TcpProcessGroup*>(me.group.get());
    EXPECT_EQ(tcp->TransportTo((me.rank + 1) % 3), "shared memory");
    EXPECT_EQ(tcp->AllReduceAlgorithm(12 << 20), "ring");
    Tensor t = Input(me.rank, 3 << 20, kFloat32);  // 12 MiB: several times the ring
    EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
    std::vector<double> got = Values(t);
    for (int64_t i = 0; i < (3 << 20); i += 4099) {
      EXPECT_EQ(got[i], Expected(ReduceOp::kSum, 3, i, kFloat32));
    }
    Tensor b = me.rank == 0 ? arange(1 << 22, kInt32) : zeros({1 << 22}, kInt32);
    EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(b, {.root = 0})));
    EXPECT_TRUE(b.equal(arange(1 << 22, kInt32)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The arena compares every rank's announcement before the first chunk: a
// size mismatch fails at once on every rank, naming both calls, and the
// group goes on with ring all_reduce afterwards.
TEST(TcpArenaTest, MismatchedSizesFailAtOnceAndTheGroupGoesOn) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> later(3);
  std::vector<absl::Status> results = RunRanksEach(3, [&](Rank& me) -> absl::Status {
    auto* tcp = dynamic_cast<TcpProcessGroup*>(me.group.get());
    EXPECT_EQ(tcp->AllReduceAlgorithm(4 << 20), "arena");
    Tensor t = ones({me.rank == 1 ? 2 << 20 : 1 << 20}, kFloat32);
    absl::Status s = Finish(me.group->allreduce(t));
    // Afterwards the same all_reduce everywhere works, as a ring.
    later[me.rank] = [&]() -> absl::Status {
      Tensor u = Input(me.rank, 1 << 20, kFloat32);
      EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(u)));
      EXPECT_EQ(tcp->AllReduceAlgorithm(4 << 20), "ring");
      std::vector<double> got = Values(u);
      for (int64_t i = 0; i < (1 << 20); i += 1009) {
        EXPECT_EQ(got[i], Expected(ReduceOp::kSum, 3, i, kFloat32)) << i;
      }
      return absl::OkStatus();
    }();
    return s;
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the group timeout is 20 s";
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_TRUE(later[r].ok()) << "rank " << r << ": " << later[r];
  }
  const std::string all =
      results[0].ToString() + results[1].ToString() + results[2].ToString();
  EXPECT_THAT(all, HasSubstr("mismatched collectives"));
  EXPECT_THAT(all, HasSubstr("8388608 bytes of float32"));
  EXPECT_THAT(all, HasSubstr("4194304 bytes of float32"));
}

TEST(TcpArenaTest, ALargeAllReduceAgainstASmallOneFails) {
  std::vector<absl::Status> results = RunRanksEach(2, [](Rank& me) -> absl::Status {
    Tensor t = ones({me.rank == 0 ? 1 << 20 : 4}, kFloat32);
    return Finish(me.group->allreduce(t));
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kFailedPrecondition) << results[0];
  EXPECT_THAT(std::string(results[0].message()), HasSubstr("16 bytes of float32"));
  EXPECT_FALSE(results[1].ok());
}

TEST(TcpArenaTest, TimeoutNamesTheRankThatNeverJoined) {
  absl::Status s = AllReduceWithoutRank1(1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("all_reduce (collective #0): timed out waiting for rank 1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("join"));
}

TEST(TcpArenaTest, AbortWakesALargeAllReduce) {
  std::vector<absl::Status> results = RunRanksEach(2, [](Rank& me) -> absl::Status {
    if (me.rank == 0) {
      absl::SleepFor(absl::Milliseconds(800));
      return absl::OkStatus();
    }
    Tensor t = ones({1 << 20}, kFloat32);
    EMBER_ASSIGN_OR_RETURN(auto coll, me.group->allreduce(t));
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(100));
      me.group->abort();
    });
    const absl::Time start = absl::Now();
    absl::Status s = coll->wait();
    aborter.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    return s;
  });
  EXPECT_EQ(results[1].code(), absl::StatusCode::kAborted) << results[1];
}

TEST(TcpProcessGroupTest, CudaTensorsAreRejectedByTheSupportTable) {
  SupportTable table = TcpSupportTable();
  EXPECT_TRUE(table.supports(OpType::kAllToAll, DeviceType::kCPU));
  EXPECT_FALSE(table.supports(OpType::kAllReduce, DeviceType::kCUDA));
}

}  // namespace
}  // namespace ember::distributed::tcp
