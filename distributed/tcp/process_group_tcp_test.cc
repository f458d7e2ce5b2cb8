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
#include "distributed/testing/process_group_suite.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/testing.h"

namespace ember::distributed::tcp {
namespace {

using ::ember::distributed::testing::AllReduceWithoutRank1;
using ::ember::distributed::testing::Expected;
using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Input;
using ::ember::distributed::testing::ProcessGroupFailureSuite;
using ::ember::distributed::testing::ProcessGroupSuite;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::ember::distributed::testing::RunRanksEach;
using ::ember::testing::Values;
using ::testing::HasSubstr;

// The suite every backend runs (distributed/testing/process_group_suite.h).
INSTANTIATE_TEST_SUITE_P(Tcp, ProcessGroupSuite,
                         ::testing::ValuesIn(testing::WorldSizes({.backend = "tcp"})),
                         testing::SuiteParamName);
INSTANTIATE_TEST_SUITE_P(Tcp, ProcessGroupFailureSuite, ::testing::Values("tcp"));

// The tcp backend's own cases.
class TcpWorldTest : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(WorldSizes, TcpWorldTest, ::testing::Values(1, 2, 3, 4));

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
        for (ReduceOp op :
             {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
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
          EXPECT_EQ(wrong, 0) << algorithm << " " << dtype_name(dtype) << " " << reduce_op_name(op)
                              << " rank " << me.rank << ", first wrong element " << first;
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
    for (int64_t i = 0; i < 100000; i += 101)
      EXPECT_EQ(got[i], Expected(ReduceOp::kSum, 3, i, kFloat32));
    Tensor b = me.rank == 2 ? arange(1 << 20, kInt32) : zeros({1 << 20}, kInt32);
    EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(b, {.root = 2})));
    EXPECT_TRUE(b.equal(arange(1 << 20, kInt32)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The same choices as the environment variables, through pg_options (which
// win over the environment), and another backend's options refused.
TEST(TcpProcessGroupTest, PgOptionsChooseTheTransport) {
  auto tcp_options = std::make_shared<TcpOptions>();
  tcp_options->shared_memory = false;
  testing::RunRanksOptions options;
  options.pg_options = tcp_options;
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        auto* tcp = dynamic_cast<TcpProcessGroup*>(me.group.get());
        EXPECT_THAT(tcp->TransportTo(1 - me.rank), HasSubstr("tcp "));
        Tensor t = Input(me.rank, 1000, kFloat32);
        return Finish(me.group->allreduce(t));
      },
      options);
  EXPECT_TRUE(s.ok()) << s;

  struct NcclLikeOptions : BackendSpecificOptions {
    std::string_view backend() const override { return "nccl"; }
  };
  options.pg_options = std::make_shared<NcclLikeOptions>();
  s = RunRanks(
      1, [](Rank&) { return absl::OkStatus(); }, options);
  EXPECT_THAT(std::string(s.message()), HasSubstr("INVALID_ARGUMENT: pg_options are for the 'nccl' "
                                                  "backend, but the group's backend is 'tcp'"));
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
  // The call check's message (Note [Call checks] in process_group.cc).
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("mismatched collectives: all_reduce (collective #0): rank 1 ran "
                        "all_reduce of 8 MiB float32 (SUM) but this rank (0) ran all_reduce of "
                        "4 MiB float32 (SUM)"));
  EXPECT_THAT(std::string(results[1].message()),
              HasSubstr("rank 0 ran all_reduce of 4 MiB float32 (SUM) but this rank (1) ran "
                        "all_reduce of 8 MiB float32 (SUM)"));
}

TEST(TcpArenaTest, ALargeAllReduceAgainstASmallOneFails) {
  std::vector<absl::Status> results = RunRanksEach(2, [](Rank& me) -> absl::Status {
    Tensor t = ones({me.rank == 0 ? 1 << 20 : 4}, kFloat32);
    return Finish(me.group->allreduce(t));
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kFailedPrecondition) << results[0];
  EXPECT_THAT(std::string(results[0].message()),
              HasSubstr("rank 1 ran all_reduce of 16 B float32"));
  EXPECT_FALSE(results[1].ok());
}

TEST(TcpArenaTest, TimeoutNamesTheRankThatNeverJoined) {
  absl::Status s = AllReduceWithoutRank1("tcp", 1 << 20);
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
