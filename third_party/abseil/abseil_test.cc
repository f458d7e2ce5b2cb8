// Proves every Abseil component target links and behaves as documented.
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace {

absl::StatusOr<int> ParsePositive(int v) {
  if (v <= 0) return absl::InvalidArgumentError(absl::StrCat("got ", v));
  return v;
}

TEST(AbseilTest, StringsAndFormat) {
  std::vector<std::string> parts = absl::StrSplit("a,b,,c", ',');
  EXPECT_EQ(parts.size(), 4u);
  EXPECT_EQ(absl::StrFormat("%05.1f|%s", 3.14159, "x"), "003.1|x");
}

TEST(AbseilTest, StatusCarriesCodeAndMessage) {
  EXPECT_EQ(*ParsePositive(3), 3);
  absl::StatusOr<int> bad = ParsePositive(-2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "got -2");
}

TEST(AbseilTest, MutexNotificationAndTime) {
  absl::Mutex mu;
  int counter = 0;
  absl::Notification done;
  std::thread t([&] {
    absl::MutexLock lock(&mu);
    ++counter;
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  t.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(counter, 1);
  EXPECT_GT(absl::Now(), absl::UnixEpoch());
}

TEST(AbseilTest, HashMapAndRandom) {
  absl::flat_hash_map<std::string, int> m;
  for (int i = 0; i < 100; ++i) m[absl::StrCat("k", i)] = i;
  EXPECT_EQ(m.size(), 100u);
  EXPECT_EQ(m.at("k42"), 42);
  absl::BitGen gen;
  int v = absl::Uniform(gen, 0, 10);
  EXPECT_GE(v, 0);
  EXPECT_LT(v, 10);
}

}  // namespace
