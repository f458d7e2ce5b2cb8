// Backends per device type ("cpu:gloo,cuda:tcp"): parsing, the registry's
// mixed backends, and ops routed to the backend of their tensors' device
// (observable through what only one of the backends refuses: gloo refuses
// AVG, tcp runs it).
#include "distributed/mixed_process_group.h"

#include "absl/strings/match.h"
#include "distributed/backend_registry.h"
#include "distributed/gloo/process_group_gloo.h"
#include "distributed/hash_store.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::Finish;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRanks;
using ::ember::distributed::testing::RunRanksOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(MixedProcessGroupTest, ParsesDeviceBackendPairs) {
  auto parts = parse_device_backends("CPU:Gloo, cuda:nccl");
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_THAT(*parts, ElementsAre(Pair(DeviceType::kCPU, "gloo"), Pair(DeviceType::kCUDA, "nccl")));

  struct Bad {
    const char* spec;
    const char* why;
  };
  for (const Bad& bad : {Bad{"cpu:gloo,nccl", "entry 'nccl' names no device"},
                         Bad{"tpu:gloo", "unknown device type"},
                         Bad{"cpu:gloo,cpu:tcp", "'cpu:tcp' lists a device type a second time"},
                         Bad{"cpu:", "names no backend"}}) {
    auto got = parse_device_backends(bad.spec);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad.spec;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(bad.why)) << bad.spec;
  }
}

TEST(MixedProcessGroupTest, RegistryBuildsMixedBackendsFromRegisteredOnes) {
  auto mixed = find_backend("CPU:GLOO, cuda:tcp");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ((*mixed)->name, "cpu:gloo,cuda:tcp");
  EXPECT_TRUE((*mixed)->support.supports(OpType::kAllReduce, DeviceType::kCPU));
  // tcp runs nothing on CUDA tensors, so neither does the mixed backend.
  EXPECT_FALSE((*mixed)->support.supports(OpType::kAllReduce, DeviceType::kCUDA));
  EXPECT_EQ(*find_backend("cpu:gloo,cuda:tcp"), *mixed) << "built once";

  auto unknown = find_backend("cpu:gloo,cuda:nosuch");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown backend 'nosuch'"));
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

TEST(MixedProcessGroupTest, CpuOpsRunOnTheCpuBackend) {
  RunRanksOptions options;
  options.backend = "cpu:gloo,cuda:tcp";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Expect(me.group->backend() == "cpu:gloo,cuda:tcp", "name"));
        Tensor t = full({4}, me.rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
        EMBER_RETURN_IF_ERROR(Expect(t.equal(full({4}, 3, kFloat32)), "sum"));
        // AVG reaches gloo, which refuses it.
        absl::Status avg = Finish(me.group->allreduce(t, {.op = ReduceOp::kAvg}));
        EMBER_RETURN_IF_ERROR(Expect(avg.code() == absl::StatusCode::kUnimplemented &&
                                         absl::StrContains(avg.message(), "'gloo'"),
                                     "AVG went to gloo: " + avg.ToString()));
        Tensor b = full({2}, me.rank, kInt64);
        EMBER_RETURN_IF_ERROR(Finish(me.group->broadcast(b, {.root = 1})));
        EMBER_RETURN_IF_ERROR(Expect(b.equal(full({2}, 1, kInt64)), "broadcast"));
        if (me.rank == 0) {
          EMBER_RETURN_IF_ERROR(Finish(me.group->send(full({3}, 7, kFloat32), 1)));
        } else {
          Tensor got = zeros({3});
          auto recv = me.group->recv(got, 0);
          EMBER_RETURN_IF_ERROR(recv.status());
          EMBER_RETURN_IF_ERROR((*recv)->wait());
          EMBER_RETURN_IF_ERROR(Expect(got.equal(full({3}, 7, kFloat32)), "recv"));
        }
        return Finish(me.group->barrier());
      },
      options);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(MixedProcessGroupTest, TheOtherWayRoundCpuOpsRunOnTcp) {
  RunRanksOptions options;
  options.backend = "cuda:gloo,cpu:tcp";
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Expect(me.group->backend() == "cuda:gloo,cpu:tcp", "name"));
        Tensor t = full({4}, me.rank * 2, kFloat32);
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t, {.op = ReduceOp::kAvg})));
        EMBER_RETURN_IF_ERROR(Expect(t.equal(full({4}, 1, kFloat32)), "tcp averages"));
        return Finish(me.group->barrier());
      },
      options);
  EXPECT_TRUE(s.ok()) << s;
}

// pg_options reach the listed backend they are for (the others get none,
// rather than refusing them); options for a backend the list lacks fail.
TEST(MixedProcessGroupTest, PgOptionsGoToTheirBackend) {
  auto lo = std::make_shared<gloo::GlooOptions>();
  lo->interface = "lo";
  RunRanksOptions options;
  options.backend = "cpu:gloo,cuda:tcp";
  options.pg_options = lo;
  absl::Status s = RunRanks(
      2,
      [](Rank& me) -> absl::Status {
        Tensor t = ones({3});
        EMBER_RETURN_IF_ERROR(Finish(me.group->allreduce(t)));
        return Expect(t.equal(full({3}, 2, kFloat32)), "sum");
      },
      options);
  EXPECT_TRUE(s.ok()) << s;

  // A gloo device on an interface that does not exist: the options did reach gloo.
  auto nowhere = std::make_shared<gloo::GlooOptions>();
  nowhere->interface = "no-such-if0";
  auto mixed = find_backend("cpu:gloo,cuda:tcp");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  auto bad_interface =
      (*mixed)->create({.store = std::make_shared<HashStore>(), .pg_options = nowhere});
  EXPECT_FALSE(bad_interface.ok());
  EXPECT_THAT(std::string(bad_interface.status().message()), HasSubstr("no-such-if0"));

  auto tcp_only = find_backend("cpu:tcp");
  ASSERT_TRUE(tcp_only.ok()) << tcp_only.status();
  auto unlisted = (*tcp_only)->create({.store = std::make_shared<HashStore>(), .pg_options = lo});
  EXPECT_EQ(unlisted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unlisted.status().message()),
              HasSubstr("pg_options are for the 'gloo' backend, which the group's backend "
                        "'cpu:tcp' does not list"));
}

}  // namespace
}  // namespace ember::distributed
