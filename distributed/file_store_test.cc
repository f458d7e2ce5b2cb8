// FileStore: the shared store suite with a separate FileStore per client,
// then what is particular to files: several processes, removal by the last
// user, corrupt files, a partial record and a lock held by someone else.
#include "distributed/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "distributed/store_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using ::testing::HasSubstr;
using testing::StoreConformanceTest;
using testing::StoreHarness;
using testing::StoreImpl;

std::string TempPath(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name + "." + std::to_string(getpid()) + "." +
         std::to_string(counter++);
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

class FileStoreHarness : public StoreHarness {
 public:
  std::shared_ptr<Store> NewClient() override {
    absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::open(path_, absl::Seconds(10));
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    std::shared_ptr<Store> shared = std::move(*store);
    // Keep every client alive for the harness's lifetime, as ranks of a job would.
    clients_.push_back(shared);
    return shared;
  }

 private:
  std::string path_ = TempPath("conformance");
  std::vector<std::shared_ptr<Store>> clients_;
};

INSTANTIATE_TEST_SUITE_P(All, StoreConformanceTest,
                         ::testing::Values(StoreImpl{"FileStore", [] {
                           return std::unique_ptr<StoreHarness>(new FileStoreHarness);
                         }}),
                         testing::StoreImplName);

TEST(FileStoreTest, ProcessesShareOneFile) {
  const std::string path = TempPath("processes");
  auto parent = FileStore::open(path).value();
  constexpr int kChildren = 4;
  constexpr int kAdds = 25;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto store = FileStore::open(path, absl::Seconds(20));
      if (!store.ok()) _exit(10);
      for (int i = 0; i < kAdds; ++i) {
        if (!(*store)->add("sum", 1).ok()) _exit(11);
      }
      if (!(*store)->set("child/" + std::to_string(c), std::to_string(getpid())).ok()) _exit(12);
      // Wait for the parent's go, written after every child has finished adding.
      if (!(*store)->get("go", absl::Seconds(20)).ok()) _exit(13);
      _exit(0);
    }
    children.push_back(pid);
  }
  ASSERT_TRUE(parent->wait({"child/0", "child/1", "child/2", "child/3"}, absl::Seconds(30)).ok());
  EXPECT_EQ(parent->get("sum", absl::Seconds(1)).value(), std::to_string(kChildren * kAdds));
  ASSERT_TRUE(parent->set("go", "1").ok());
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
}

TEST(FileStoreTest, LastUserRemovesTheFile) {
  const std::string path = TempPath("removed");
  {
    auto a = FileStore::open(path).value();
    auto b = FileStore::open(path).value();
    ASSERT_TRUE(a->set("k", "v").ok());
    a.reset();
    EXPECT_TRUE(Exists(path));
    EXPECT_EQ(b->get("k", absl::Seconds(1)).value(), "v");
  }
  EXPECT_FALSE(Exists(path));
  // The path serves a fresh store afterwards.
  auto fresh = FileStore::open(path).value();
  EXPECT_EQ(fresh->num_keys().value(), 0);
}

TEST(FileStoreTest, ForeignFileIsDataLossNamingThePath) {
  const std::string path = TempPath("foreign");
  std::ofstream(path) << "this is somebody's notes, not a store log";
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::open(path, absl::Seconds(1));
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(FileStoreTest, PartialRecordFromADeadWriterIsDropped) {
  const std::string path = TempPath("partial");
  auto keeper = FileStore::open(path).value();
  ASSERT_TRUE(keeper->set("before", "1").ok());
  {
    // A record header promising far more bytes than follow.
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out << 'S' << std::string("\x05\x00\x00\x00\xff\x00\x00\x00", 8) << "trunc";
  }
  auto other = FileStore::open(path, absl::Seconds(2)).value();
  ASSERT_TRUE(other->set("after", "2").ok());
  EXPECT_EQ(keeper->get("after", absl::Seconds(1)).value(), "2");
  EXPECT_EQ(keeper->get("before", absl::Seconds(1)).value(), "1");
  EXPECT_EQ(keeper->num_keys().value(), 2);
}

TEST(FileStoreTest, LockHeldElsewhereTimesOutNamingThePath) {
  const std::string path = TempPath("locked");
  auto store = FileStore::open(path).value();
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(fd, F_OFD_SETLK, &lock), 0);
  store->set_timeout(absl::Milliseconds(200));
  absl::Status status = store->set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(path));
  close(fd);
  EXPECT_TRUE(store->set("k", "v").ok());
}

TEST(FileStoreTest, UnreachablePathIsUnavailable) {
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::open("/nonexistent-dir/store", absl::Seconds(1));
  ASSERT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr("/nonexistent-dir/store"));
}

}  // namespace
}  // namespace ember::distributed
