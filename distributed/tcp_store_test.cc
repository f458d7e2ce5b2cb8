// TcpStore: the shared store suite, then the server's robustness byte by
// byte (garbage, requests without the handshake, lengths of 4 GiB and more,
// unknown queries, a port in use), the handshake, clients that start before
// the server, shutdown waking waiters, the extended and queue API, the
// limits, thousands of connections, and ranks as processes.
#include "distributed/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <poll.h>
#include <sys/resource.h>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/store_testing.h"
#include "distributed/tcp_store_wire.h"
#include "distributed/testing/free_port.h"
#include "distributed/testing/store_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::FreePort;

using ::testing::HasSubstr;
using testing::StoreConformanceTest;
using testing::StoreHarness;
using testing::StoreImpl;

std::unique_ptr<TcpStore> Client(int port, absl::Duration timeout = absl::Seconds(10)) {
  TcpStoreOptions options;
  options.port = port;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

class TcpStoreHarness : public StoreHarness {
 public:
  TcpStoreHarness() : server_(TcpStoreServer::start({}).value()) {}
  std::shared_ptr<Store> NewClient() override { return Client(server_->port()); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

INSTANTIATE_TEST_SUITE_P(All, StoreConformanceTest,
                         ::testing::Values(StoreImpl{
                             "TcpStore",
                             [] { return std::unique_ptr<StoreHarness>(new TcpStoreHarness); }}),
                         testing::StoreImplName);

TEST(TcpStoreTest, ServerOwnerIsAClientOfItsOwnServer) {
  TcpStoreOptions options;
  options.is_server = true;
  options.timeout = absl::Seconds(10);
  std::unique_ptr<TcpStore> rank0 = TcpStore::create(options).value();
  ASSERT_GT(rank0->port(), 0);
  std::unique_ptr<TcpStore> rank1 = Client(rank0->port());
  ASSERT_TRUE(rank0->set("from0", "a").ok());
  EXPECT_EQ(rank1->get("from0", absl::Seconds(5)).value(), "a");
}

TEST(TcpStoreTest, ClientMayStartBeforeTheServer) {
  int port = FreePort();
  absl::StatusOr<std::unique_ptr<TcpStore>> early;
  std::thread client([&] {
    TcpStoreOptions options;
    options.port = port;
    options.timeout = absl::Seconds(20);
    early = TcpStore::create(options);
  });
  absl::SleepFor(absl::Milliseconds(300));
  std::unique_ptr<TcpStoreServer> server = TcpStoreServer::start({.port = port}).value();
  client.join();
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE((*early)->set("k", "v").ok());
}

TEST(TcpStoreTest, NoServerIsUnavailableWithinTheTimeoutNamingTheAddress) {
  int port = FreePort();
  TcpStoreOptions options;
  options.port = port;
  options.timeout = absl::Milliseconds(300);
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr("127.0.0.1:" + std::to_string(port)));
}

TEST(TcpStoreTest, PortInUseNamesThePort) {
  std::unique_ptr<TcpStoreServer> first = TcpStoreServer::start({}).value();
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> second =
      TcpStoreServer::start({.port = first->port()});
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr("port " + std::to_string(first->port()) + " is already in use"));
}

TEST(TcpStoreTest, BadPortsAreInvalidArguments) {
  EXPECT_EQ(TcpStoreServer::start({.port = 70000}).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpStoreOptions options;
  options.port = 0;  // a client needs the server's port
  EXPECT_EQ(TcpStore::create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// Resident memory of this process, in bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

using Raw = testing::StoreWire;

std::string SetRequest(std::string_view key, std::string_view value) {
  std::string r;
  wire::PutQuery(r, wire::Query::kSet);
  wire::PutBytes(r, key);
  wire::PutBytes(r, value);
  return r;
}

std::string KeysRequest(wire::Query query, const std::vector<std::string>& keys) {
  std::string r;
  wire::PutQuery(r, query);
  wire::PutValue<uint64_t>(r, keys.size());
  for (const std::string& key : keys) wire::PutBytes(r, key);
  return r;
}

std::string EmberWaitRequest(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::string r = KeysRequest(wire::Query::kEmberWait, keys);
  wire::PutValue<int64_t>(r, absl::ToInt64Microseconds(timeout));
  return r;
}

TEST(TcpStoreTest, ServerSurvivesGarbage) {
  std::unique_ptr<TcpStoreServer> server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> before = Client(server->port());
  ASSERT_TRUE(before->set("k", "v").ok());

  std::mt19937 random(42);
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 16; ++i) {
    auto raw = std::make_unique<Raw>(server->port(), /*validate=*/i % 2 == 0);
    ASSERT_TRUE(raw->ok());
    std::string junk(4096, '\0');
    for (char& c : junk) c = static_cast<char>(random());
    raw->Send(junk);
    if (i % 4 < 2) idle.push_back(std::move(raw));  // some stay open
  }
  std::unique_ptr<TcpStore> after = Client(server->port());
  EXPECT_EQ(after->get("k", absl::Seconds(5)).value(), "v");
  EXPECT_TRUE(before->set("k2", "v2").ok());
  EXPECT_EQ(after->get("k2", absl::Seconds(5)).value(), "v2");
  EXPECT_EQ(after->num_keys().value(), 2) << "garbage must not have stored anything";
}

TEST(TcpStoreTest, RequestsBeforeTheHandshakeAndUnknownQueriesCloseThatConnectionOnly) {
  std::unique_ptr<TcpStoreServer> server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  Raw unvalidated(server->port(), /*validate=*/false);
  unvalidated.Send(SetRequest("/sneaky", "x"));
  EXPECT_TRUE(unvalidated.Closed());
  Raw wrong_magic(server->port(), /*validate=*/false);
  std::string r;
  wire::PutQuery(r, wire::Query::kValidate);
  wire::PutValue<uint32_t>(r, 0x12345678);
  wrong_magic.Send(r);
  EXPECT_TRUE(wrong_magic.Closed());
  Raw unknown(server->port());
  unknown.Send(std::string(1, static_cast<char>(0x7f)));
  EXPECT_TRUE(unknown.Closed());
  EXPECT_FALSE(client->check({"sneaky"}).value());
  EXPECT_TRUE(client->set("still", "served").ok());
  EXPECT_EQ(client->get("still").value(), "served");
}

TEST(TcpStoreTest, HugeLengthsAreRefusedBeforeTheirBytesArrive) {
  std::unique_ptr<TcpStoreServer> server =
      TcpStoreServer::start({.max_message_bytes = 1 << 20}).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  const int64_t resident_before = ResidentBytes();
  for (uint64_t length : {uint64_t{0xffffffff}, uint64_t{1} << 40, ~uint64_t{0}}) {
    Raw raw(server->port());
    std::string r;
    wire::PutQuery(r, wire::Query::kSet);
    wire::PutBytes(r, "/big");
    wire::PutValue<uint64_t>(r, length);  // the value's length, and then 2 MiB of it
    raw.Send(r);
    raw.Send(std::string(2 << 20, 'z'));
    EXPECT_TRUE(raw.Closed()) << "a value of " << length << " bytes was not refused";
  }
  {
    Raw raw(server->port());  // a key count beyond c10d's bound
    std::string r;
    wire::PutQuery(r, wire::Query::kWait);
    wire::PutValue<uint64_t>(r, uint64_t{1} << 40);
    raw.Send(r);
    EXPECT_TRUE(raw.Closed());
  }
  EXPECT_LT(ResidentBytes() - resident_before, int64_t{64} << 20);
  EXPECT_EQ(client->num_keys().value(), 0) << "a refused set must not have stored anything";
  EXPECT_TRUE(client->set("still", "serving").ok());
  EXPECT_EQ(client->get("still", absl::Seconds(5)).value(), "serving");
}

TEST(TcpStoreTest, ClientRefusesValuesBeyondMaxMessageBytes) {
  std::unique_ptr<TcpStoreServer> server =
      TcpStoreServer::start({.max_message_bytes = 1 << 20}).value();
  TcpStoreOptions options;
  options.port = server->port();
  options.max_message_bytes = 1 << 20;
  std::unique_ptr<TcpStore> client = TcpStore::create(options).value();
  absl::Status too_big = client->set("big", std::string(2 << 20, 'x'));
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("max_message_bytes"));
  EXPECT_TRUE(client->set("small", "ok").ok());
  EXPECT_EQ(client->get("small", absl::Seconds(5)).value(), "ok");
}

TEST(TcpStoreTest, ASlowReaderIsNotReadUntilItCatchesUp) {
  std::unique_ptr<TcpStoreServer> server =
      TcpStoreServer::start({.max_buffer_bytes = 1 << 20}).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  ASSERT_TRUE(client->set("value", std::string(256 << 10, 'v')).ok());
  ASSERT_TRUE(client->check({"value"}).value());  // the set has landed: it had no reply
  // 64 GETs of 256 KiB, not read: the server stops after about 1 MiB of
  // replies (plus what the socket buffers hold) instead of queueing 16 MiB.
  Raw reader(server->port());
  std::string gets;
  for (int i = 0; i < 64; ++i) {
    wire::PutQuery(gets, wire::Query::kGet);
    wire::PutBytes(gets, "/value");
  }
  reader.Send(gets);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(client->set("others", "served").ok());
  EXPECT_EQ(client->get("others").value(), "served");
  // Read them all: every reply comes, in order, once the reader reads.
  for (int i = 0; i < 64; ++i) {
    std::optional<uint64_t> length = reader.ReadValue<uint64_t>();
    ASSERT_TRUE(length.has_value()) << "reply " << i;
    ASSERT_EQ(*length, uint64_t{256} << 10);
    ASSERT_TRUE(reader.Read(*length).has_value());
  }
}

TEST(TcpStoreTest, HandshakeWithSomethingElseFailsInTime) {
  // A listener that answers like an HTTP/1 server.
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::atomic<bool> stop{false};
  std::thread responder([&] {
    while (!stop) {
      int fd = accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      (void)!write(fd, "HTTP/1.1 400 Bad Request\r\n\r\n", 28);
      close(fd);
    }
  });
  TcpStoreOptions options;
  options.port = ntohs(addr.sin_port);
  options.timeout = absl::Seconds(1);
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("not a TCPStore"));
  stop = true;
  shutdown(listener, SHUT_RDWR);
  close(listener);
  responder.join();
}

TEST(TcpStoreTest, ServerShutdownEndsWaitsAndLaterCallsAreUnavailable) {
  auto server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  absl::Status waited;
  std::thread waiter([&] { waited = client->wait({"never"}, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(200));
  absl::Time start = absl::Now();
  server.reset();
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  client->set_timeout(absl::Seconds(2));
  EXPECT_EQ(client->set("k", "v").code(), absl::StatusCode::kUnavailable);
}

TEST(TcpStoreTest, TimeoutErrorNamesTheServerAndTheKey) {
  auto server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  absl::Status status = client->wait({"rank/3"}, absl::Milliseconds(100));
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("TcpStore 127.0.0.1:" + std::to_string(server->port())));
  EXPECT_THAT(status.message(), HasSubstr("rank/3"));
}

// Child processes: the test re-runs this binary with one test selected and
// an environment variable set (a forked copy of a process that already runs
// the server's thread starts clean). Returns the child's pid.
pid_t StartChild(const std::string& gtest_filter, const char* env_name,
                 const std::string& env_value) {
  pid_t pid = fork();
  if (pid == 0) {
    // The child is a test run of its own: keep it off this run's outputs.
    for (const char* name : {"XML_OUTPUT_FILE", "TEST_PREMATURE_EXIT_FILE", "GTEST_OUTPUT"})
      unsetenv(name);
    setenv(env_name, env_value.c_str(), 1);
    std::string filter = "--gtest_filter=" + gtest_filter;
    execl("/proc/self/exe", "tcp_store_test", filter.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// Ranks as processes.
constexpr char kChildPortEnv[] = "EMBER_TCP_STORE_TEST_CHILD_PORT";

TEST(TcpStoreChildTest, Client) {
  const char* port = std::getenv(kChildPortEnv);
  if (port == nullptr)
    GTEST_SKIP() << "runs only as a child of TcpStoreTest.ProcessesShareTheServer";
  std::unique_ptr<TcpStore> store = Client(std::atoi(port));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(store->add("sum", 1).ok());
  ASSERT_TRUE(store->add("children_done", 1).ok());
  ASSERT_TRUE(store->wait({"parent_saw_all"}, absl::Seconds(20)).ok());
}

TEST(TcpStoreTest, ProcessesShareTheServer) {
  auto server = TcpStoreServer::start({}).value();
  constexpr int kChildren = 3;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid =
        StartChild("TcpStoreChildTest.Client", kChildPortEnv, std::to_string(server->port()));
    ASSERT_GE(pid, 0);
    children.push_back(pid);
  }
  std::unique_ptr<TcpStore> parent = Client(server->port());
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (parent->get("children_done", absl::Seconds(1)).value_or("0") !=
             std::to_string(kChildren) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(parent->get("sum", absl::Seconds(1)).value_or(""), std::to_string(20 * kChildren));
  ASSERT_TRUE(parent->set("parent_saw_all", "1").ok());
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
}

// Polls `condition` every 10 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& condition, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(TcpStoreTest, WaitsBeyondTheLimitsAreRefusedNamingTheLimit) {
  TcpStoreServerOptions options;
  options.max_pending_waits_per_connection = 3;
  options.max_pending_waits = 5;
  options.max_pending_wait_bytes = 64 << 10;
  auto server = TcpStoreServer::start(options).value();
  // One connection holds three waits; its fourth is refused at once.
  Raw a(server->port());
  for (int i = 0; i < 4; ++i) a.Send(EmberWaitRequest({"/go"}, absl::Seconds(30)));
  std::optional<uint8_t> code = a.ReadValue<uint8_t>();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, static_cast<uint8_t>(absl::StatusCode::kResourceExhausted));
  std::optional<uint64_t> length = a.ReadValue<uint64_t>();
  ASSERT_TRUE(length.has_value());
  EXPECT_THAT(a.Read(*length).value_or(""), HasSubstr("max_pending_waits_per_connection=3"));
  ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == 3; }, absl::Seconds(10)));
  // Two more from clients; then the server-wide limit.
  std::unique_ptr<TcpStore> b = Client(server->port());
  std::vector<std::thread> waiters;
  std::atomic<int> woken{0};
  for (int i = 0; i < 2; ++i)
    waiters.emplace_back([&] { woken += b->wait({"go"}, absl::Seconds(30)).ok(); });
  ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == 5; }, absl::Seconds(10)));
  absl::StatusOr<std::string> server_wide = b->get("go", absl::Seconds(30));
  EXPECT_EQ(server_wide.status().code(), absl::StatusCode::kResourceExhausted)
      << server_wide.status();
  EXPECT_THAT(server_wide.status().message(), HasSubstr("max_pending_waits=5"));
  // Calls that need not wait still work, and the set wakes every admitted wait.
  EXPECT_TRUE(b->set("present", "1").ok());
  EXPECT_TRUE(b->wait({"present"}, absl::Seconds(30)).ok());
  ASSERT_TRUE(b->set("go", "1").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(woken.load(), 2);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.ReadValue<uint8_t>().value_or(99), 0) << "wait " << i;
  EXPECT_TRUE(Eventually([&] { return server->num_pending_waits() == 0; }, absl::Seconds(10)));

  std::vector<std::string> many;
  for (int i = 0; i < 10000; ++i) many.push_back("many/" + std::to_string(i));
  absl::Status bytes = b->wait(many, absl::Seconds(30));
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted) << bytes;
  EXPECT_THAT(bytes.message(), HasSubstr("max_pending_wait_bytes=65536"));
}

TEST(TcpStoreTest, BadLimitsAreInvalidArguments) {
  TcpStoreServerOptions options;
  options.max_pending_waits = 0;
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("max_pending_waits=0"));
}

// c10d's own flow, as PyTorch's client drives it: WAIT, then CANCEL_WAIT
// when its clock runs out; PING; an ADD on text closes the connection.
TEST(TcpStoreTest, C10dWaitCancelPingAndAddOnText) {
  auto server = TcpStoreServer::start({}).value();
  Raw raw(server->port());
  raw.Send(KeysRequest(wire::Query::kWait, {"/never"}));
  ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == 1; }, absl::Seconds(10)));
  std::string cancel;
  wire::PutQuery(cancel, wire::Query::kCancelWait);
  raw.Send(cancel);
  EXPECT_EQ(raw.ReadValue<uint8_t>().value_or(99),
            static_cast<uint8_t>(wire::WaitReply::kWaitCanceled));
  EXPECT_EQ(server->num_pending_waits(), 0);
  std::string ping;
  wire::PutQuery(ping, wire::Query::kPing);
  wire::PutValue<uint32_t>(ping, 0xfeedbeef);
  raw.Send(ping);
  EXPECT_EQ(raw.ReadValue<uint32_t>().value_or(0), 0xfeedbeefu);
  // A WAIT that a SET from another connection ends.
  raw.Send(KeysRequest(wire::Query::kWait, {"/later"}));
  std::unique_ptr<TcpStore> client = Client(server->port());
  ASSERT_TRUE(client->set("later", "x").ok());
  EXPECT_EQ(raw.ReadValue<uint8_t>().value_or(99),
            static_cast<uint8_t>(wire::WaitReply::kStopWaiting));
  ASSERT_TRUE(client->set("text", "hello").ok());
  std::string add;
  wire::PutQuery(add, wire::Query::kAdd);
  wire::PutBytes(add, "/text");
  wire::PutValue<int64_t>(add, 1);
  raw.Send(add);
  EXPECT_TRUE(raw.Closed());
  EXPECT_EQ(client->get("text").value(), "hello");
}

TEST(TcpStoreTest, ClosedConnectionsTakeTheirWaitsWithThem) {
  auto server = TcpStoreServer::start({}).value();
  {
    Raw raw(server->port());
    raw.Send(EmberWaitRequest({"/never"}, absl::Hours(1)));
    raw.Send(KeysRequest(wire::Query::kWait, {"/never"}));
    ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == 2; }, absl::Seconds(10)));
  }
  EXPECT_TRUE(Eventually([&] { return server->num_pending_waits() == 0; }, absl::Seconds(10)));
  EXPECT_TRUE(Eventually([&] { return server->num_connections() == 0; }, absl::Seconds(10)));
}

TEST(TcpStoreTest, QueuesListKeysAndBarrier) {
  auto server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> a = Client(server->port());
  std::unique_ptr<TcpStore> b = Client(server->port());
  EXPECT_TRUE(a->server_is_ember());
  EXPECT_EQ(a->queue_len("q").value(), 0);
  EXPECT_EQ(a->queue_pop("q", /*block=*/false).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(a->queue_push("q", "first").ok());
  ASSERT_TRUE(a->queue_push("q", "second").ok());
  EXPECT_EQ(b->queue_len("q").value(), 2);
  EXPECT_EQ(b->queue_pop("q").value(), "first");
  EXPECT_EQ(b->queue_pop("q").value(), "second");
  // A blocking pop waits for the push; a push wakes one popper.
  std::thread pusher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(a->queue_push("q", "late").ok());
  });
  EXPECT_EQ(b->queue_pop("q", true, absl::Seconds(10)).value(), "late");
  pusher.join();
  absl::StatusOr<std::string> empty = b->queue_pop("q", true, absl::Milliseconds(100));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDeadlineExceeded) << empty.status();
  EXPECT_THAT(empty.status().message(), HasSubstr("'q'"));

  ASSERT_TRUE(a->set("x", "1").ok());
  ASSERT_TRUE(a->set("y/z", "2").ok());
  std::vector<std::string> keys = b->list_keys().value();
  std::sort(keys.begin(), keys.end());
  EXPECT_THAT(keys, ::testing::ElementsAre("x", "y/z"));

  std::thread other([&] { EXPECT_TRUE(b->barrier("sync", 2, absl::Seconds(10)).ok()); });
  EXPECT_TRUE(a->barrier("sync", 2, absl::Seconds(10)).ok());
  other.join();
  absl::Status alone = a->barrier("lonely", 2, absl::Milliseconds(100));
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  EXPECT_THAT(alone.message(), HasSubstr("1 of 2"));
  EXPECT_TRUE(Eventually([&] { return server->num_pending_waits() == 0; }, absl::Seconds(10)));
}

TEST(TcpStoreTest, NumWorkersWaitsForEveryClientAsTorchDoes) {
  int port = FreePort();
  absl::StatusOr<std::unique_ptr<TcpStore>> rank0;
  std::thread server_thread([&] {
    TcpStoreOptions options;
    options.port = port;
    options.is_server = true;
    options.num_workers = 3;
    options.timeout = absl::Seconds(20);
    rank0 = TcpStore::create(options);
  });
  std::vector<std::unique_ptr<TcpStore>> others;
  for (int i = 0; i < 2; ++i) {
    TcpStoreOptions options;
    options.port = port;
    options.num_workers = 3;
    options.timeout = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create(options);
    ASSERT_TRUE(store.ok()) << store.status();
    others.push_back(std::move(*store));
  }
  server_thread.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_EQ((*rank0)->num_keys().value(), 1) << "torch's \"init/\" key";

  TcpStoreOptions alone;
  alone.is_server = true;
  alone.num_workers = 2;
  alone.timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<TcpStore>> waited = TcpStore::create(alone);
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.status().message(), HasSubstr("1 of 2 joined"));
}

// Raises this process's descriptor limit as far as it may go; the limit it
// got.
rlim_t RaiseDescriptorLimit() {
  rlimit limit = {};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

// Thousands of waiting connections (where the gRPC store stopped answering
// at about 1,500): each validates and waits; one write wakes them all.
TEST(TcpStoreTest, FourThousandWaitingConnectionsAreAllWoken) {
  constexpr int kConnections = 4096;
  if (RaiseDescriptorLimit() < 2 * kConnections + 256)
    GTEST_SKIP() << "needs " << 2 * kConnections + 256 << " descriptors (ulimit -n)";
  auto server = TcpStoreServer::start({.max_pending_waits = 2 * kConnections}).value();
  std::vector<std::unique_ptr<Raw>> raws;
  for (int i = 0; i < kConnections; ++i) {
    raws.push_back(std::make_unique<Raw>(server->port()));
    ASSERT_TRUE(raws.back()->ok()) << "connection " << i;
    std::string add;
    wire::PutQuery(add, wire::Query::kAdd);
    wire::PutBytes(add, "/arrived");
    wire::PutValue<int64_t>(add, 1);
    raws.back()->Send(add + KeysRequest(wire::Query::kWait, {"/go"}));
  }
  std::set<int64_t> counts;
  for (auto& raw : raws) counts.insert(raw->ReadValue<int64_t>().value_or(-1));
  EXPECT_EQ(counts.size(), static_cast<size_t>(kConnections)) << "every add counted once";
  EXPECT_EQ(*counts.begin(), 1);
  EXPECT_EQ(*counts.rbegin(), kConnections);
  ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == kConnections; },
                         absl::Seconds(30)));
  std::unique_ptr<TcpStore> client = Client(server->port());
  ASSERT_TRUE(client->set("go", "1").ok());
  int woken = 0;
  for (auto& raw : raws)
    woken += raw->ReadValue<uint8_t>().value_or(99) ==
             static_cast<uint8_t>(wire::WaitReply::kStopWaiting);
  EXPECT_EQ(woken, kConnections);
  EXPECT_EQ(server->num_connections(), kConnections + 1);  // and the client
}

// A flood: many connections, each asking for more waits than the server lets
// it hold, from a child process (so this process's memory is the server's).
constexpr char kFloodPortEnv[] = "EMBER_TCP_STORE_TEST_FLOOD_PORT";
constexpr int kFloodConnections = 64;
constexpr int kFloodWaitsPerConnection = 32;
constexpr int kFloodLimitPerConnection = 16;

TEST(TcpStoreChildTest, Flood) {
  const char* port = std::getenv(kFloodPortEnv);
  if (port == nullptr)
    GTEST_SKIP() << "runs only as a child of TcpStoreTest.ConnectionFloodIsBounded";
  std::vector<std::string> keys;
  for (int i = 0; i < 500; ++i) keys.push_back(absl::StrCat("/flood/never/", i, "/", std::string(20, 'x')));
  const std::string request = EmberWaitRequest(keys, absl::Minutes(10));
  std::vector<std::unique_ptr<Raw>> raws;
  int refused = 0, other = 0;
  for (int c = 0; c < kFloodConnections; ++c) {
    raws.push_back(std::make_unique<Raw>(std::atoi(port)));
    for (int w = 0; w < kFloodWaitsPerConnection; ++w) raws.back()->Send(request);
  }
  for (auto& raw : raws) {
    for (int w = kFloodLimitPerConnection; w < kFloodWaitsPerConnection; ++w) {
      std::optional<uint8_t> code = raw->ReadValue<uint8_t>(absl::Seconds(60));
      std::optional<uint64_t> length = raw->ReadValue<uint64_t>(absl::Seconds(60));
      if (code && length && raw->Read(*length)) {
        (*code == static_cast<uint8_t>(absl::StatusCode::kResourceExhausted) ? refused : other)++;
      } else {
        ++other;
      }
    }
  }
  std::unique_ptr<TcpStore> store = Client(std::atoi(port), absl::Seconds(30));
  ASSERT_TRUE(store->set("flood/refused", std::to_string(refused)).ok());
  ASSERT_TRUE(store->set("flood/other", std::to_string(other)).ok());
  pause();
}

// VmRSS of this process, in bytes.
int64_t VmRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

TEST(TcpStoreTest, ConnectionFloodIsBoundedAndLeavesNothingBehind) {
  TcpStoreServerOptions options;
  options.max_pending_waits_per_connection = kFloodLimitPerConnection;
  auto server = TcpStoreServer::start(options).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  // Warm up this process's side (client, server thread) before the baseline.
  ASSERT_TRUE(client->set("warm", "1").ok());
  ASSERT_EQ(client->wait({"nothing"}, absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);
  const int64_t before = VmRssBytes();

  pid_t flood =
      StartChild("TcpStoreChildTest.Flood", kFloodPortEnv, std::to_string(server->port()));
  ASSERT_GT(flood, 0);
  absl::StatusOr<std::string> refused = client->get("flood/refused", absl::Seconds(60));
  ASSERT_TRUE(refused.ok()) << refused.status();
  // Each connection holds its limit; the rest were refused at once.
  EXPECT_EQ(server->num_pending_waits(), kFloodConnections * kFloodLimitPerConnection);
  EXPECT_EQ(*refused, std::to_string(kFloodConnections *
                                     (kFloodWaitsPerConnection - kFloodLimitPerConnection)));
  EXPECT_EQ(client->get("flood/other", absl::Seconds(5)).value_or(""), "0");
  const int64_t during = VmRssBytes();

  // A well-behaved client is served during the flood: its own waits too.
  std::unique_ptr<TcpStore> other = Client(server->port());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->set("during", "yes").ok());
  });
  EXPECT_EQ(client->get("during", absl::Seconds(10)).value_or(""), "yes");
  setter.join();
  EXPECT_EQ(other->add("counter", 2).value_or(-1), 2);

  // The flood's connections close with its process: the server lets go of
  // every wait they held, and of the memory.
  kill(flood, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(flood, &status, 0), flood);
  EXPECT_TRUE(Eventually([&] { return server->num_pending_waits() == 0; }, absl::Seconds(20)))
      << server->num_pending_waits() << " waits still pending";
  int64_t after = VmRssBytes();
  EXPECT_TRUE(Eventually(
      [&] {
        after = VmRssBytes();
        return after - before < (int64_t{16} << 20);
      },
      absl::Seconds(10)))
      << "resident memory: " << (before >> 20) << " MiB before the flood, " << (during >> 20)
      << " MiB during, " << (after >> 20) << " MiB after";
  std::printf("resident memory: %lld MiB before the flood, %lld MiB during, %lld MiB after\n",
              static_cast<long long>(before >> 20), static_cast<long long>(during >> 20),
              static_cast<long long>(after >> 20));
  EXPECT_EQ(client->get("during", absl::Seconds(5)).value_or(""), "yes");
  EXPECT_TRUE(client->set("after", "ok").ok());
}

}  // namespace
}  // namespace ember::distributed
