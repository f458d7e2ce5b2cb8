// A bounded random-mutation fuzz test of TcpStore's wire protocol
// (tcp_store_wire.h): the request parser fed random and mutated bytes, then
// the server fed valid requests of every query with random fields over many
// connections, some streams mutated byte by byte or replaced by noise. A
// fixed seed and bounds on iterations and time keep it reproducible and short
// enough for CI.
//
// The parser never reads past its input nor claims an empty request. The
// server answers every request of an unmutated stream with a reply of the
// shape the protocol gives (never silence for a call that does not wait, or
// waits at most its timeout), keeps no wait behind once the streams close,
// and afterwards serves a normal client correctly, with the keys that client
// set before untouched.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"
#include "distributed/tcp_store_wire.h"
#include "distributed/testing/store_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using wire::Query;

constexpr uint32_t kSeed = 0x5eed2026;
constexpr int kParserCases = 50'000;
constexpr int kStreams = 48;
constexpr int kRequestsPerStream = 80;
constexpr absl::Duration kBudget = absl::Seconds(6);

const std::vector<Query> kQueries = {
    Query::kSet,       Query::kCompareSet, Query::kGet,       Query::kAdd,       Query::kCheck,
    Query::kWait,      Query::kNumKeys,    Query::kDeleteKey, Query::kAppend,    Query::kMultiGet,
    Query::kMultiSet,  Query::kCancelWait, Query::kPing,      Query::kQueuePush, Query::kQueuePop,
    Query::kQueueLen,  Query::kListKeys,   Query::kBarrier,   Query::kEmberGet,  Query::kEmberWait,
    Query::kEmberAdd,  Query::kValidate};

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

  // Mostly a few shared keys (so writes wake waits and adds meet text), some
  // random, empty or long ones. Never the normal client's "/sentinel/".
  std::string Key() {
    int kind = Uniform(0, 19);
    if (kind < 14) return absl::StrCat("/fuzz/", Uniform(0, 7));
    if (kind < 17) return "/" + Bytes(Uniform(1, 40));
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

  // Ember waits' timeouts: short, zero or negative, so every reply comes
  // within the test.
  int64_t TimeoutUs() {
    switch (Uniform(0, 5)) {
      case 0:
        return 0;
      case 1:
        return -Uniform(1, 1 << 30);
      case 2:
        return std::numeric_limits<int64_t>::min();
      default:
        return Uniform(1, 50'000);
    }
  }

  // A valid request for `query`; `answered` says whether it has a reply that
  // comes by itself (c10d's WAIT and BARRIER may wait for ever).
  std::string Request(Query query, bool& answered) {
    std::string r;
    wire::PutQuery(r, query);
    answered = true;
    auto keys = [&](bool with_values) {
      int n = Chance(0.05) ? Uniform(1000, 5000) : Uniform(0, 8);
      wire::PutValue<uint64_t>(r, n);
      for (int i = 0; i < n; ++i) {
        // Many keys come short, with short values, so the request stays
        // within max_message_bytes (beyond it the server closes the stream).
        wire::PutBytes(r, n > 8 ? absl::StrCat("/fuzz/many/", i) : Key());
        if (with_values) wire::PutBytes(r, n > 8 ? Bytes(Uniform(0, 16)) : Value());
      }
    };
    switch (query) {
      case Query::kValidate:
        wire::PutValue<uint32_t>(r, wire::kValidationMagic);
        answered = false;
        break;
      case Query::kPing:
        wire::PutValue<uint32_t>(r, static_cast<uint32_t>(random_()));
        break;
      case Query::kSet:
      case Query::kAppend:
      case Query::kQueuePush:
        wire::PutBytes(r, Key());
        wire::PutBytes(r, Value());
        answered = false;
        break;
      case Query::kCompareSet:
        wire::PutBytes(r, Key());
        wire::PutBytes(r, Chance(0.3) ? "" : Value());
        wire::PutBytes(r, Value());
        break;
      case Query::kGet:
      case Query::kDeleteKey:
      case Query::kQueuePop:
      case Query::kQueueLen:
        wire::PutBytes(r, Key());
        break;
      case Query::kAdd:
      case Query::kEmberAdd:
        wire::PutBytes(r, Key());
        wire::PutValue<int64_t>(r, Delta());
        break;
      case Query::kBarrier:
        wire::PutBytes(r, Key());
        wire::PutValue<int64_t>(r, Uniform(-2, 3));
        answered = false;
        break;
      case Query::kEmberGet:
        wire::PutBytes(r, Key());
        wire::PutValue<int64_t>(r, TimeoutUs());
        break;
      case Query::kCheck:
      case Query::kMultiGet:
        keys(false);
        break;
      case Query::kWait:
        keys(false);
        answered = false;
        break;
      case Query::kMultiSet:
        keys(true);
        answered = false;
        break;
      case Query::kEmberWait:
        keys(false);
        wire::PutValue<int64_t>(r, TimeoutUs());
        break;
      case Query::kNumKeys:
      case Query::kListKeys:
        break;
      case Query::kCancelWait:
        break;
    }
    return r;
  }

  // A few random edits: flipped bits, overwritten, inserted, deleted or
  // repeated bytes, a cut, a length field made wild, or noise.
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
          if (bytes.size() >= 9) {
            uint64_t wild = Chance(0.5) ? ~uint64_t{0} : static_cast<uint64_t>(random_()) << 20;
            std::memcpy(bytes.data() + 1, &wild, sizeof(wild));
          }
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

TEST(TcpStoreFuzzTest, ParserNeverOverreadsNorAcceptsAnEmptyRequest) {
  Generator generate(kSeed);
  int complete = 0, incomplete = 0, invalid = 0;
  const absl::Time end = absl::Now() + kBudget;
  for (int i = 0; i < kParserCases && absl::Now() < end; ++i) {
    bool answered = false;
    std::string bytes = generate.Request(kQueries[generate.Uniform(0, kQueries.size() - 1)], answered);
    if (generate.Chance(0.7)) bytes = generate.Mutate(std::move(bytes));
    wire::Request request;
    size_t consumed = 0;
    std::string error;
    const int64_t budget = generate.Chance(0.5) ? int64_t{4} << 20 : generate.Uniform(0, 4096);
    switch (wire::ParseRequest(bytes, budget, request, consumed, error)) {
      case wire::Parse::kComplete:
        ++complete;
        ASSERT_GT(consumed, 0u);
        ASSERT_LE(consumed, bytes.size());
        for (std::string_view key : request.keys) {
          ASSERT_GE(key.data(), bytes.data());
          ASSERT_LE(key.data() + key.size(), bytes.data() + bytes.size());
        }
        ASSERT_EQ(request.keys.size() >= request.values.size(), true);
        break;
      case wire::Parse::kIncomplete:
        ++incomplete;
        break;
      case wire::Parse::kInvalid:
        ++invalid;
        ASSERT_FALSE(error.empty());
        break;
    }
  }
  EXPECT_GT(complete, 0);
  EXPECT_GT(incomplete, 0);
  EXPECT_GT(invalid, 0);
  std::printf("parser: %d complete, %d incomplete, %d invalid\n", complete, incomplete, invalid);
}

// A validated connection; replies are read as the protocol shapes them.
class Stream {
 public:
  explicit Stream(int port) : wire_(port) {}

  bool connected() const { return wire_.ok(); }
  void Send(std::string_view bytes) { wire_.Send(bytes); }
  std::optional<std::string> Read(size_t n, absl::Time end) {
    return wire_.Read(n, std::max(end - absl::Now(), absl::ZeroDuration()));
  }
  template <typename T>
  std::optional<T> Value(absl::Time end) {
    std::optional<std::string> bytes = Read(sizeof(T), end);
    if (!bytes) return std::nullopt;
    T value;
    std::memcpy(&value, bytes->data(), sizeof(T));
    return value;
  }
  bool Bytes(absl::Time end) {
    std::optional<uint64_t> length = Value<uint64_t>(end);
    return length && *length < (uint64_t{64} << 20) && Read(*length, end).has_value();
  }
  bool Status(bool then_bytes, bool then_int, absl::Time end) {
    std::optional<uint8_t> code = Value<uint8_t>(end);
    if (!code) return false;
    if (*code != 0) return Bytes(end);
    if (then_bytes) return Bytes(end);
    if (then_int) return Value<int64_t>(end).has_value();
    return true;
  }

  // Reads the reply `request` (unmutated, answered) has; false if it does
  // not come whole by `end`.
  bool Reply(const std::string& request, absl::Time end) {
    const Query query = static_cast<Query>(request[0]);
    switch (query) {
      case Query::kPing:
        return Value<uint32_t>(end).has_value();
      case Query::kCompareSet:
      case Query::kGet:
        return Bytes(end);
      case Query::kAdd:
      case Query::kNumKeys:
      case Query::kDeleteKey:
      case Query::kQueueLen:
        return Value<int64_t>(end).has_value();
      case Query::kCheck:
      case Query::kCancelWait:
        return Value<uint8_t>(end).has_value();
      case Query::kMultiGet: {
        uint64_t n = 0;
        std::memcpy(&n, request.data() + 1, sizeof(n));
        for (uint64_t i = 0; i < n; ++i)
          if (!Bytes(end)) return false;
        return true;
      }
      case Query::kQueuePop: {
        std::optional<int64_t> length = Value<int64_t>(end);
        return length && (*length <= 0 || Bytes(end));
      }
      case Query::kListKeys: {
        std::optional<int64_t> n = Value<int64_t>(end);
        if (!n) return false;
        for (int64_t i = 0; i < *n; ++i)
          if (!Bytes(end)) return false;
        return true;
      }
      case Query::kEmberGet:
        return Status(true, false, end);
      case Query::kEmberWait:
        return Status(false, false, end);
      case Query::kEmberAdd:
        return Status(false, true, end);
      default:
        return true;
    }
  }

 private:
  testing::StoreWire wire_;
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

  Generator generate(kSeed);
  int answered = 0, mutated_streams = 0;
  const absl::Time end = absl::Now() + kBudget;
  for (int s = 0; s < kStreams && absl::Now() < end; ++s) {
    Stream stream(server->port());
    ASSERT_TRUE(stream.connected());
    const bool mutate = s % 3 == 2;
    mutated_streams += mutate;
    for (int i = 0; i < kRequestsPerStream; ++i) {
      bool has_reply = false;
      Query query = kQueries[generate.Uniform(0, kQueries.size() - 1)];
      // In an unmutated stream, which must be answered throughout: no c10d
      // wait (it may never end) and no c10d ADD (on text it closes the
      // connection, as c10d's server does); they come only in mutated ones.
      if (!mutate && (query == Query::kWait || query == Query::kBarrier)) query = Query::kCheck;
      if (!mutate && query == Query::kAdd) query = Query::kEmberAdd;
      std::string request = generate.Request(query, has_reply);
      if (mutate && generate.Chance(0.5)) {
        stream.Send(generate.Mutate(std::move(request)));
        continue;
      }
      stream.Send(request);
      // Empty keys are the clients' business (the server takes them as c10d
      // does); every reply must come, whole, well within a second.
      if (!mutate && has_reply) {
        ASSERT_TRUE(stream.Reply(request, absl::Now() + absl::Seconds(2)))
            << "query " << static_cast<int>(query) << " of stream " << s << " was not answered";
        ++answered;
      }
    }
  }
  EXPECT_GT(answered, 0);
  EXPECT_GT(mutated_streams, 0);
  std::printf("%d requests answered as the protocol shapes them, %d streams mutated\n", answered,
              mutated_streams);

  // Nothing is left waiting, and a normal client is served correctly.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((server->num_pending_waits() > 0 || server->num_connections() > 1) &&
         absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server->num_pending_waits(), 0);
  EXPECT_EQ(server->num_connections(), 1);
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
