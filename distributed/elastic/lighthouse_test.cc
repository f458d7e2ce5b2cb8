// The lighthouse on loopback with its clients on threads: quorums of every
// group that is alive, the same quorum_id while the members stay, a group
// that stops heartbeating left out, a late one left out after join_timeout,
// requests that time out, a request whose caller went away left out, a
// client's cancel(), 1000 groups at once, and the errors.
#include "distributed/elastic/lighthouse.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/elastic/lighthouse.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ember::distributed::elastic {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Ids(const Quorum& q) {
  std::vector<std::string> ids;
  for (const QuorumMember& m : q.members) ids.push_back(m.replica_id);
  return ids;
}

// Each of `ids` asks for a quorum at once (step = its index); their answers.
std::vector<absl::StatusOr<Quorum>> AskTogether(const std::string& address,
                                                const std::vector<std::string>& ids,
                                                absl::Duration timeout = absl::Seconds(20)) {
  std::vector<absl::StatusOr<Quorum>> out(ids.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::unique_ptr<LighthouseClient>> c = LighthouseClient::create(address);
      if (!c.ok()) {
        out[i] = c.status();
        return;
      }
      out[i] = (*c)->quorum({.replica_id = ids[i], .address = absl::StrCat("host:", i),
                             .step = static_cast<int64_t>(i)},
                            timeout);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(LighthouseTest, EveryLiveGroupInOneQuorumAndTheSameIdWhileTheyStay) {
  auto server = LighthouseServer::create({.min_replicas = 3, .join_timeout = absl::Seconds(30)});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  std::vector<absl::StatusOr<Quorum>> first = AskTogether(address, {"c", "a", "b"});
  for (const auto& q : first) {
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_THAT(Ids(*q), ::testing::ElementsAre("a", "b", "c"));
    EXPECT_EQ(q->max_step, 2);
    EXPECT_EQ(q->quorum_id, first[0]->quorum_id);
    EXPECT_EQ(q->members[0].address, "host:1");  // "a" asked second
  }
  std::vector<absl::StatusOr<Quorum>> second = AskTogether(address, {"a", "b", "c"});
  for (const auto& q : second) {
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(q->quorum_id, first[0]->quorum_id) << "the same members keep the quorum id";
    EXPECT_EQ(q->decision, first[0]->decision + 1);
  }
  EXPECT_EQ((*server)->quorums_decided(), 2);
}

TEST(LighthouseTest, AGroupThatStopsHeartbeatingIsLeftOut) {
  auto server = LighthouseServer::create({.min_replicas = 1,
                                          .join_timeout = absl::Seconds(30),
                                          .heartbeat_timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  // Both known alive first, so neither forms a quorum alone.
  auto client = LighthouseClient::create(address);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->heartbeat("a", absl::Seconds(5)).ok());
  ASSERT_TRUE((*client)->heartbeat("b", absl::Seconds(5)).ok());
  std::vector<absl::StatusOr<Quorum>> all = AskTogether(address, {"a", "b"});
  ASSERT_TRUE(all[0].ok()) << all[0].status();
  ASSERT_THAT(Ids(*all[0]), ::testing::ElementsAre("a", "b"));
  // "b" is gone (no more requests or heartbeats): "a" alone forms the next
  // quorum once b's heartbeat is older than heartbeat_timeout, with a new id.
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<Quorum>> alone = AskTogether(address, {"a"});
  ASSERT_TRUE(alone[0].ok()) << alone[0].status();
  EXPECT_THAT(Ids(*alone[0]), ::testing::ElementsAre("a"));
  EXPECT_EQ(alone[0]->quorum_id, all[0]->quorum_id + 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(LighthouseTest, ALiveButLateGroupIsLeftOutAfterTheJoinTimeout) {
  auto server = LighthouseServer::create({.min_replicas = 2,
                                          .join_timeout = absl::Milliseconds(200),
                                          .heartbeat_timeout = absl::Seconds(60)});
  ASSERT_TRUE(server.ok()) << server.status();
  auto late = LighthouseClient::create((*server)->address());
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE((*late)->heartbeat("late", absl::Seconds(5)).ok());
  std::vector<absl::StatusOr<Quorum>> q = AskTogether((*server)->address(), {"a", "b"});
  ASSERT_TRUE(q[0].ok()) << q[0].status();
  EXPECT_THAT(Ids(*q[0]), ::testing::ElementsAre("a", "b"));
}

// A caller that went away (its process died: gRPC cancels the call) while
// its request was pending is no member, though its last request keeps it
// "alive" for heartbeat_timeout.
TEST(LighthouseTest, ARequestWhoseCallerWentAwayIsLeftOut) {
  auto server = LighthouseServer::create({.min_replicas = 2,
                                          .join_timeout = absl::Seconds(60),
                                          .heartbeat_timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = proto::Lighthouse::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext gone;
  gone.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  std::thread asker([&] {
    proto::QuorumRequest request;
    request.mutable_member()->set_replica_id("gone");
    proto::QuorumResponse response;
    EXPECT_EQ(stub->Quorum(&gone, request, &response).error_code(), grpc::StatusCode::CANCELLED);
  });
  absl::SleepFor(absl::Milliseconds(200));  // "gone" is pending
  gone.TryCancel();
  asker.join();
  std::vector<absl::StatusOr<Quorum>> q = AskTogether((*server)->address(), {"a", "b"});
  ASSERT_TRUE(q[0].ok()) << q[0].status();
  EXPECT_THAT(Ids(*q[0]), ::testing::ElementsAre("a", "b"));
  ASSERT_TRUE(q[1].ok()) << q[1].status();
  EXPECT_THAT(Ids(*q[1]), ::testing::ElementsAre("a", "b"));
}

// cancel() ends the calls in flight (kCancelled, not the deadline an hour
// away) and leaves the client usable.
TEST(LighthouseTest, CancelEndsACallInFlightAndLaterCallsWork) {
  auto server = LighthouseServer::create({.min_replicas = 2,
                                          .join_timeout = absl::Seconds(60),
                                          .heartbeat_timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = LighthouseClient::create((*server)->address());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<Quorum> cancelled = absl::UnknownError("not run");
  std::thread asker([&] {
    cancelled = (*client)->quorum({.replica_id = "a", .address = "host:1"}, absl::Hours(1));
  });
  absl::SleepFor(absl::Milliseconds(200));  // "a" is pending, alone below min_replicas
  (*client)->cancel();
  asker.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_THAT(cancelled.status().message(), HasSubstr("quorum of a"));
  absl::StatusOr<Quorum> again = absl::UnknownError("not run");
  std::thread a([&] {
    again = (*client)->quorum({.replica_id = "a", .address = "host:1"}, absl::Seconds(20));
  });
  std::vector<absl::StatusOr<Quorum>> b = AskTogether((*server)->address(), {"b"});
  a.join();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(Ids(*again), ::testing::ElementsAre("a", "b"));
  ASSERT_TRUE(b[0].ok()) << b[0].status();
}

TEST(LighthouseTest, TooFewGroupsTimeOutAndLeaveNothingPending) {
  auto server = LighthouseServer::create({.min_replicas = 2});
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<absl::StatusOr<Quorum>> lone =
      AskTogether((*server)->address(), {"a"}, absl::Milliseconds(300));
  EXPECT_EQ(lone[0].status().code(), absl::StatusCode::kDeadlineExceeded) << lone[0].status();
  EXPECT_THAT(lone[0].status().message(), HasSubstr("quorum of a"));
  // "a" did not stay pending: "b" and "c" form a quorum of their own.
  std::vector<absl::StatusOr<Quorum>> pair = AskTogether((*server)->address(), {"b", "c"});
  ASSERT_TRUE(pair[0].ok()) << pair[0].status();
  EXPECT_THAT(Ids(*pair[0]), ::testing::ElementsAre("b", "c"));
}

TEST(LighthouseTest, AThousandGroupsAtOnce) {
  auto server = LighthouseServer::create({.min_replicas = 1000, .join_timeout = absl::Seconds(60)});
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(absl::StrCat("r", 1000 + i));
  std::vector<absl::StatusOr<Quorum>> q = AskTogether((*server)->address(), ids, absl::Seconds(60));
  for (const auto& one : q) {
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(one->members.size(), 1000u);
    EXPECT_EQ(one->max_step, 999);
  }
}

TEST(LighthouseTest, Errors) {
  EXPECT_THAT(LighthouseServer::create({.min_replicas = 0}).status().message(),
              HasSubstr("min_replicas must be at least 1, got 0"));
  EXPECT_THAT(LighthouseClient::create("nohostport").status().message(),
              HasSubstr("'nohostport' is not host:port"));
  auto server = LighthouseServer::create({});
  ASSERT_TRUE(server.ok());
  auto c = LighthouseClient::create((*server)->address());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->quorum({.replica_id = ""}, absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string gone = (*server)->address();
  server->reset();
  auto orphan = LighthouseClient::create(gone);
  ASSERT_TRUE(orphan.ok());
  const absl::Status s = (*orphan)->quorum({.replica_id = "a"}, absl::Milliseconds(300)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

}  // namespace
}  // namespace ember::distributed::elastic
