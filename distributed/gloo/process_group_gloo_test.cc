// The gloo backend: the shared backend suite (every op, world sizes 1-4,
// failures, rank processes killed or stopped) and gloo's own cases.
#include "distributed/gloo/process_group_gloo.h"

#include <sched.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "distributed/backend_registry.h"
#include "distributed/gloo/device.h"
#include "distributed/gloo/staging.h"
#include "distributed/gloo/store_adapter.h"
#include "distributed/hash_store.h"
#include "distributed/testing/process_group_suite.h"
#include "distributed/testing/ranks.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"
#include "tensor/testing.h"

namespace ember::distributed::gloo {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Input;
using ::ember::distributed::testing::ProcessGroupFailureSuite;
using ::ember::distributed::testing::ProcessGroupSuite;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::ember::distributed::testing::RunRanksEach;
using ::ember::distributed::testing::RunRanksOptions;
using ::ember::testing::Values;
using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupSuite,
                         ::testing::ValuesIn(testing::WorldSizes({.backend = "gloo",
                                                                  .avg = false})),
                         testing::SuiteParamName);
INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupFailureSuite, ::testing::Values("gloo"));

RunRanksOptions Gloo() {
  RunRanksOptions options;
  options.backend = "gloo";
  return options;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(GlooBackendTest, IsRegisteredWithEveryOpOnCpuAndEveryTensorOpOnCuda) {
  absl::StatusOr<const BackendInfo*> info = find_backend("GLOO");
  ASSERT_TRUE(info.ok()) << info.status();
  for (int i = 0; i < kNumOpTypes; ++i) {
    const auto op = static_cast<OpType>(i);
    EXPECT_TRUE((*info)->support.supports(op, DeviceType::kCPU)) << op_type_name(op);
    // Through pinned host memory (staging.h); the barriers carry no tensor.
    EXPECT_EQ((*info)->support.supports(op, DeviceType::kCUDA),
              op != OpType::kBarrier && op != OpType::kMonitoredBarrier)
        << op_type_name(op);
  }
}

// CPU tensors are used as they are: no copy, no stream, nothing to wait for.
TEST(GlooStagingTest, CpuTensorsPassThrough) {
  DeviceStaging stage;
  Tensor a = ones({3}), b = zeros({2, 2});
  absl::StatusOr<Tensor> in = stage.Input(a);
  absl::StatusOr<Tensor> out = stage.InOut(b);
  ASSERT_TRUE(in.ok() && out.ok());
  EXPECT_TRUE(in->is_same(a));
  EXPECT_TRUE(out->is_same(b));
  absl::StatusOr<std::vector<Tensor>> list = stage.Outputs({a, b});
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE((*list)[0].is_same(a) && (*list)[1].is_same(b));
  EXPECT_FALSE(stage.active());
  EXPECT_TRUE(stage.WaitForInputs(absl::InfinitePast(), "all_reduce").ok());
  EXPECT_TRUE(stage.CopyBack().ok());
  EXPECT_TRUE(stage.BlockCurrentStream().ok());
}

TEST(GlooBackendTest, AvgIsRefusedAsInPyTorch) {
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        Tensor t = ones({4}, kFloat32);
        auto work = me.group->allreduce(t, {.op = ReduceOp::kAvg});
        EXPECT_EQ(work.status().code(), absl::StatusCode::kUnimplemented);
        EXPECT_THAT(std::string(work.status().message()), HasSubstr("use SUM and divide"));
        auto rs = me.group->reduce_scatter(t, {ones({4}), ones({4})}, {.op = ReduceOp::kAvg});
        EXPECT_EQ(rs.status().code(), absl::StatusCode::kUnimplemented);
        // The group is unharmed.
        return Finish(me.group->allreduce(t));
      },
      Gloo());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooBackendTest, AllToAllWithUnevenSizes) {
  absl::Status s = RunRanks(
      3,
      [](Rank& me) -> absl::Status {
        // Rank r sends j + 1 elements of value 10 r + j to rank j.
        std::vector<Tensor> inputs, outputs;
        for (int j = 0; j < 3; ++j) {
          inputs.push_back(full({j + 1}, 10 * me.rank + j, kInt64));
          outputs.push_back(zeros({me.rank + 1}, kInt64));
        }
        EMBER_RETURN_IF_ERROR(Finish(me.group->alltoall(outputs, inputs)));
        for (int j = 0; j < 3; ++j) {
          EXPECT_EQ(Values(outputs[j]), std::vector<double>(me.rank + 1, 10 * j + me.rank));
        }
        return absl::OkStatus();
      },
      Gloo());
  EXPECT_TRUE(s.ok()) << s;
}

// Note [Rings over gloo's buffers]: both rings, with chunks of more than one
// segment (the last one partial), at every world size; the inputs are small
// integers, so the float sums are exact whatever the order.
TEST(GlooBackendTest, RingsMoveChunksOfSeveralSegments) {
  constexpr int64_t kChunk = (1 << 18) + 1000;  // float32: 1 MiB + 4000 B
  for (int world : {2, 3, 4}) {
    absl::Status s = RunRanks(
        world,
        [&](Rank& me) -> absl::Status {
          // inputs[j] on rank q holds q * 100 + j * 10 + i % 7 at index i.
          auto value = [](int q, int j, int64_t i) { return q * 100 + j * 10 + i % 7; };
          for (Dtype dtype : {kFloat32, kInt64}) {
            std::vector<Tensor> inputs;
            for (int j = 0; j < world; ++j) {
              Tensor t = empty({kChunk}, dtype);
              for (int64_t i = 0; i < kChunk; ++i) {
                if (dtype == kFloat32) {
                  t.data_ptr<float>()[i] = static_cast<float>(value(me.rank, j, i));
                } else {
                  t.data_ptr<int64_t>()[i] = value(me.rank, j, i);
                }
              }
              inputs.push_back(t);
            }
            Tensor out = zeros({kChunk}, dtype);
            EMBER_RETURN_IF_ERROR(
                Finish(me.group->reduce_scatter(out, inputs, {.op = ReduceOp::kSum})));
            const Tensor got = out.to(kFloat64);
            int64_t wrong = 0;
            for (int64_t i = 0; i < kChunk; ++i) {
              double want = 0;
              for (int q = 0; q < world; ++q) want += value(q, me.rank, i);
              if (got.data_ptr<double>()[i] != want && wrong++ < 3) {
                ADD_FAILURE() << "world " << world << " rank " << me.rank << " "
                              << dtype_name(dtype) << " [" << i << "]: got "
                              << got.data_ptr<double>()[i] << ", want " << want;
              }
            }
            EXPECT_EQ(wrong, 0) << "world " << world << " rank " << me.rank;
            // The inputs are left as they were.
            EXPECT_EQ(inputs[0].to(kFloat64).data_ptr<double>()[8], value(me.rank, 0, 8));

            // In place: the inputs are views of one buffer and the output is
            // this rank's view.
            Tensor flat = empty({world * 1000}, dtype);
            std::vector<Tensor> views;
            for (int j = 0; j < world; ++j) {
              views.push_back(flat.narrow(0, j * 1000, 1000));
              views.back().copy_(inputs[j].narrow(0, 0, 1000));
            }
            Tensor mine = views[me.rank];
            EMBER_RETURN_IF_ERROR(
                Finish(me.group->reduce_scatter(mine, views, {.op = ReduceOp::kSum})));
            const Tensor in_place = mine.to(kFloat64);
            for (int64_t i : {int64_t{0}, int64_t{6}, int64_t{999}}) {
              double want = 0;
              for (int q = 0; q < world; ++q) want += value(q, me.rank, i);
              EXPECT_EQ(in_place.data_ptr<double>()[i], want) << "in place [" << i << "]";
            }

            // all_gather_into_tensor and all_gather of inputs[1].
            Tensor whole = zeros({world * kChunk}, dtype);
            EMBER_RETURN_IF_ERROR(Finish(me.group->allgather_into_tensor(whole, inputs[1])));
            std::vector<Tensor> parts;
            for (int q = 0; q < world; ++q) parts.push_back(zeros({kChunk}, dtype));
            EMBER_RETURN_IF_ERROR(Finish(me.group->allgather(parts, inputs[1])));
            const Tensor gathered = whole.to(kFloat64);
            for (int q = 0; q < world; ++q) {
              const Tensor part = parts[q].to(kFloat64);
              for (int64_t i : {int64_t{0}, int64_t{1} << 17, kChunk - 1}) {
                EXPECT_EQ(gathered.data_ptr<double>()[q * kChunk + i], value(q, 1, i))
                    << "world " << world << " rank " << me.rank << " from " << q << " [" << i
                    << "]";
                EXPECT_EQ(part.data_ptr<double>()[i], value(q, 1, i));
              }
            }
          }
          return absl::OkStatus();
        },
        Gloo());
    EXPECT_TRUE(s.ok()) << "world " << world << ": " << s;
  }
}

// A rank that never joins: the ring's own wait (the call check, which would
// otherwise time out first, is off) fails with the op and the rank named.
TEST(GlooBackendTest, RingsTimeOutNamingTheMissingRank) {
  ScopedEnv env("EMBER_GLOO_CHECK_COLLECTIVES", "0");
  for (bool gather : {false, true}) {
    RunRanksOptions options = Gloo();
    options.timeout = absl::Milliseconds(600);
    std::vector<absl::Status> results = RunRanksEach(
        2,
        [gather](Rank& me) -> absl::Status {
          if (me.rank == 1) {
            absl::SleepFor(absl::Seconds(2));  // never joins
            return absl::OkStatus();
          }
          const absl::Time start = absl::Now();
          Tensor out = zeros({gather ? 8 : 4});
          absl::Status s = gather ? Finish(me.group->allgather_into_tensor(out, ones({4})))
                                  : Finish(me.group->reduce_scatter(out, {ones({4}), ones({4})}));
          EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
          return s;
        },
        options);
    const std::string op = gather ? "all_gather_into_tensor" : "reduce_scatter";
    EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
    EXPECT_THAT(std::string(results[0].message()), HasSubstr(op));
    EXPECT_THAT(std::string(results[0].message()), HasSubstr("rank 1"));
  }
}

TEST(GlooBackendTest, MismatchedSizesFailInsteadOfHanging) {
  RunRanksOptions options = Gloo();
  options.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results = RunRanksEach(
      3,
      [](Rank& me) -> absl::Status {
        Tensor t = ones({me.rank == 1 ? 8 : 4}, kFloat32);
        return Finish(me.group->allreduce(t));
      },
      options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("all_reduce")) << results[r];
  }
}

TEST(GlooBackendTest, ProcessesAllReduceAndGather) {
  testing::ExpectAllReduceAcrossProcesses("gloo");
}
TEST(GlooFaultTest, SigkillMidAllReduce) { testing::ExpectSurvivorsFail("gloo", SIGKILL); }
TEST(GlooFaultTest, SigstopMidAllReduce) { testing::ExpectSurvivorsFail("gloo", SIGSTOP); }

TEST(GlooDeviceTest, SocketIfnameWinsAndAnUnknownOneIsNamed) {
  {
    ScopedEnv env("GLOO_SOCKET_IFNAME", "lo,eth0");
    DeviceChoice choice = ChooseDevice();
    EXPECT_EQ(choice.interface, "lo");
    EXPECT_THAT(choice.describe, HasSubstr("GLOO_SOCKET_IFNAME"));
    EXPECT_TRUE(CreateDevice(choice).ok());
  }
  ScopedEnv env("GLOO_SOCKET_IFNAME", "no-such-if0");
  auto device = CreateDevice(ChooseDevice());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(device.status().message()), HasSubstr("'no-such-if0'"));
  // And a group over it fails with that error instead of hanging.
  std::vector<absl::Status> results = RunRanksEach(
      1, [](Rank&) { return absl::OkStatus(); }, Gloo());
  EXPECT_THAT(results[0].ToString(), HasSubstr("no-such-if0"));
}

TEST(GlooDeviceTest, WithoutIfnameTheHostnameOrLoopback) {
  ScopedEnv env("GLOO_SOCKET_IFNAME", "");
  DeviceChoice choice = ChooseDevice();
  EXPECT_TRUE(choice.interface.empty());
  EXPECT_FALSE(choice.hostname.empty());
  EXPECT_TRUE(CreateDevice(choice).ok()) << choice.describe;
}

// The ids of this process's threads.
std::set<pid_t> Threads() {
  std::set<pid_t> tids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    tids.insert(static_cast<pid_t>(std::stoi(entry.path().filename().string())));
  }
  return tids;
}

// The scheduling policies of the threads a device creation started.
std::vector<int> PoliciesOfNewThreads() {
  const std::set<pid_t> before = Threads();
  absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> device =
      CreateDevice({.hostname = "127.0.0.1", .describe = "loopback"});
  EXPECT_TRUE(device.ok()) << device.status();
  std::vector<int> policies;
  for (pid_t tid : Threads()) {
    if (!before.contains(tid)) policies.push_back(sched_getscheduler(tid));
  }
  return policies;
}

// Note [gloo's network thread].
TEST(GlooDeviceTest, NetworkThreadRunsUnderBatchAndTheCallerKeepsItsPolicy) {
  if (sched_getscheduler(0) != SCHED_OTHER) {
    GTEST_SKIP() << "this test runs under scheduling policy " << sched_getscheduler(0)
                 << ", not SCHED_OTHER; the device leaves such callers' policy alone";
  }
  {
    ScopedEnv env("EMBER_GLOO_BATCH_NETWORK_THREAD", "1");
    EXPECT_THAT(PoliciesOfNewThreads(), ::testing::ElementsAre(SCHED_BATCH));
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  }
  ScopedEnv env("EMBER_GLOO_BATCH_NETWORK_THREAD", "0");
  EXPECT_THAT(PoliciesOfNewThreads(), ::testing::ElementsAre(SCHED_OTHER));
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
}

TEST(GlooStoreTest, GetTimesOutWithTheGroupTimeoutNamingTheKey) {
  auto store = std::make_shared<HashStore>();
  GlooStore adapter(store, "pg/", absl::Milliseconds(100));
  adapter.set("a", {'x', 'y'});
  EXPECT_EQ(adapter.get("a"), (std::vector<char>{'x', 'y'}));
  EXPECT_EQ(*store->get("pg/a", absl::Seconds(1)), "xy");
  const absl::Time start = absl::Now();
  try {
    adapter.get("missing");
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const ::gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("pg/missing"));
  }
  try {
    adapter.wait({"a", "other"}, std::chrono::seconds(30));
    ADD_FAILURE() << "wait for a missing key returned";
  } catch (const ::gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("pg/other"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace ember::distributed::gloo
