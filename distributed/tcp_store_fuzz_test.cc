// A bounded random-mutation fuzz test of the TcpStore server's wire protocol
// (tcp_store.proto): valid requests with random fields, some of them mutated
// byte by byte or replaced by noise, sent with a raw gRPC client to every
// method and to methods that do not exist. A fixed seed and a bound on
// iterations and time keep it reproducible and short enough for CI.
//
// The server must answer every call (a result or an error, never silence
// for a call that does not wait), keep no wait behind, and afterwards serve a
// normal client correctly, with the keys that client set before untouched.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.grpc.pb.h"
#include "distributed/tcp_store.h"
#include "gmock/gmock.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

constexpr uint32_t kSeed = 0x5eed2024;
constexpr int kMaxCalls = 4000;
constexpr absl::Duration kBudget = absl::Seconds(4);
constexpr int kInFlight = 32;  // calls outstanding at once
// The longest a call may take: a Get or Wait may wait this long (its timeout
// is random), every other call must be answered well within it.
constexpr auto kCallDeadline = std::chrono::milliseconds(1500);

constexpr char kService[] = "/ember.distributed.wire.TcpStoreService/";
const std::vector<std::string> kMethods = {"Hello",      "Set",  "Get",       "Add",
                                           "CompareSet", "Wait", "DeleteKey", "NumKeys"};

class Generator {
 public:
  explicit Generator(uint32_t seed) : random_(seed) {}

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(random_); }

  std::string Bytes(size_t n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(random_());
    return bytes;
  }

  // Mostly a few shared keys (so Sets wake Waits and Adds meet text), some
  // random, empty or long ones.
  std::string Key() {
    int kind = Uniform(0, 19);
    if (kind < 14) return absl::StrCat("fuzz/", Uniform(0, 7));
    if (kind < 17) return Bytes(Uniform(1, 40));
    if (kind < 18) return "";
    return std::string(Uniform(1, 64 << 10), static_cast<char>('a' + Uniform(0, 25)));
  }

  std::string Value() {
    int kind = Uniform(0, 9);
    if (kind < 4) return std::to_string(static_cast<int64_t>(random_()) - (1LL << 31));
    if (kind < 5) return std::to_string(std::numeric_limits<int64_t>::max());
    if (kind < 9) return Bytes(Uniform(0, 64));
    return Bytes(Uniform(0, 256 << 10));
  }

  int64_t Delta() {
    switch (Uniform(0, 5)) {
      case 0:
        return std::numeric_limits<int64_t>::max();
      case 1:
        return std::numeric_limits<int64_t>::min();
      case 2:
        return -1;
      default:
        return Uniform(-1000, 1000);
    }
  }

  // Mostly short (the calls must finish within the test), some zero,
  // negative or absurd (the client's deadline then ends them).
  int64_t TimeoutUs() {
    switch (Uniform(0, 9)) {
      case 0:
        return 0;
      case 1:
        return -Uniform(1, 1 << 30);
      case 2:
        return std::numeric_limits<int64_t>::max();
      case 3:
        return std::numeric_limits<int64_t>::min();
      default:
        return Uniform(1, 100'000);
    }
  }

  // A valid request for `method`, serialized.
  std::string Request(const std::string& method) {
    std::unique_ptr<google::protobuf::Message> message;
    if (method == "Hello") {
      auto m = std::make_unique<wire::HelloRequest>();
      m->set_magic(Chance(0.5) ? "ember-tcp-store" : Bytes(Uniform(0, 40)));
      m->set_version(Chance(0.5) ? 1 : static_cast<uint32_t>(random_()));
      message = std::move(m);
    } else if (method == "Set") {
      auto m = std::make_unique<wire::SetRequest>();
      m->set_key(Key());
      m->set_value(Value());
      message = std::move(m);
    } else if (method == "Get") {
      auto m = std::make_unique<wire::GetRequest>();
      m->set_key(Key());
      m->set_timeout_us(TimeoutUs());
      message = std::move(m);
    } else if (method == "Add") {
      auto m = std::make_unique<wire::AddRequest>();
      m->set_key(Key());
      m->set_delta(Delta());
      message = std::move(m);
    } else if (method == "CompareSet") {
      auto m = std::make_unique<wire::CompareSetRequest>();
      m->set_key(Key());
      m->set_expected(Chance(0.3) ? "" : Value());
      m->set_desired(Value());
      message = std::move(m);
    } else if (method == "Wait") {
      auto m = std::make_unique<wire::WaitRequest>();
      int n = Chance(0.05) ? Uniform(1000, 20000) : Uniform(0, 8);
      for (int i = 0; i < n; ++i) m->add_keys(n > 8 ? absl::StrCat("fuzz/many/", i) : Key());
      m->set_timeout_us(TimeoutUs());
      message = std::move(m);
    } else if (method == "DeleteKey") {
      auto m = std::make_unique<wire::DeleteKeyRequest>();
      m->set_key(Key());
      message = std::move(m);
    } else {
      message = std::make_unique<wire::NumKeysRequest>();
    }
    return message->SerializeAsString();
  }

  // A few random edits: flipped bits, overwritten, inserted, deleted or
  // repeated bytes, a cut, a field appended with a wild length, or noise.
  std::string Mutate(std::string bytes) {
    for (int edits = Uniform(1, 4); edits > 0; --edits) {
      size_t at = bytes.empty() ? 0 : Uniform(0, static_cast<int>(bytes.size()) - 1);
      switch (Uniform(0, 7)) {
        case 0:
          if (!bytes.empty()) bytes[at] ^= static_cast<char>(1 << Uniform(0, 7));
          break;
        case 1:
          if (!bytes.empty()) bytes[at] = static_cast<char>(random_());
          break;
        case 2:
          bytes.insert(at, Bytes(Uniform(1, 16)));
          break;
        case 3:
          bytes.erase(at, Uniform(1, 16));
          break;
        case 4:
          bytes.resize(at);
          break;
        case 5:
          bytes.insert(at, bytes.substr(at, Uniform(1, 64)));
          break;
        case 6:
          // Field 1 (or a random one), length-delimited, announcing far more
          // bytes than follow.
          bytes.push_back(static_cast<char>(Chance(0.5) ? 0x0a : random_()));
          bytes += std::string("\xff\xff\xff\xff\x0f", 5);
          break;
        default:
          bytes = Bytes(Uniform(0, 512));
          break;
      }
    }
    return bytes;
  }

 private:
  std::mt19937 random_;
};

struct Outcome {
  std::string method;
  bool may_wait = false;
  grpc::StatusCode code = grpc::StatusCode::OK;
};

TEST(TcpStoreFuzzTest, ServerAnswersRandomAndMutatedRequestsAndStaysCorrect) {
  std::unique_ptr<TcpStoreServer> server =
      TcpStoreServer::start({.max_message_bytes = 4 << 20}).value();
  TcpStoreOptions options;
  options.port = server->port();
  options.timeout = absl::Seconds(10);
  std::unique_ptr<TcpStore> normal = TcpStore::create(options).value();
  ASSERT_TRUE(normal->set("sentinel/text", "kept").ok());
  ASSERT_EQ(normal->add("sentinel/counter", 41).value(), 41);

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  grpc::GenericStub stub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server->port()),
                                                   grpc::InsecureChannelCredentials(), args));
  Generator generate(kSeed);
  absl::Mutex mu;
  int in_flight = 0;
  std::vector<Outcome> outcomes;
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request, reply;
    Outcome outcome;
  };
  std::vector<std::unique_ptr<Call>> calls;
  const absl::Time end = absl::Now() + kBudget;
  for (int i = 0; i < kMaxCalls && absl::Now() < end; ++i) {
    auto call = std::make_unique<Call>();
    const std::string& method = kMethods[generate.Uniform(0, kMethods.size() - 1)];
    std::string payload = generate.Request(method);
    int shape = generate.Uniform(0, 9);
    if (shape >= 6) payload = generate.Mutate(std::move(payload));
    std::string path = absl::StrCat(kService, method);
    if (shape == 9)
      path =
          generate.Chance(0.5) ? absl::StrCat(kService, "NoSuchMethod") : "/" + generate.Bytes(8);
    call->outcome.method = path;
    // Get and Wait may wait (their timeouts are random, mutation may make one
    // of anything); an unknown path is refused at once.
    call->outcome.may_wait = shape >= 6 || method == "Get" || method == "Wait";
    grpc::Slice slice(payload);
    call->request = grpc::ByteBuffer(&slice, 1);
    call->context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    {
      absl::MutexLock lock(&mu);
      auto room = [&] { return in_flight < kInFlight; };
      mu.Await(absl::Condition(&room));
      ++in_flight;
    }
    Call* raw = call.get();
    calls.push_back(std::move(call));
    stub.UnaryCall(&raw->context, path, grpc::StubOptions(), &raw->request, &raw->reply,
                   [&, raw](grpc::Status status) {
                     absl::MutexLock lock(&mu);
                     raw->outcome.code = status.error_code();
                     outcomes.push_back(raw->outcome);
                     --in_flight;
                   });
  }
  {
    // Every call ends by its deadline, so this wait is bounded too.
    absl::MutexLock lock(&mu);
    auto drained = [&] { return in_flight == 0; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&drained), absl::Seconds(30)))
        << in_flight << " calls never completed";
  }
  ASSERT_EQ(outcomes.size(), calls.size());
  int ok = 0, unanswered = 0;
  for (const Outcome& outcome : outcomes) {
    ok += outcome.code == grpc::StatusCode::OK;
    // A call that need not wait gets its answer from the server, not from
    // its own deadline or a broken connection.
    if (!outcome.may_wait && (outcome.code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                              outcome.code == grpc::StatusCode::UNAVAILABLE)) {
      ++unanswered;
      ADD_FAILURE() << outcome.method << " was not answered: code " << outcome.code;
    }
  }
  EXPECT_EQ(unanswered, 0);
  EXPECT_GT(ok, 0) << "no request succeeded: the generator makes no valid requests";
  EXPECT_LT(ok, static_cast<int>(outcomes.size())) << "no request failed: nothing was mutated";
  std::printf("%zu fuzzed calls, %d succeeded\n", outcomes.size(), ok);

  // Nothing is left waiting, and a normal client is served correctly.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server->num_pending_waits() > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server->num_pending_waits(), 0);
  std::unique_ptr<TcpStore> after = TcpStore::create(options).value();
  EXPECT_EQ(after->get("sentinel/text", absl::Seconds(5)).value_or(""), "kept");
  EXPECT_EQ(after->add("sentinel/counter", 1).value_or(0), 42);
  ASSERT_TRUE(normal->set("after/a", "1").ok());
  EXPECT_TRUE(after->wait({"after/a"}, absl::Seconds(5)).ok());
  EXPECT_EQ(after->compare_set("after/a", "1", "2").value_or(""), "2");
  EXPECT_TRUE(after->delete_key("after/a").value_or(false));
  EXPECT_EQ(after->get("after/a", absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(after->num_keys().value_or(0), 2);
}

}  // namespace
}  // namespace ember::distributed
