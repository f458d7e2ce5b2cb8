// The torch.distributed-style API, with ranks as processes that rendezvous
// through file:// (the default group is per process, so threads cannot
// stand in for ranks here).
#include "distributed/distributed.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/hash_store.h"
#include "distributed/testing/ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::ProcessResult;
using ::ember::distributed::testing::Rank;
using ::ember::distributed::testing::RunRankProcesses;
using ::ember::distributed::testing::RunRanksOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Fails the rank with a message naming the check.
absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("check failed: ", what));
}

absl::Status Init(const Rank& me) {
  return init_process_group({.init_method = absl::StrCat("file://", me.temp_dir, "/rendezvous"),
                             .world_size = me.world_size,
                             .rank = me.rank,
                             .timeout = absl::Seconds(20)});
}

TEST(DistributedTest, BeforeInitEverythingAsksForInit) {
  EXPECT_FALSE(is_initialized());
  Tensor t = ones({2});
  absl::Status s = all_reduce(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("init_process_group"));
  try {
    get_rank();
    ADD_FAILURE() << "get_rank before init_process_group did not throw";
  } catch (const ember::Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("init_process_group"));
  }
  EXPECT_THROW(get_world_size(), ember::Error);
  EXPECT_EQ(destroy_process_group().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DistributedTest, UnknownBackendListsTheKnownOnes) {
  absl::Status s =
      init_process_group({.backend = "nccl2", .world_size = 1, .rank = 0, .store = nullptr});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tcp"));
  EXPECT_FALSE(is_initialized());
}

TEST(DistributedTest, WithoutABackendOrTimeoutTheDefaultsArePyTorchs) {
  // No CUDA device here, so no backend named means Ember's tcp; with one
  // and nccl linked it would be "cpu:gloo,cuda:nccl" (PyTorch 2.x's pick).
  if (device_count(DeviceType::kCUDA) > 0) GTEST_SKIP() << "a CUDA device is usable here";
  ASSERT_TRUE(init_process_group({.world_size = 1, .rank = 0,
                                  .store = std::make_shared<HashStore>()})
                  .ok());
  absl::StatusOr<Group> g = get_default_group();
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->backend(), "tcp");
  EXPECT_EQ((*g)->timeout(), kDefaultProcessGroupTimeout);  // 30 minutes
  ASSERT_TRUE(destroy_process_group().ok());
  // A given timeout wins.
  ASSERT_TRUE(init_process_group({.world_size = 1, .rank = 0, .timeout = absl::Seconds(7),
                                  .store = std::make_shared<HashStore>()})
                  .ok());
  EXPECT_EQ((*get_default_group())->timeout(), absl::Seconds(7));
  ASSERT_TRUE(destroy_process_group().ok());
}

TEST(DistributedTest, CollectivesAndPointToPointOnTheDefaultGroup) {
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      3,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me));
        EMBER_RETURN_IF_ERROR(Check(is_initialized(), "is_initialized"));
        int rank = get_rank();
        int world = get_world_size();
        EMBER_RETURN_IF_ERROR(Check(rank == me.rank && world == 3, "rank and world size"));
        absl::Status again = init_process_group({.world_size = 3, .rank = me.rank});
        EMBER_RETURN_IF_ERROR(
            Check(again.code() == absl::StatusCode::kFailedPrecondition, "a second init fails"));

        Tensor t = full({5}, rank + 1, kFloat32);
        EMBER_RETURN_IF_ERROR(all_reduce(t));
        EMBER_RETURN_IF_ERROR(Check(t.equal(full({5}, 6, kFloat32)), "all_reduce sum"));
        EMBER_RETURN_IF_ERROR(all_reduce(t, ReduceOp::kMax));
        Tensor b = full({3}, rank, kInt64);
        EMBER_RETURN_IF_ERROR(broadcast(b, /*src=*/2));
        EMBER_RETURN_IF_ERROR(Check(b.equal(full({3}, 2, kInt64)), "broadcast from 2"));

        Tensor r = full({1}, rank * 10, kInt32);
        EMBER_RETURN_IF_ERROR(reduce(r, /*dst=*/1));
        if (rank == 1) EMBER_RETURN_IF_ERROR(Check(r.item<int>() == 30, "reduce to 1"));

        std::vector<Tensor> parts = {zeros({2}), zeros({2}), zeros({2})};
        EMBER_RETURN_IF_ERROR(all_gather(parts, full({2}, rank, kFloat32)));
        for (int i = 0; i < 3; ++i) {
          EMBER_RETURN_IF_ERROR(Check(parts[i].equal(full({2}, i, kFloat32)), "all_gather"));
        }
        Tensor flat = zeros({6});
        EMBER_RETURN_IF_ERROR(all_gather_into_tensor(flat, full({2}, rank, kFloat32)));
        EMBER_RETURN_IF_ERROR(
            Check(flat.equal(tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f})), "all_gather_into_tensor"));

        std::vector<Tensor> gathered;
        if (rank == 0) gathered = {zeros({1}), zeros({1}), zeros({1})};
        EMBER_RETURN_IF_ERROR(gather(full({1}, rank + 5, kFloat32), gathered, /*dst=*/0));
        if (rank == 0) EMBER_RETURN_IF_ERROR(Check(gathered[2].item<float>() == 7, "gather"));

        std::vector<Tensor> pieces;
        if (rank == 2)
          pieces = {full({1}, 100, kFloat32), full({1}, 101, kFloat32), full({1}, 102, kFloat32)};
        Tensor mine = zeros({1});
        EMBER_RETURN_IF_ERROR(scatter(mine, pieces, /*src=*/2));
        EMBER_RETURN_IF_ERROR(Check(mine.item<float>() == 100 + rank, "scatter"));

        Tensor rs = zeros({2});
        EMBER_RETURN_IF_ERROR(reduce_scatter(
            rs, {full({2}, 1, kFloat32), full({2}, 2, kFloat32), full({2}, 3, kFloat32)},
            ReduceOp::kSum));
        EMBER_RETURN_IF_ERROR(
            Check(rs.equal(full({2}, 3 * (rank + 1), kFloat32)), "reduce_scatter"));

        std::vector<Tensor> outs = {zeros({1}), zeros({1}), zeros({1})};
        EMBER_RETURN_IF_ERROR(
            all_to_all(outs, {full({1}, rank * 10, kFloat32), full({1}, rank * 10 + 1, kFloat32),
                              full({1}, rank * 10 + 2, kFloat32)}));
        for (int i = 0; i < 3; ++i) {
          EMBER_RETURN_IF_ERROR(Check(outs[i].item<float>() == i * 10 + rank, "all_to_all"));
        }

        // Point to point, with tags and from any source.
        if (rank != 0) {
          EMBER_RETURN_IF_ERROR(send(full({4}, rank, kFloat32), /*dst=*/0, nullptr, /*tag=*/3));
        } else {
          for (int i = 0; i < 2; ++i) {
            Tensor in = zeros({4});
            EMBER_ASSIGN_OR_RETURN(int from, recv(in, kAnySource, nullptr, /*tag=*/3));
            EMBER_RETURN_IF_ERROR(
                Check(in.equal(full({4}, from, kFloat32)), "recv from any source"));
          }
        }
        EMBER_ASSIGN_OR_RETURN(auto work, all_reduce_async(t));
        EMBER_RETURN_IF_ERROR(work->wait());
        EMBER_RETURN_IF_ERROR(Check(work->is_completed(), "IsCompleted"));
        EMBER_RETURN_IF_ERROR(barrier());
        EMBER_RETURN_IF_ERROR(monitored_barrier(nullptr, absl::Seconds(10)));
        EMBER_RETURN_IF_ERROR(destroy_process_group());
        return Check(!is_initialized(), "destroyed");
      },
      options);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
}

// batch_isend_irecv around a ring of 4 ranks, over tcp and gloo: even
// ranks list their irecv first and odd ranks their isend first (a batch
// pairs them whatever the order), a second batch on a new group of ranks
// {1, 3}, and every refusal, which issues nothing (the ring after them
// still pairs up).
TEST(DistributedTest, BatchIsendIrecvAroundARing) {
  for (const std::string backend : {"tcp", "gloo"}) {
    SCOPED_TRACE(backend);
    RunRanksOptions options;
    options.make_group = false;
    std::vector<ProcessResult> results = RunRankProcesses(
        4,
        [&backend](Rank& me) -> absl::Status {
          EMBER_RETURN_IF_ERROR(init_process_group(
              {.backend = backend,
               .init_method = absl::StrCat("file://", me.temp_dir, "/rendezvous"),
               .world_size = me.world_size,
               .rank = me.rank,
               .timeout = absl::Seconds(20)}));
          const int rank = get_rank();
          const int next = (rank + 1) % 4, prev = (rank + 3) % 4;
          Tensor out = full({3}, 10 * rank, kFloat32);
          Tensor in = zeros({3}, kFloat32);
          std::vector<P2POp> ring = {{.op = P2POp::Kind::kIsend, .tensor = out, .peer = next},
                                     {.op = P2POp::Kind::kIrecv, .tensor = in, .peer = prev}};
          if (rank % 2 == 0) std::swap(ring[0], ring[1]);
          EMBER_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Work>> works,
                                 batch_isend_irecv(ring));
          EMBER_RETURN_IF_ERROR(Check(works.size() == 2, "one Work per op"));
          for (const auto& w : works) EMBER_RETURN_IF_ERROR(w->wait());
          EMBER_RETURN_IF_ERROR(Check(in.equal(full({3}, 10 * prev, kFloat32)), "ring value"));

          // Refusals: nothing is issued.
          absl::StatusOr<std::vector<std::shared_ptr<Work>>> bad = batch_isend_irecv({});
          EMBER_RETURN_IF_ERROR(Check(bad.status().code() == absl::StatusCode::kInvalidArgument &&
                                          absl::StrContains(bad.status().message(), "empty"),
                                      "an empty batch"));
          EMBER_ASSIGN_OR_RETURN(Group odd, new_group({1, 3}));
          Tensor spare = zeros({3}, kFloat32);
          if (rank == 1 || rank == 3) {
            bad = batch_isend_irecv(std::vector<P2POp>{
                {.op = P2POp::Kind::kIsend, .tensor = out, .peer = next},
                {.op = P2POp::Kind::kIrecv, .tensor = spare, .peer = 4 - rank, .group = odd}});
            EMBER_RETURN_IF_ERROR(
                Check(absl::StrContains(bad.status().message(), "all ops need to use the same group"),
                      std::string("two groups: ") + std::string(bad.status().message())));
            bad = batch_isend_irecv(std::vector<P2POp>{
                {.op = P2POp::Kind::kIsend, .tensor = out, .peer = 0, .group = odd}});
            EMBER_RETURN_IF_ERROR(
                Check(absl::StrContains(bad.status().message(), "is not a member of the group"),
                      std::string("a peer outside: ") + std::string(bad.status().message())));
            // A batch on the new group: 1 and 3 swap values.
            EMBER_ASSIGN_OR_RETURN(
                works, batch_isend_irecv(std::vector<P2POp>{
                           {.op = P2POp::Kind::kIrecv, .tensor = spare, .peer = 4 - rank, .group = odd},
                           {.op = P2POp::Kind::kIsend, .tensor = out, .peer = 4 - rank, .group = odd}}));
            for (const auto& w : works) EMBER_RETURN_IF_ERROR(w->wait());
            EMBER_RETURN_IF_ERROR(
                Check(spare.equal(full({3}, 10 * (4 - rank), kFloat32)), "swap on the new group"));
          }
          bad = batch_isend_irecv(std::vector<P2POp>{
              {.op = P2POp::Kind::kIsend, .tensor = out, .peer = next},
              {.op = P2POp::Kind::kIsend, .tensor = out, .peer = rank}});
          EMBER_RETURN_IF_ERROR(
              Check(absl::StrContains(bad.status().message(), "cannot send to itself"),
                    std::string("to itself: ") + std::string(bad.status().message())));
          // Op 0 of the refused batch was not issued: the ring pairs up as
          // before.
          in.zero_();
          EMBER_ASSIGN_OR_RETURN(works, batch_isend_irecv(ring));
          for (const auto& w : works) EMBER_RETURN_IF_ERROR(w->wait());
          EMBER_RETURN_IF_ERROR(Check(in.equal(full({3}, 10 * prev, kFloat32)), "second ring"));
          return destroy_process_group();
        },
        options, absl::Seconds(60));
    for (const ProcessResult& r : results) EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

TEST(DistributedTest, NewGroupMembersAndNonMembers) {
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      4,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me));
        EMBER_ASSIGN_OR_RETURN(Group odd, new_group({3, 1}));
        EMBER_ASSIGN_OR_RETURN(Group all, new_group());
        int group_rank = get_rank(odd);
        Tensor t = full({3}, me.rank, kFloat64);
        if (me.rank % 2 == 1) {
          EMBER_RETURN_IF_ERROR(Check(group_rank == (me.rank == 1 ? 0 : 1), "group rank"));
          EMBER_RETURN_IF_ERROR(all_reduce(t, ReduceOp::kSum, odd));
          EMBER_RETURN_IF_ERROR(Check(t.equal(full({3}, 4, kFloat64)), "sum over {1, 3}"));
          // Global ranks in the free functions: src 3 is group rank 1.
          Tensor b = full({1}, me.rank, kInt8);
          EMBER_RETURN_IF_ERROR(broadcast(b, /*src=*/3, odd));
          EMBER_RETURN_IF_ERROR(Check(b.item<int>() == 3, "broadcast from global rank 3"));
          absl::Status outside = broadcast(b, /*src=*/0, odd);
          EMBER_RETURN_IF_ERROR(
              Check(absl::StrContains(outside.message(), "not a member"), "src outside the group"));
        } else {
          EMBER_RETURN_IF_ERROR(Check(group_rank == -1, "non-member rank is -1"));
          absl::Status s = all_reduce(t, ReduceOp::kSum, odd);
          EMBER_RETURN_IF_ERROR(Check(s.code() == absl::StatusCode::kFailedPrecondition &&
                                          absl::StrContains(s.message(), "not a member") &&
                                          absl::StrContains(s.message(), "[1, 3]"),
                                      absl::StrCat("non-member error: ", s.ToString())));
          s = odd->allreduce(t).status();
          EMBER_RETURN_IF_ERROR(
              Check(absl::StrContains(s.message(), "not a member"), "the handle itself refuses"));
        }
        Tensor u = ones({2});
        EMBER_RETURN_IF_ERROR(all_reduce(u, ReduceOp::kSum, all));
        EMBER_RETURN_IF_ERROR(
            Check(u.equal(full({2}, 4, kFloat32)), "all_reduce over new_group()"));
        return destroy_process_group();
      },
      options);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
}

// While rank 0's new_group waits for rank 1 to join, rank 0's other threads
// keep using the library: rank 1 only joins once rank 0's main thread has
// called get_world_size (which takes the library's lock), so a new_group that
// held the global lock through its rendezvous would time out here.
TEST(DistributedTest, NewGroupDoesNotBlockOtherThreadsWhileItsRendezvousRuns) {
  RunRanksOptions options;
  options.make_group = false;
  std::vector<ProcessResult> results = RunRankProcesses(
      2,
      [](Rank& me) -> absl::Status {
        EMBER_RETURN_IF_ERROR(Init(me));
        EMBER_ASSIGN_OR_RETURN(Group first, new_group({0, 1}));
        const std::string flag = absl::StrCat(me.temp_dir, "/rank0-went-on");
        if (me.rank == 1) {
          for (int i = 0; i < 200 && access(flag.c_str(), F_OK) != 0; ++i) {
            absl::SleepFor(absl::Milliseconds(50));
          }
          EMBER_RETURN_IF_ERROR(Check(access(flag.c_str(), F_OK) == 0, "rank 0 went on"));
          EMBER_ASSIGN_OR_RETURN(Group second, new_group({0, 1}, {.timeout = absl::Seconds(20)}));
          return barrier(second);
        }
        absl::StatusOr<Group> second;
        std::thread creator([&] { second = new_group({0, 1}, {.timeout = absl::Seconds(20)}); });
        absl::SleepFor(absl::Milliseconds(200));  // creator is inside the rendezvous
        int world = get_world_size();
        EMBER_RETURN_IF_ERROR(Check(world == 2, "world size"));
        if (FILE* f = fopen(flag.c_str(), "w")) fclose(f);
        creator.join();
        EMBER_RETURN_IF_ERROR(second.status());
        return barrier(*second);
      },
      options);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
  }
}

TEST(DistributedTest, InitWithAStore) {
  auto store = std::make_shared<HashStore>();
  absl::Status bad = init_process_group({.world_size = 2, .rank = 2, .store = store});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("rank 2"));

  // world_size 1 needs no peers: the whole API runs in this process.
  ASSERT_TRUE(init_process_group({.world_size = 1, .rank = 0, .store = store}).ok());
  EXPECT_EQ(get_world_size(), 1);
  Tensor t = full({3}, 7, kInt32);
  EXPECT_TRUE(all_reduce(t, ReduceOp::kProduct).ok());
  EXPECT_TRUE(t.equal(full({3}, 7, kInt32)));
  EXPECT_TRUE(barrier().ok());
  absl::Status self = send(t, 0);
  EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
  EXPECT_TRUE(destroy_process_group().ok());
  EXPECT_FALSE(is_initialized());
}

// Groups keep their keys where PyTorch keeps them (Note [Store layout]), so
// a second job on a store that already holds one is refused clearly rather
// than joining the old job's keys.
TEST(DistributedTest, StoreLayoutIsPyTorchsAndAUsedStoreIsRefused) {
  auto store = std::make_shared<HashStore>();
  ASSERT_TRUE(init_process_group({.world_size = 1, .rank = 0, .store = store}).ok());
  EXPECT_EQ(store->get("store_based_barrier_key:1", absl::ZeroDuration()).value_or(""), "1");
  ASSERT_TRUE(new_group({0}).ok());
  EXPECT_EQ(store->get("store_based_barrier_key:2", absl::ZeroDuration()).value_or(""), "1");
  ASSERT_TRUE(destroy_process_group().ok());

  absl::Status again = init_process_group({.world_size = 1, .rank = 0, .store = store});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(std::string(again.message()),
              AllOf(HasSubstr("store_based_barrier_key:1"), HasSubstr("fresh store")));
  EXPECT_FALSE(is_initialized());
}

// TORCH_DIST_INIT_BARRIER, read as PyTorch 2.x reads it (Note [Store
// layout]): 1 waits for every rank at the store barrier, unset or 0 counts
// this rank in without waiting, anything else is refused by name.
TEST(DistributedTest, InitBarrierFollowsTorchDistInitBarrier) {
  for (const char* value : {"1", "0"}) {
    setenv("TORCH_DIST_INIT_BARRIER", value, 1);
    auto store = std::make_shared<HashStore>();
    ASSERT_TRUE(init_process_group({.world_size = 1, .rank = 0, .store = store}).ok()) << value;
    EXPECT_EQ(store->get("store_based_barrier_key:1", absl::ZeroDuration()).value_or(""), "1");
    ASSERT_TRUE(destroy_process_group().ok());
  }
  setenv("TORCH_DIST_INIT_BARRIER", "yes", 1);
  absl::Status bad =
      init_process_group({.world_size = 1, .rank = 0, .store = std::make_shared<HashStore>()});
  unsetenv("TORCH_DIST_INIT_BARRIER");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("TORCH_DIST_INIT_BARRIER='yes'"));
  EXPECT_FALSE(is_initialized());
}

}  // namespace
}  // namespace ember::distributed
