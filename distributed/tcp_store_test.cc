// TcpStore: the shared store suite with one gRPC client per store client,
// then the server's robustness (garbage, a huge frame length, oversized and
// malformed messages, a port in use), the handshake, clients that start
// before the server, shutdown waking waiters, and ranks as processes.
#include "distributed/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
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
#include "distributed/tcp_store.grpc.pb.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
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

// A connected TCP socket to 127.0.0.1:port, or -1.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

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

TEST(TcpStoreTest, ServerSurvivesGarbageAndAHugeFrameLength) {
  std::unique_ptr<TcpStoreServer> server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> before = Client(server->port());
  ASSERT_TRUE(before->set("k", "v").ok());

  std::mt19937 random(42);
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    int fd = Connect(server->port());
    ASSERT_GE(fd, 0);
    std::string junk(4096, '\0');
    for (char& c : junk) c = static_cast<char>(random());
    (void)!write(fd, junk.data(), junk.size());
    if (i % 2 == 0)
      close(fd);
    else
      idle.push_back(fd);  // some stay open, silent
  }
  {
    // A valid HTTP/2 preface and empty SETTINGS, then a DATA frame header
    // announcing the largest length a frame can have, with nothing behind it.
    int fd = Connect(server->port());
    ASSERT_GE(fd, 0);
    std::string bytes = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    bytes += std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
    bytes += std::string("\xff\xff\xff\x00\x00\x00\x00\x00\x01", 9);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    idle.push_back(fd);
  }
  std::unique_ptr<TcpStore> after = Client(server->port());
  EXPECT_EQ(after->get("k", absl::Seconds(5)).value(), "v");
  EXPECT_TRUE(before->set("k2", "v2").ok());
  for (int fd : idle) close(fd);
}

// An HTTP/2 frame: 24-bit length, type, flags, stream id.
std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  f.push_back(static_cast<char>(payload.size() >> 16));
  f.push_back(static_cast<char>(payload.size() >> 8));
  f.push_back(static_cast<char>(payload.size()));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) f.push_back(static_cast<char>(stream >> shift));
  return f + payload;
}

// An HPACK "literal header field without indexing, new name" (short strings).
std::string Header(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + name +
         static_cast<char>(value.size()) + value;
}

// Resident memory of this process, in bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Reads what the server sent until `wait` passes with nothing more, appends
// it to `received` and takes the complete HTTP/2 frames from its front (type,
// stream id); the bool says whether the connection was closed.
std::pair<std::vector<std::pair<int, uint32_t>>, bool> ReadFrames(int fd, absl::Duration wait,
                                                                  std::string& received) {
  int64_t us = absl::ToInt64Microseconds(wait);
  timeval timeout = {static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::vector<std::pair<int, uint32_t>> frames;
  char chunk[4096];
  bool closed = false;
  while (true) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
    if (n <= 0) break;
    received.append(chunk, n);
  }
  size_t pos = 0;
  while (pos + 9 <= received.size()) {
    auto byte = [&](size_t i) {
      return static_cast<uint32_t>(static_cast<unsigned char>(received[pos + i]));
    };
    uint32_t length = byte(0) << 16 | byte(1) << 8 | byte(2);
    if (pos + 9 + length > received.size()) break;
    frames.emplace_back(byte(3), (byte(5) & 0x7f) << 24 | byte(6) << 16 | byte(7) << 8 | byte(8));
    pos += 9 + length;
  }
  received.erase(0, pos);
  return {frames, closed};
}

TEST(TcpStoreTest, ServerSurvivesAGrpcLengthPrefixOfFourGigabytes) {
  std::unique_ptr<TcpStoreServer> server =
      TcpStoreServer::start({.max_message_bytes = 1 << 20}).value();
  const int64_t resident_before = ResidentBytes();
  int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  std::string headers = Header(":method", "POST") + Header(":scheme", "http") +
                        Header(":path", "/ember.distributed.wire.TcpStoreService/Set") +
                        Header(":authority", "store") + Header("content-type", "application/grpc") +
                        Header("te", "trailers");
  // A gRPC message header announcing 0xffffffff bytes, then 2 MiB of them
  // (twice max_message_bytes), as far as flow control lets them in.
  std::string bytes = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + Frame(0x4, 0, 0, "") +
                      Frame(0x1, 0x4 /*END_HEADERS*/, 1, headers) +
                      Frame(0x0, 0, 1, std::string("\x00\xff\xff\xff\xff", 5));
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  // While that stream is open, the server holds no 4 GiB buffer and serves others.
  std::unique_ptr<TcpStore> client = Client(server->port());
  EXPECT_TRUE(client->set("still", "serving").ok());
  EXPECT_LT(ResidentBytes() - resident_before, int64_t{256} << 20);
  // The stream is refused (trailers or RST_STREAM on stream 1) or the
  // connection closed: never a 4 GiB wait. Up to 2 MiB more (twice
  // max_message_bytes) goes in as flow control allows, between reads, until
  // the refusal arrives; a loaded machine may take seconds to send it.
  const std::string chunk = Frame(0x0, 0, 1, std::string(16 << 10, 'z'));
  std::string pending, received;
  size_t frames_sent = 0, frames = 0;
  bool refused = false;
  for (absl::Time end = absl::Now() + absl::Seconds(30); !refused && absl::Now() < end;) {
    while (true) {  // as much as the socket takes now
      if (pending.empty() && frames_sent < 128) {
        pending = chunk;
        ++frames_sent;
      }
      if (pending.empty()) break;
      ssize_t n = send(fd, pending.data(), pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n <= 0) break;
      pending.erase(0, n);
    }
    auto [read, closed] = ReadFrames(fd, absl::Milliseconds(200), received);
    refused = closed;
    frames += read.size();
    for (auto [type, stream] : read)
      refused |= (stream == 1 && (type == 0x1 || type == 0x3)) || type == 0x7;
  }
  EXPECT_TRUE(refused) << frames << " frames in 30 s, none refusing stream 1";
  close(fd);
  EXPECT_LT(ResidentBytes() - resident_before, int64_t{256} << 20);
  EXPECT_EQ(client->get("still", absl::Seconds(5)).value(), "serving");
  EXPECT_EQ(client->num_keys().value(), 1) << "the refused Set must not have stored anything";
}

// Sends `payload` as the raw body of `method`, bypassing the typed stub.
grpc::Status RawCall(int port, const std::string& method, const std::string& payload) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer reply;
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  grpc::Status result;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &reply, [&](grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    result = status;
    done = true;
    done_cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  done_cv.wait(lock, [&] { return done; });
  return result;
}

TEST(TcpStoreTest, ServerRefusesOversizedAndMalformedMessages) {
  std::unique_ptr<TcpStoreServer> server =
      TcpStoreServer::start({.max_message_bytes = 1 << 20}).value();
  grpc::Status big = RawCall(server->port(), "/ember.distributed.wire.TcpStoreService/Set",
                             std::string((1 << 20) + 4096, 'x'));
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << big.error_message();
  grpc::Status malformed = RawCall(server->port(), "/ember.distributed.wire.TcpStoreService/Set",
                                   "\xff\xff\xff\xff garbage");
  EXPECT_FALSE(malformed.ok());
  grpc::Status unknown = RawCall(server->port(), "/no.Such/Method", "x");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNIMPLEMENTED);

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
  EXPECT_FALSE(store.ok());
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
// gRPC threads must not use gRPC). Returns the child's pid.
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
  std::unique_ptr<TcpStore> a = Client(server->port());
  std::unique_ptr<TcpStore> b = Client(server->port());
  std::vector<std::thread> waiters;
  std::atomic<int> woken{0};
  auto wait_on = [&](TcpStore* store) {
    waiters.emplace_back([&woken, store] { woken += store->wait({"go"}, absl::Seconds(30)).ok(); });
  };
  for (int i = 0; i < 3; ++i) wait_on(a.get());
  ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == 3; }, absl::Seconds(10)));
  absl::Status per_connection = a->wait({"go"}, absl::Seconds(30));
  EXPECT_EQ(per_connection.code(), absl::StatusCode::kResourceExhausted) << per_connection;
  EXPECT_THAT(per_connection.message(), HasSubstr("max_pending_waits_per_connection=3"));
  for (int i = 0; i < 2; ++i) wait_on(b.get());
  ASSERT_TRUE(Eventually([&] { return server->num_pending_waits() == 5; }, absl::Seconds(10)));
  absl::StatusOr<std::string> server_wide = b->get("go", absl::Seconds(30));
  EXPECT_EQ(server_wide.status().code(), absl::StatusCode::kResourceExhausted)
      << server_wide.status();
  EXPECT_THAT(server_wide.status().message(), HasSubstr("max_pending_waits=5"));
  // Calls that need not wait still work, and the Set wakes every admitted wait.
  EXPECT_TRUE(a->set("present", "1").ok());
  EXPECT_TRUE(a->wait({"present"}, absl::Seconds(30)).ok());
  ASSERT_TRUE(b->set("go", "1").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(woken.load(), 5);
  EXPECT_EQ(server->num_pending_waits(), 0);

  std::vector<std::string> many;
  for (int i = 0; i < 10000; ++i) many.push_back("many/" + std::to_string(i));
  absl::Status bytes = a->wait(many, absl::Seconds(30));
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

TEST(TcpStoreTest, CancelledWaitsAreDropped) {
  auto server = TcpStoreServer::start({}).value();
  std::unique_ptr<TcpStore> client = Client(server->port());
  // A raw call whose deadline ends long before the wait's own timeout.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = wire::TcpStoreService::NewStub(channel);
  wire::WaitRequest request;
  request.add_keys("never");
  request.set_timeout_us(absl::ToInt64Microseconds(absl::Hours(1)));
  wire::WaitReply reply;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  grpc::Status status = stub->Wait(&context, request, &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(Eventually([&] { return server->num_pending_waits() == 0; }, absl::Seconds(10)));
}

// A flood: many connections, each with as many waits as the server lets it
// hold, from a child process (so this process's memory is the server's).
constexpr char kFloodPortEnv[] = "EMBER_TCP_STORE_TEST_FLOOD_PORT";
constexpr int kFloodConnections = 64;
constexpr int kFloodWaitsPerConnection = 32;
constexpr int kFloodLimitPerConnection = 16;

TEST(TcpStoreChildTest, Flood) {
  const char* port = std::getenv(kFloodPortEnv);
  if (port == nullptr)
    GTEST_SKIP() << "runs only as a child of TcpStoreTest.ConnectionFloodIsBounded";
  const std::string target = absl::StrCat("127.0.0.1:", port);
  struct Call {
    grpc::ClientContext context;
    wire::WaitReply reply;
  };
  wire::WaitRequest request;
  for (int i = 0; i < 500; ++i)
    request.add_keys(absl::StrCat("flood/never/", i, "/", std::string(20, 'x')));
  request.set_timeout_us(absl::ToInt64Microseconds(absl::Minutes(10)));
  std::vector<std::unique_ptr<wire::TcpStoreService::Stub>> stubs;
  std::vector<std::unique_ptr<Call>> calls;
  std::atomic<int> refused{0}, other{0};
  for (int c = 0; c < kFloodConnections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    stubs.push_back(wire::TcpStoreService::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
    for (int w = 0; w < kFloodWaitsPerConnection; ++w) {
      calls.push_back(std::make_unique<Call>());
      Call& call = *calls.back();
      call.context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
      stubs.back()->async()->Wait(&call.context, &request, &call.reply, [&](grpc::Status status) {
        (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? refused : other)++;
      });
    }
  }
  // Tell the parent how many were refused once every refusal is in, then
  // hold the rest until killed.
  const int expected_refusals =
      kFloodConnections * (kFloodWaitsPerConnection - kFloodLimitPerConnection);
  ASSERT_TRUE(Eventually([&] { return refused.load() >= expected_refusals; }, absl::Seconds(60)));
  std::unique_ptr<TcpStore> store = Client(std::atoi(port), absl::Seconds(30));
  ASSERT_TRUE(store->set("flood/refused", std::to_string(refused.load())).ok());
  ASSERT_TRUE(store->set("flood/other", std::to_string(other.load())).ok());
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
  // Warm up this process's side (client, server threads) before the baseline.
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
