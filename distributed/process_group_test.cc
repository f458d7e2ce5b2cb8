// The checks every backend shares (Note [ProcessGroup layers]), the support
// table's enforcement and the backend registry, on a one-rank backend that
// records what reaches it.
#include "distributed/process_group.h"

#include <string>

#include "distributed/backend_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"

namespace ember::distributed {
namespace {

using ::testing::HasSubstr;

// Implements only broadcast, on CPU; counts the calls that pass the checks.
class BroadcastOnlyGroup : public ProcessGroup {
 public:
  explicit BroadcastOnlyGroup(int size)
      : ProcessGroup(0, size, "broadcast-only",
                     SupportTable()
                         .allow(OpType::kBroadcast, DeviceType::kCPU)
                         .allow(OpType::kAllReduce, DeviceType::kCPU)
                         .allow(OpType::kAllGather, DeviceType::kCPU)
                         .allow(OpType::kGather, DeviceType::kCPU)
                         .allow(OpType::kSend, DeviceType::kCPU)
                         .allow(OpType::kRecv, DeviceType::kCPU),
                     absl::Seconds(1)) {}
  int calls = 0;
  void abort() override {}

 protected:
  absl::StatusOr<std::shared_ptr<Work>> Done() {
    ++calls;
    return Work::Completed(OpType::kBroadcast, absl::OkStatus());
  }
  absl::StatusOr<std::shared_ptr<Work>> DoBroadcast(const Tensor&,
                                                    const BroadcastOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduce(const Tensor&,
                                                    const AllReduceOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoReduce(const Tensor&, const ReduceOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllGather(absl::Span<const Tensor>, const Tensor&,
                                                    const AllGatherOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllGatherIntoTensor(const Tensor&, const Tensor&,
                                                              const AllGatherOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoGather(absl::Span<const Tensor>, const Tensor&,
                                                 const GatherOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoScatter(const Tensor&, absl::Span<const Tensor>,
                                                  const ScatterOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoReduceScatter(const Tensor&, absl::Span<const Tensor>,
                                                        const ReduceScatterOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllToAll(absl::Span<const Tensor>,
                                                   absl::Span<const Tensor>,
                                                   const AllToAllOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoBarrier(const BarrierOptions&) override { return Done(); }
  absl::StatusOr<std::shared_ptr<Work>> DoMonitoredBarrier(
      const MonitoredBarrierOptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<Work>> DoSend(const Tensor&, int, const P2POptions&) override {
    return Done();
  }
  absl::StatusOr<std::shared_ptr<RecvWork>> DoRecv(const Tensor&, int, const P2POptions&) override {
    ++calls;
    return std::make_shared<RecvWork>(OpType::kRecv, absl::Now());
  }
};

std::string Message(const absl::StatusOr<std::shared_ptr<Work>>& s) {
  return std::string(s.status().message());
}

TEST(ProcessGroupTest, UnsupportedOpsNameTheOpBackendAndDevice) {
  BroadcastOnlyGroup pg(2);
  auto s = pg.alltoall({ones({1}), ones({1})}, {ones({1}), ones({1})});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(s), HasSubstr("all_to_all is not supported by the 'broadcast-only' backend "
                                    "for cpu tensors"));
  EXPECT_THAT(Message(pg.barrier()), HasSubstr("barrier is not supported"));
  EXPECT_EQ(pg.calls, 0);
  EXPECT_TRUE(pg.broadcast(ones({2})).ok());
  EXPECT_EQ(pg.calls, 1);
}

TEST(ProcessGroupTest, MalformedCallsNeverReachTheBackend) {
  BroadcastOnlyGroup pg(2);
  EXPECT_THAT(Message(pg.broadcast(Tensor())), HasSubstr("undefined tensor"));
  EXPECT_THAT(Message(pg.broadcast(ones({2}), {.root = 2})),
              HasSubstr("root 2 is out of range for a group of size 2"));
  EXPECT_THAT(Message(pg.allreduce(ones({2}, kInt32), {.op = ReduceOp::kAvg})),
              HasSubstr("AVG needs a floating point tensor, got int32"));
  EXPECT_THAT(Message(pg.allgather({ones({2})}, ones({2}))),
              HasSubstr("outputs has 1 tensors; expected one per rank (2)"));
  EXPECT_THAT(Message(pg.allgather({ones({2}), ones({3})}, ones({2}))),
              HasSubstr("outputs[1] has 3 elements"));
  EXPECT_THAT(Message(pg.allgather({ones({2}), ones({2}, kFloat64)}, ones({2}))),
              HasSubstr("outputs[1] is float64"));
  EXPECT_THAT(Message(pg.gather({ones({2}), ones({2})}, ones({2}), {.root = 1})),
              HasSubstr("outputs must be empty on non-root rank 0"));
  EXPECT_THAT(Message(pg.send(ones({2}), 0)), HasSubstr("cannot send to itself"));
  EXPECT_THAT(std::string(pg.recv(ones({2}), 5).status().message()),
              HasSubstr("src 5 is out of range"));
  EXPECT_EQ(pg.calls, 0);
}

TEST(WorkTest, WaitReturnsTheStatusOrTimesOut) {
  Work work(OpType::kAllReduce, absl::Now() + absl::Seconds(30));
  EXPECT_FALSE(work.is_completed());
  absl::Status early = work.wait(absl::Milliseconds(20));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(early.message()), HasSubstr("still running"));
  EXPECT_FALSE(work.is_completed());
  work.Finish(absl::UnavailableError("rank 1 died"));
  work.Finish(absl::OkStatus());  // the first result wins
  EXPECT_TRUE(work.is_completed());
  EXPECT_EQ(work.wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(work.status().code(), absl::StatusCode::kUnavailable);
}

TEST(WorkTest, PollingPastTheDeadlineFailsTheWork) {
  Work work(OpType::kRecv, absl::Now() + absl::Milliseconds(5));
  EXPECT_FALSE(work.is_completed());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(work.is_completed());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(WorkTest, PastItsDeadlineAWorkFails) {
  Work work(OpType::kBarrier, absl::Now() + absl::Milliseconds(10));
  const absl::Time start = absl::Now();
  absl::Status s = work.wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("barrier"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(work.is_completed());
}

TEST(BackendRegistryTest, FindsByNameAndListsTheKnownOnes) {
  ASSERT_TRUE(
      register_backend(
          {.name = "Loopback-Test",
           .support = SupportTable().allow_all(DeviceType::kCPU),
           .create = [](const BackendOptions& o) -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
             return std::make_shared<BroadcastOnlyGroup>(o.size);
           }})
          .ok());
  auto found = find_backend("LOOPBACK-test");
  ASSERT_TRUE(found.ok()) << found.status();
  auto pg = (*found)->create({.size = 3});
  ASSERT_TRUE(pg.ok());
  EXPECT_EQ((*pg)->size(), 3);
  auto missing = find_backend("mpi");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("unknown backend 'mpi'; registered backends: loopback-test"));
}

TEST(BackendRegistryTest, ADuplicateRegistrationIsAnErrorNamingTheBackend) {
  ASSERT_TRUE(register_backend({.name = "dup-test"}).ok());
  absl::Status second = register_backend({.name = "DUP-test"});
  EXPECT_EQ(second.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(second.message()), HasSubstr("backend 'dup-test' is registered 2 times"));
  // Neither registration is picked silently: the name is unusable.
  auto found = find_backend("dup-test");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(found.status().message()), HasSubstr("link only one of them"));
}

}  // namespace
}  // namespace ember::distributed
