// ElasticAgent over real sockets on loopback: the first agent on the
// endpoint host serves the rendezvous, the others connect; each round's
// node rank 0 serves the workers' store and the others find it; a waiting
// node makes the round restart and joins the next; the exit barrier closes
// the rendezvous once every node finished; an unreachable endpoint is named.
#include "tools/launch/elastic_agent.h"

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::launch {
namespace {

using ::testing::HasSubstr;

ElasticOptions Options(int port, const std::string& node, int min, int max) {
  return {.endpoint_host = "127.0.0.1",
          .endpoint_port = port,
          .run_id = "train",
          .min_nodes = min,
          .max_nodes = max,
          .nproc_per_node = 2,
          .local_addr = "127.0.0.1",
          .node_id = node,
          .join_timeout = absl::Seconds(20),
          .last_call = absl::Milliseconds(200),
          .heartbeat_timeout = absl::Milliseconds(800),
          .exit_barrier_timeout = absl::Seconds(10),
          .store_timeout = absl::Seconds(10)};
}

std::vector<absl::StatusOr<RoundSetup>> Rounds(std::vector<std::unique_ptr<ElasticAgent>>& agents) {
  std::vector<absl::StatusOr<RoundSetup>> out(agents.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = agents[i]->NextRound(); });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ElasticAgentTest, RoundsWorkerStoresScaleUpAndTheExitBarrier) {
  const int port = distributed::testing::FreePort();
  std::vector<std::unique_ptr<ElasticAgent>> agents;
  for (int i = 0; i < 2; ++i) {
    auto a = ElasticAgent::create(Options(port, absl::StrCat("node", i), 2, 3));
    ASSERT_TRUE(a.ok()) << a.status();
    agents.push_back(std::move(*a));
  }
  EXPECT_TRUE(agents[0]->serves_endpoint());
  EXPECT_FALSE(agents[1]->serves_endpoint());
  auto first = Rounds(agents);
  for (auto& r : first) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(first[0]->world_size, 4);
  EXPECT_EQ(std::set<int>({first[0]->node_rank, first[1]->node_rank}), (std::set<int>{0, 1}));
  EXPECT_EQ(first[0]->master_port, first[1]->master_port);  // one worker store per round
  EXPECT_EQ(first[0]->master_addr, "127.0.0.1");
  EXPECT_EQ(first[1]->env.at("TORCHELASTIC_RUN_ID"), "train");
  EXPECT_EQ(first[1]->env.at("EMBER_RDZV_ROUND"), "0");
  // The round's worker store is real: a client of it can write.
  auto worker_store = distributed::TcpStore::create({.host = "127.0.0.1", .port = first[0]->master_port});
  ASSERT_TRUE(worker_store.ok()) << worker_store.status();
  ASSERT_TRUE((*worker_store)->set("k", "v").ok());
  worker_store->reset();

  // A third node arrives: the others' Check names it, they restart.
  auto late = ElasticAgent::create(Options(port, "node2", 2, 3));
  ASSERT_TRUE(late.ok());
  absl::StatusOr<RoundSetup> late_round = absl::UnknownError("not run");
  std::thread joiner([&] { late_round = (*late)->NextRound(); });
  absl::StatusOr<std::optional<RoundChange>> change = std::optional<RoundChange>();
  for (int i = 0; i < 300 && change.ok() && !change->has_value(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    change = agents[0]->Check();
  }
  ASSERT_TRUE(change.ok() && change->has_value());
  EXPECT_THAT((*change)->reason, HasSubstr("1 node(s) waiting to join"));
  EXPECT_TRUE((*change)->membership_only);
  ASSERT_TRUE(agents[0]->Restart((*change)->reason).ok());
  // node1 sees that node0 restarted the round: not a membership-only change.
  absl::StatusOr<std::optional<RoundChange>> seen = agents[1]->Check();
  ASSERT_TRUE(seen.ok() && seen->has_value());
  EXPECT_THAT((*seen)->reason, HasSubstr("restarted by another node"));
  EXPECT_FALSE((*seen)->membership_only);
  auto second = Rounds(agents);
  joiner.join();
  ASSERT_TRUE(late_round.ok()) << late_round.status();
  for (auto& r : second) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(late_round->round, 1);
  EXPECT_EQ(late_round->world_size, 6);
  EXPECT_NE(late_round->master_port, first[0]->master_port);  // a fresh store

  // Everyone finishes: the barrier lets all go and the rendezvous closes.
  agents.push_back(std::move(*late));
  std::vector<absl::Status> done(3);
  std::vector<std::thread> finishers;
  for (int i = 0; i < 3; ++i) finishers.emplace_back([&, i] { done[i] = agents[i]->Succeeded(); });
  for (auto& t : finishers) t.join();
  for (auto& s : done) EXPECT_TRUE(s.ok()) << s;
  auto after = ElasticAgent::create(Options(port, "node9", 1, 3));
  ASSERT_TRUE(after.ok());
  absl::StatusOr<RoundSetup> closed = (*after)->NextRound();
  ASSERT_FALSE(closed.ok());
  EXPECT_THAT(closed.status().message(), HasSubstr("the job finished"));
}

TEST(ElasticAgentTest, AnUnreachableEndpointIsNamed) {
  ElasticOptions o = Options(distributed::testing::FreePort(), "n", 1, 1);
  o.endpoint_host = "192.0.2.1";  // TEST-NET-1: never this machine, never answers
  o.store_timeout = absl::Seconds(1);
  auto a = ElasticAgent::create(o);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("cannot reach the rendezvous endpoint 192.0.2.1:"));
  EXPECT_THAT(a.status().message(), HasSubstr("--rdzv_endpoint"));
}

}  // namespace
}  // namespace ember::launch
