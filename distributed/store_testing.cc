// The tests of StoreConformanceTest; linked (alwayslink) into each store's test.
#include "distributed/store_testing.h"

#include <atomic>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"

namespace ember::distributed::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kShort = absl::Milliseconds(200);
constexpr absl::Duration kLong = absl::Seconds(20);

TEST_P(StoreConformanceTest, SetThenGetAndOverwrite) {
  std::shared_ptr<Store> store = NewClient();
  ASSERT_TRUE(store->set("k", "v1").ok());
  EXPECT_EQ(store->get("k", kShort).value(), "v1");
  ASSERT_TRUE(store->set("k", "v2").ok());
  EXPECT_EQ(store->get("k", kShort).value(), "v2");
}

TEST_P(StoreConformanceTest, ValuesAreArbitraryBytes) {
  std::shared_ptr<Store> store = NewClient();
  std::string binary("a\0b\xff\n\r", 6);
  std::string large(1 << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 31 + 7);
  ASSERT_TRUE(store->set("binary", binary).ok());
  ASSERT_TRUE(store->set("large", large).ok());
  ASSERT_TRUE(store->set("empty", "").ok());
  EXPECT_EQ(store->get("binary", kShort).value(), binary);
  EXPECT_EQ(store->get("large", kShort).value(), large);
  EXPECT_EQ(store->get("empty", kShort).value(), "");
}

TEST_P(StoreConformanceTest, KeysWithSeparatorsStayDistinct) {
  std::shared_ptr<Store> store = NewClient();
  ASSERT_TRUE(store->set("a/b", "1").ok());
  ASSERT_TRUE(store->set("a", "2").ok());
  ASSERT_TRUE(store->set("a b\n", "3").ok());
  EXPECT_EQ(store->get("a/b", kShort).value(), "1");
  EXPECT_EQ(store->get("a", kShort).value(), "2");
  EXPECT_EQ(store->get("a b\n", kShort).value(), "3");
}

TEST_P(StoreConformanceTest, GetTimesOutNamingTheKey) {
  std::shared_ptr<Store> store = NewClient();
  absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store->get("never/set", kShort);
  EXPECT_GE(absl::Now() - start, kShort - absl::Milliseconds(20));
  ASSERT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(value.status().message(), HasSubstr("never/set"));
}

TEST_P(StoreConformanceTest, WaitNamesOnlyTheMissingKeys) {
  std::shared_ptr<Store> store = NewClient();
  ASSERT_TRUE(store->set("present", "1").ok());
  absl::Status status = store->wait({"present", "absent1", "absent2"}, kShort);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("absent1"), HasSubstr("absent2"), Not(HasSubstr("present"))));
  EXPECT_TRUE(store->wait({"present"}, kShort).ok());
  EXPECT_TRUE(store->wait({}, kShort).ok());
}

// Waits for `count` keys of which none is set: the error is the documented
// one, on time, and names the first few keys and how many there are, however
// many keys there are.
void ExpectManyMissingKeysReported(Store& store, int count) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) keys.push_back("missing/" + std::to_string(i));
  absl::Time start = absl::Now();
  absl::Status status = store.wait(keys, kShort);
  absl::Duration took = absl::Now() - start;
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << count << " keys: " << status;
  EXPECT_GE(took, kShort - absl::Milliseconds(20));
  EXPECT_LT(took, kShort + absl::Seconds(3)) << count << " keys";
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("missing/0"), HasSubstr("missing/1"), HasSubstr("missing/2")));
  if (count > 8) {
    EXPECT_THAT(status.message(), HasSubstr(std::to_string(count) + " keys"));
    EXPECT_THAT(status.message(), HasSubstr(std::to_string(count - 8) + " more"));
    EXPECT_THAT(status.message(), Not(HasSubstr("missing/" + std::to_string(count - 1))));
  } else {
    EXPECT_THAT(status.message(), HasSubstr("missing/" + std::to_string(count - 1)));
  }
  EXPECT_LT(status.message().size(), 2048u) << "the error must stay short";
}

TEST_P(StoreConformanceTest, WaitForTenMissingKeys) {
  ExpectManyMissingKeysReported(*NewClient(), 10);
}

TEST_P(StoreConformanceTest, WaitForAThousandMissingKeys) {
  ExpectManyMissingKeysReported(*NewClient(), 1000);
}

TEST_P(StoreConformanceTest, WaitForAHundredThousandMissingKeys) {
  ExpectManyMissingKeysReported(*NewClient(), 100000);
}

TEST_P(StoreConformanceTest, GetOfOneVeryLongMissingKey) {
  std::shared_ptr<Store> store = NewClient();
  const std::string key = "long/" + std::string(1 << 20, 'k');
  absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store->get(key, kShort);
  EXPECT_LT(absl::Now() - start, kShort + absl::Seconds(3));
  ASSERT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded)
      << value.status().message().substr(0, 500);
  // Its beginning and its length (a PrefixStore's key is a little longer).
  EXPECT_THAT(value.status().message(),
              AllOf(HasSubstr("long/kkkk"), HasSubstr("(10485"), HasSubstr(" bytes)")));
  EXPECT_LT(value.status().message().size(), 2048u) << "the error must stay short";
  // The store still serves.
  ASSERT_TRUE(store->set(key, "v").ok());
  EXPECT_EQ(store->get(key, kShort).value(), "v");
}

TEST_P(StoreConformanceTest, GetAndWaitWakeWhenAnotherClientSets) {
  std::shared_ptr<Store> waiter = NewClient();
  std::shared_ptr<Store> setter = NewClient();
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(setter->set("late1", "x").ok());
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(setter->set("late2", "y").ok());
  });
  EXPECT_TRUE(waiter->wait({"late1", "late2"}, kLong).ok());
  EXPECT_EQ(waiter->get("late1", kLong).value(), "x");
  later.join();
}

TEST_P(StoreConformanceTest, DefaultTimeoutApplies) {
  std::shared_ptr<Store> store = NewClient();
  store->set_timeout(absl::Milliseconds(100));
  EXPECT_EQ(store->get("missing").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->wait({"missing"}).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_P(StoreConformanceTest, AddCountsFromZeroAndGetReadsDecimal) {
  std::shared_ptr<Store> store = NewClient();
  EXPECT_EQ(store->add("counter", 5).value(), 5);
  EXPECT_EQ(store->add("counter", -7).value(), -2);
  EXPECT_EQ(store->get("counter", kShort).value(), "-2");
  EXPECT_EQ(store->add("counter", 0).value(), -2);
}

TEST_P(StoreConformanceTest, AddThatWouldOverflowFailsAndKeepsTheValue) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  std::shared_ptr<Store> store = NewClient();
  ASSERT_EQ(store->add("high", kMax).value(), kMax);
  absl::StatusOr<int64_t> over = store->add("high", 1);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kOutOfRange) << over.status();
  EXPECT_THAT(over.status().message(),
              AllOf(HasSubstr("high'"), HasSubstr(std::to_string(kMax)), HasSubstr("+ 1")));
  EXPECT_EQ(store->get("high", kShort).value(), std::to_string(kMax));
  EXPECT_EQ(store->add("high", 0).value(), kMax);
  EXPECT_EQ(store->add("high", -1).value(), kMax - 1);

  ASSERT_EQ(store->add("low", kMin).value(), kMin);
  absl::StatusOr<int64_t> under = store->add("low", -2);
  ASSERT_EQ(under.status().code(), absl::StatusCode::kOutOfRange) << under.status();
  EXPECT_THAT(under.status().message(),
              AllOf(HasSubstr("low'"), HasSubstr(std::to_string(kMin)), HasSubstr("- 2")));
  EXPECT_EQ(store->get("low", kShort).value(), std::to_string(kMin));
  absl::StatusOr<int64_t> far = store->add("low", kMin);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(far.status().message(), HasSubstr("- " + std::to_string(kMin).substr(1)));
  EXPECT_EQ(store->get("low", kShort).value(), std::to_string(kMin));
}

TEST_P(StoreConformanceTest, AddOnTextIsDataLoss) {
  std::shared_ptr<Store> store = NewClient();
  ASSERT_TRUE(store->set("text", "hello").ok());
  absl::StatusOr<int64_t> sum = store->add("text", 1);
  ASSERT_EQ(sum.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(sum.status().message(), HasSubstr("text"));
  EXPECT_EQ(store->get("text", kShort).value(), "hello");
}

TEST_P(StoreConformanceTest, CompareSet) {
  std::shared_ptr<Store> store = NewClient();
  // Absent key, non-empty expected: nothing is set; the expected value comes back.
  EXPECT_EQ(store->compare_set("cas", "x", "y").value(), "x");
  EXPECT_EQ(store->num_keys().value(), 0);
  // Absent key, empty expected: set.
  EXPECT_EQ(store->compare_set("cas", "", "first").value(), "first");
  // Mismatch: unchanged, the current value comes back.
  EXPECT_EQ(store->compare_set("cas", "wrong", "second").value(), "first");
  EXPECT_EQ(store->get("cas", kShort).value(), "first");
  // Match: replaced.
  EXPECT_EQ(store->compare_set("cas", "first", "second").value(), "second");
  EXPECT_EQ(store->get("cas", kShort).value(), "second");
}

TEST_P(StoreConformanceTest, CompareSetThatSetsNothingWakesNoWaiter) {
  std::shared_ptr<Store> waiter = NewClient();
  std::shared_ptr<Store> other = NewClient();
  absl::StatusOr<std::string> got;
  std::thread waiting([&] { got = waiter->get("cas/waited", absl::Milliseconds(500)); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(other->compare_set("cas/waited", "not-there", "v").value(), "not-there");
  waiting.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
}

TEST_P(StoreConformanceTest, DeleteKeyAndNumKeys) {
  std::shared_ptr<Store> store = NewClient();
  EXPECT_EQ(store->num_keys().value(), 0);
  ASSERT_TRUE(store->set("a", "1").ok());
  ASSERT_TRUE(store->set("b", "2").ok());
  ASSERT_TRUE(store->add("c", 1).ok());
  EXPECT_EQ(store->num_keys().value(), 3);
  EXPECT_TRUE(store->delete_key("a").value());
  EXPECT_FALSE(store->delete_key("a").value());
  EXPECT_EQ(store->num_keys().value(), 2);
  EXPECT_EQ(store->get("a", absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->get("b", kShort).value(), "2");
}

TEST_P(StoreConformanceTest, EmptyKeyIsInvalid) {
  std::shared_ptr<Store> store = NewClient();
  EXPECT_EQ(store->set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->get("", kShort).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->add("", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->compare_set("", "", "v").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->wait({"ok", ""}, kShort).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->delete_key("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreConformanceTest, ConcurrentClientsAddAndElectOneLeader) {
  constexpr int kClients = 4;
  constexpr int kAddsEach = 50;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(NewClient());
  std::vector<std::string> leaders(kClients);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::string> seen =
          clients[i]->compare_set("leader", "", "client" + std::to_string(i));
      if (seen.ok())
        leaders[i] = *seen;
      else
        ++failures;
      for (int n = 0; n < kAddsEach; ++n) {
        if (!clients[i]->add("total", 1).ok()) ++failures;
      }
      if (!clients[i]->set("done/" + std::to_string(i), "1").ok()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(clients[0]->get("total", kShort).value(), std::to_string(kClients * kAddsEach));
  EXPECT_EQ(std::set<std::string>(leaders.begin(), leaders.end()).size(), 1u)
      << "two clients won CompareSet";
  EXPECT_EQ(clients[1]->get("leader", kShort).value(), leaders[0]);
  EXPECT_TRUE(clients[2]->wait({"done/0", "done/1", "done/2", "done/3"}, kShort).ok());
}

TEST_P(StoreConformanceTest, CheckAppendMultiGetMultiSet) {
  std::shared_ptr<Store> store = NewClient();
  EXPECT_FALSE(store->check({"x"}).value());
  EXPECT_TRUE(store->check({}).value());
  ASSERT_TRUE(store->append("x", "ab").ok());  // a missing key is set
  ASSERT_TRUE(store->append("x", "cd").ok());
  EXPECT_EQ(store->get("x", kShort).value(), "abcd");
  EXPECT_TRUE(store->check({"x"}).value());
  ASSERT_TRUE(store->multi_set({"m/1", "m/2", "m/3"}, {"one", "", "three"}).ok());
  EXPECT_THAT(store->multi_get({"m/3", "m/1", "m/2"}, kShort).value(),
              ::testing::ElementsAre("three", "one", ""));
  EXPECT_FALSE(store->check({"m/1", "m/4"}).value());
  absl::StatusOr<std::vector<std::string>> missing = store->multi_get({"m/1", "m/4"}, kShort);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr("m/4"), Not(HasSubstr("m/1"))));
  EXPECT_EQ(store->multi_set({"a", "b"}, {"1"}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreConformanceTest, AppendsFromManyClientsAllLand) {
  constexpr int kClients = 4;
  constexpr int kAppendsEach = 25;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(NewClient());
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < kAppendsEach; ++n) ASSERT_TRUE(clients[i]->append("log", "x").ok());
      // A call with a reply: a TcpStore's appends (which have none, as in
      // c10d) have reached the server once it returns.
      ASSERT_TRUE(clients[i]->check({"log"}).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clients[0]->get("log", kShort).value(), std::string(kClients * kAppendsEach, 'x'));
}

// One client shared by threads: a thread waiting for a key does not hold up
// the thread that sets it, and each thread reads its own writes.
TEST_P(StoreConformanceTest, ThreadsOfOneClientWaitAndSetAtOnce) {
  std::shared_ptr<Store> store = NewClient();
  constexpr int kWaiters = 8;
  std::vector<std::thread> waiters;
  std::atomic<int> woken{0};
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      absl::StatusOr<std::string> value = store->get("go/" + std::to_string(i % 2), kLong);
      if (value.ok() && *value == "now") ++woken;
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  for (int n = 0; n < 20; ++n) {
    ASSERT_TRUE(store->set("mine", std::to_string(n)).ok());
    EXPECT_EQ(store->get("mine", kShort).value(), std::to_string(n));
  }
  ASSERT_TRUE(store->set("go/0", "now").ok());
  ASSERT_TRUE(store->set("go/1", "now").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(woken.load(), kWaiters);
}

}  // namespace
}  // namespace ember::distributed::testing
