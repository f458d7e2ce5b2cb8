// FileLock excludes other holders across threads, times out, and leaves no
// lock file behind.
#include "hub/file_lock.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::hub {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

TEST(FileLockTest, ExcludesAndTimesOut) {
  std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/x.lock";
  absl::StatusOr<FileLock> first = FileLock::acquire(path, absl::Seconds(1));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<FileLock> second = FileLock::acquire(path, absl::Milliseconds(100));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(second.status().message(), ::testing::HasSubstr(path));
  EXPECT_TRUE(Exists(path)) << "a waiter that timed out must not remove the holder's file";

  // A waiter gets the lock once the holder lets go.
  std::atomic<bool> released{false};
  std::thread waiter([&] {
    absl::StatusOr<FileLock> l = FileLock::acquire(path, absl::Seconds(10));
    EXPECT_TRUE(l.ok()) << l.status();
    EXPECT_TRUE(released.load());
  });
  absl::SleepFor(absl::Milliseconds(100));
  released = true;
  { FileLock drop = std::move(*first); }
  waiter.join();
  EXPECT_FALSE(Exists(path));
}

TEST(FileLockTest, RemovesItsFileAndStillExcludesUnderContention) {
  // Holders delete the file as they let go while others wait on it or
  // create it anew; never may two hold the lock at once.
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/contended.lock";
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> entries{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        absl::StatusOr<FileLock> l = FileLock::acquire(path, absl::Seconds(60));
        ASSERT_TRUE(l.ok()) << l.status();
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        entries.fetch_add(1);
        std::this_thread::yield();
        inside.fetch_sub(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(entries.load(), 8 * 50);
  EXPECT_FALSE(Exists(path));
}

}  // namespace
}  // namespace ember::hub
