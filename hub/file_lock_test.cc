// FileLock excludes other holders across threads and times out.
#include "hub/file_lock.h"

#include <atomic>
#include <cstdlib>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::hub {
namespace {

TEST(FileLockTest, ExcludesAndTimesOut) {
  std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/x.lock";
  absl::StatusOr<FileLock> first = FileLock::Acquire(path, absl::Seconds(1));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<FileLock> second =
      FileLock::Acquire(path, absl::Milliseconds(100));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(second.status().message(), ::testing::HasSubstr(path));

  // A waiter gets the lock once the holder lets go.
  std::atomic<bool> released{false};
  std::thread waiter([&] {
    absl::StatusOr<FileLock> l = FileLock::Acquire(path, absl::Seconds(10));
    EXPECT_TRUE(l.ok()) << l.status();
    EXPECT_TRUE(released.load());
  });
  absl::SleepFor(absl::Milliseconds(100));
  released = true;
  { FileLock drop = std::move(*first); }
  waiter.join();
}

}  // namespace
}  // namespace ember::hub
