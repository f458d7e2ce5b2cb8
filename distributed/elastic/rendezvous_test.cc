// The elastic rendezvous over a real TcpStore: rounds that complete at MAX
// or after the last call at MIN, agreeing ranks, waiting nodes admitted by a
// restart, lost nodes noticed within the heartbeat timeout, the MIN failure
// naming the rendezvous, closing, bad options, and a fuzz of nodes joining
// and leaving at random for 60 s that must end with every node agreeing.
#include "distributed/elastic/rendezvous.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/status_macros.h"

namespace ember::distributed::elastic {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A TcpStore server on loopback and a client per node, as launchers use it.
class Endpoint {
 public:
  Endpoint() {
    auto server = TcpStore::create({.port = 0, .is_server = true});
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  std::shared_ptr<Store> Client() {
    auto c = TcpStore::create({.port = server_->port()});
    EXPECT_TRUE(c.ok()) << c.status();
    return std::shared_ptr<Store>(std::move(*c));
  }

 private:
  std::unique_ptr<TcpStore> server_;
};

RendezvousOptions Options(std::shared_ptr<Store> store, const std::string& node, int min, int max) {
  return {.store = std::move(store),
          .run_id = "job",
          .node_id = node,
          .min_nodes = min,
          .max_nodes = max,
          .join_timeout = absl::Seconds(20),
          .last_call = absl::Milliseconds(300),
          .heartbeat_timeout = absl::Milliseconds(600),
          .poll_interval = absl::Milliseconds(10)};
}

// Runs next_round on `nodes` new launchers at once; returns their rounds.
std::vector<absl::StatusOr<RoundInfo>> JoinAll(Endpoint& ep, int nodes, int min, int max,
                                                std::vector<std::unique_ptr<ElasticRendezvous>>* keep) {
  std::vector<absl::StatusOr<RoundInfo>> out(nodes, absl::UnknownError("not run"));
  keep->resize(nodes);
  std::vector<std::thread> threads;
  for (int i = 0; i < nodes; ++i) {
    auto r = ElasticRendezvous::create(Options(ep.Client(), absl::StrCat("node", i), min, max));
    EXPECT_TRUE(r.ok()) << r.status();
    (*keep)[i] = std::move(*r);
  }
  for (int i = 0; i < nodes; ++i) {
    threads.emplace_back([&, i] { out[i] = (*keep)[i]->next_round(); });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ElasticRendezvousTest, MaxNodesCompleteARoundWithAgreeingRanks) {
  Endpoint ep;
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  auto rounds = JoinAll(ep, 3, 2, 3, &nodes);
  std::set<int> ranks;
  for (auto& r : rounds) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->round, 0);
    EXPECT_EQ(r->num_nodes, 3);
    EXPECT_EQ(r->nodes, rounds[0]->nodes);  // one order for everyone
    EXPECT_EQ(r->nodes[r->node_rank], absl::StrCat("node", &r - &rounds[0]));
    ranks.insert(r->node_rank);
    EXPECT_EQ(r->prefix, "rdzv/job/round/0/");
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

TEST(ElasticRendezvousTest, MinNodesCompleteAfterTheLastCall) {
  Endpoint ep;
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  const absl::Time start = absl::Now();
  auto rounds = JoinAll(ep, 2, 2, 4, &nodes);
  for (auto& r : rounds) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_nodes, 2);
  }
  // Not before the last call (300 ms) ran out: a third node could have come.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
}

TEST(ElasticRendezvousTest, ALateNodeWaitsAndARestartAdmitsIt) {
  Endpoint ep;
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  auto first = JoinAll(ep, 2, 2, 3, &nodes);
  ASSERT_TRUE(first[0].ok() && first[1].ok());
  auto late = ElasticRendezvous::create(Options(ep.Client(), "late", 2, 3));
  ASSERT_TRUE(late.ok());
  absl::StatusOr<RoundInfo> late_round = absl::UnknownError("not run");
  std::thread joiner([&] { late_round = (*late)->next_round(); });
  // The participants see a node waiting (scale-up) and restart the round.
  absl::StatusOr<Health> h = absl::UnknownError("never waited");
  for (int i = 0; i < 200; ++i) {
    h = nodes[0]->health(*first[0]);
    ASSERT_TRUE(h.ok()) << h.status();
    if (h->waiting > 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(h->waiting, 1);
  EXPECT_TRUE(h->must_restart());
  EXPECT_THAT(h->reason, HasSubstr("1 node(s) waiting to join"));
  ASSERT_TRUE(nodes[0]->restart_round(*first[0], h->reason).ok());
  // node1 learns of it through health, as its monitor loop would.
  absl::StatusOr<Health> h1 = nodes[1]->health(*first[1]);
  ASSERT_TRUE(h1.ok());
  EXPECT_TRUE(h1->round_changed);
  std::vector<absl::StatusOr<RoundInfo>> second(2, absl::UnknownError("not run"));
  std::thread a([&] { second[0] = nodes[0]->next_round(); });
  std::thread b([&] { second[1] = nodes[1]->next_round(); });
  a.join();
  b.join();
  joiner.join();
  ASSERT_TRUE(late_round.ok()) << late_round.status();
  ASSERT_TRUE(second[0].ok() && second[1].ok());
  EXPECT_EQ(late_round->round, 1);
  EXPECT_EQ(late_round->num_nodes, 3);
  EXPECT_EQ(second[0]->nodes, late_round->nodes);
}

TEST(ElasticRendezvousTest, ALostNodeIsNoticedAndTheRestGoOn) {
  Endpoint ep;
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  auto first = JoinAll(ep, 3, 2, 3, &nodes);
  for (auto& r : first) ASSERT_TRUE(r.ok());
  // node2 stops beating (as a killed launcher would); the others keep alive.
  const absl::Time killed = absl::Now();
  absl::StatusOr<Health> h = absl::UnknownError("never checked");
  while (absl::Now() - killed < absl::Seconds(5)) {
    ASSERT_TRUE(nodes[0]->keep_alive().ok());
    ASSERT_TRUE(nodes[1]->keep_alive().ok());
    h = nodes[0]->health(*first[0]);
    ASSERT_TRUE(h.ok());
    if (!h->lost.empty()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(h->lost, ElementsAre("node2"));
  EXPECT_LT(absl::Now() - killed, absl::Milliseconds(600) + absl::Seconds(2));
  EXPECT_THAT(h->reason, HasSubstr("node2 sent no heartbeat"));
  ASSERT_TRUE(nodes[0]->restart_round(*first[0], h->reason).ok());
  std::vector<absl::StatusOr<RoundInfo>> second(2, absl::UnknownError("not run"));
  std::thread a([&] { second[0] = nodes[0]->next_round(); });
  std::thread b([&] { second[1] = nodes[1]->next_round(); });
  a.join();
  b.join();
  ASSERT_TRUE(second[0].ok()) << second[0].status();
  ASSERT_TRUE(second[1].ok()) << second[1].status();
  EXPECT_EQ(second[0]->round, 1);
  EXPECT_EQ(second[0]->num_nodes, 2);
  EXPECT_THAT(second[0]->nodes, ElementsAre(::testing::AnyOf("node0", "node1"),
                                            ::testing::AnyOf("node0", "node1")));
}

TEST(ElasticRendezvousTest, BelowMinTheRendezvousFailsNamingItAndMin) {
  Endpoint ep;
  RendezvousOptions o = Options(ep.Client(), "alone", 2, 3);
  o.join_timeout = absl::Milliseconds(500);
  auto r = ElasticRendezvous::create(o);
  ASSERT_TRUE(r.ok());
  absl::StatusOr<RoundInfo> round = (*r)->next_round();
  ASSERT_FALSE(round.ok());
  EXPECT_EQ(round.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(round.status().message(), HasSubstr("elastic rendezvous 'job' round 0"));
  EXPECT_THAT(round.status().message(), HasSubstr("1 node(s) joined"));
  EXPECT_THAT(round.status().message(), HasSubstr("at least 2"));
}

TEST(ElasticRendezvousTest, ClosingEndsEveryLaterJoin) {
  Endpoint ep;
  auto a = ElasticRendezvous::create(Options(ep.Client(), "a", 1, 1));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->close("the job finished").ok());
  auto b = ElasticRendezvous::create(Options(ep.Client(), "b", 1, 1));
  ASSERT_TRUE(b.ok());
  absl::StatusOr<RoundInfo> round = (*b)->next_round();
  ASSERT_FALSE(round.ok());
  EXPECT_EQ(round.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(round.status().message(), HasSubstr("the job finished (closed by a)"));
}

TEST(ElasticRendezvousTest, BadOptionsAreNamed) {
  Endpoint ep;
  EXPECT_THAT(ElasticRendezvous::create(Options(ep.Client(), "n", 3, 2)).status().message(),
              HasSubstr("--nnodes=3:2"));
  EXPECT_THAT(ElasticRendezvous::create(Options(ep.Client(), "a,b", 1, 2)).status().message(),
              HasSubstr("node id 'a,b'"));
  RendezvousOptions o = Options(ep.Client(), "n", 1, 1);
  o.run_id = "x/y";
  EXPECT_THAT(ElasticRendezvous::create(o).status().message(), HasSubstr("run id 'x/y'"));
  auto store = ep.Client();
  ASSERT_TRUE(store->set("rdzv/job/state", "garbage").ok());
  auto r = ElasticRendezvous::create(Options(store, "n", 1, 1));
  ASSERT_TRUE(r.ok());
  absl::StatusOr<RoundInfo> round = (*r)->next_round();
  EXPECT_EQ(round.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(round.status().message(), HasSubstr("--rdzv_id"));
}

TEST(ElasticRendezvousTest, StateRoundTrips) {
  internal::State s{.round = 7,
                    .complete = true,
                    .last_call_until_us = 123,
                    .closed = true,
                    .closed_reason = "two\nlines",
                    .participants = {"a", "b"},
                    .waiting = {"c"}};
  absl::StatusOr<internal::State> back = internal::Decode(internal::Encode(s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->round, 7);
  EXPECT_TRUE(back->complete && back->closed);
  EXPECT_EQ(back->last_call_until_us, 123);
  EXPECT_EQ(back->closed_reason, "two lines");
  EXPECT_THAT(back->participants, ElementsAre("a", "b"));
  EXPECT_THAT(back->waiting, ElementsAre("c"));
}

// Nodes join, run a round for a random while, leave (stop beating, as a
// killed launcher) or restart, and new nodes arrive, for a few seconds.
// Every completed round must look the same to every node that got it: the
// same members in the same order, ranks 0..n-1, MIN <= n <= MAX.
TEST(ElasticRendezvousTest, FuzzJoiningAndLeavingEndsConsistent) {
  Endpoint ep;
  constexpr int kMin = 2, kMax = 4;
  const absl::Time end = absl::Now() + absl::Seconds(60);
  std::mutex mu;
  std::map<int64_t, std::vector<std::pair<std::string, RoundInfo>>> seen;  // round -> (node, what it got)
  std::atomic<int> next_id{0};
  auto node = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    const std::string id = absl::StrCat("n", next_id++);
    RendezvousOptions o = Options(ep.Client(), id, kMin, kMax);
    o.join_timeout = absl::Seconds(4);
    auto r = ElasticRendezvous::create(o);
    if (!r.ok()) return;
    while (absl::Now() < end) {
      absl::StatusOr<RoundInfo> round = (*r)->next_round();
      if (!round.ok()) return;  // a round that could not form in time
      {
        std::lock_guard<std::mutex> lock(mu);
        seen[round->round].emplace_back(id, *round);
      }
      const int steps = std::uniform_int_distribution<int>(2, 20)(rng);
      for (int i = 0; i < steps; ++i) {
        if (!(*r)->keep_alive().ok()) return;
        absl::StatusOr<Health> h = (*r)->health(*round);
        if (!h.ok()) return;
        if (h->must_restart()) {
          (void)(*r)->restart_round(*round, h->reason);
          break;
        }
        absl::SleepFor(absl::Milliseconds(30));
      }
      const int dice = std::uniform_int_distribution<int>(0, 9)(rng);
      if (dice == 0) return;  // leaves without a word
      if (dice == 1) (void)(*r)->restart_round(*round, "a worker failed");
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(node, 1000 + i);
  std::mt19937 spawn_rng(7);
  while (absl::Now() < end - absl::Seconds(2)) {
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(100, 600)(spawn_rng)));
    threads.emplace_back(node, spawn_rng());
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(seen.empty());
  for (const auto& [round, infos] : seen) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const RoundInfo& first = infos[0].second;
    EXPECT_GE(first.num_nodes, kMin);
    EXPECT_LE(first.num_nodes, kMax);
    EXPECT_EQ(std::set<std::string>(first.nodes.begin(), first.nodes.end()).size(),
              first.nodes.size());
    std::set<int> ranks;
    for (const auto& [id, info] : infos) {
      EXPECT_EQ(info.nodes, first.nodes);
      EXPECT_EQ(info.num_nodes, first.num_nodes);
      ASSERT_LT(info.node_rank, info.num_nodes);
      EXPECT_EQ(info.nodes[info.node_rank], id);  // each node is where the list says
      EXPECT_TRUE(ranks.insert(info.node_rank).second) << "rank " << info.node_rank << " twice";
    }
    EXPECT_LE(static_cast<int>(infos.size()), first.num_nodes);
  }
}

}  // namespace
}  // namespace ember::distributed::elastic
