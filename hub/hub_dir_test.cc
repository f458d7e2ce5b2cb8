// Hub directory precedence: set_dir, TORCH_HUB_DIR, TORCH_HOME/hub,
// XDG_CACHE_HOME/torch/hub, an existing ~/.torch/hub, an existing
// ~/.cache/torch/hub, else ~/.torch/hub created.
#include "hub/hub_dir.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::hub {
namespace {

bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

class HubDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::string(std::getenv("TEST_TMPDIR")) + "/hub_dir_test";
    set_dir("");
    unsetenv(kHubDirEnv);
    unsetenv(kTorchHomeEnv);
    unsetenv(kXdgCacheHomeEnv);
    setenv("HOME", (root_ + "/home").c_str(), 1);
  }
  void TearDown() override { set_dir(""); }
  std::string root_;
};

TEST_F(HubDirTest, FallbackCreatesDotTorchHub) {
  // Nothing set and nothing on disk: ~/.torch/hub, created (with its parents).
  setenv("HOME", (root_ + "/fresh_user").c_str(), 1);
  absl::StatusOr<std::string> dir = get_dir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/fresh_user/.torch/hub");
  EXPECT_TRUE(IsDir(*dir));
  EXPECT_FALSE(IsDir(root_ + "/fresh_user/.cache"));
  // A later PyTorch run creating ~/.cache/torch/hub does not move it.
  ASSERT_TRUE(make_dirs(root_ + "/fresh_user/.cache/torch/hub").ok());
  EXPECT_EQ(*get_dir(), root_ + "/fresh_user/.torch/hub");
}

TEST_F(HubDirTest, ExistingPyTorchCacheStaysInUse) {
  // A PyTorch >= 1.1 user's ~/.cache/torch/hub, and no ~/.torch/hub: used,
  // and ~/.torch/hub is not created.
  setenv("HOME", (root_ + "/pytorch_user").c_str(), 1);
  ASSERT_TRUE(make_dirs(root_ + "/pytorch_user/.cache/torch/hub").ok());
  absl::StatusOr<std::string> dir = get_dir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/pytorch_user/.cache/torch/hub");
  EXPECT_FALSE(IsDir(root_ + "/pytorch_user/.torch"));
  // A file (not a directory) there does not count: the fallback is created.
  setenv("HOME", (root_ + "/odd_user").c_str(), 1);
  ASSERT_TRUE(make_dirs(root_ + "/odd_user/.cache/torch").ok());
  FILE* f = fopen((root_ + "/odd_user/.cache/torch/hub").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  EXPECT_EQ(*get_dir(), root_ + "/odd_user/.torch/hub");
}

TEST_F(HubDirTest, Precedence) {
  // Both home directories exist: ~/.torch/hub.
  ASSERT_TRUE(make_dirs(root_ + "/home/.cache/torch/hub").ok());
  ASSERT_TRUE(make_dirs(root_ + "/home/.torch/hub").ok());
  absl::StatusOr<std::string> dir = get_dir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/home/.torch/hub");

  // Then, each beating the ones before: XDG_CACHE_HOME, TORCH_HOME,
  // TORCH_HUB_DIR, set_dir.
  setenv(kXdgCacheHomeEnv, (root_ + "/xdg").c_str(), 1);
  EXPECT_EQ(*get_dir(), root_ + "/xdg/torch/hub");
  setenv(kTorchHomeEnv, "~/th/", 1);  // "~/" means $HOME, as PyTorch expands it
  EXPECT_EQ(*get_dir(), root_ + "/home/th/hub");
  EXPECT_TRUE(IsDir(root_ + "/home/th/hub"));
  setenv(kHubDirEnv, (root_ + "/env/hub/").c_str(), 1);
  dir = get_dir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/env/hub");
  EXPECT_TRUE(IsDir(*dir));
  set_dir(root_ + "/set");
  EXPECT_EQ(*get_dir(), root_ + "/set");

  // Undoing them falls back in order; empty variables count as unset.
  set_dir("");
  EXPECT_EQ(*get_dir(), root_ + "/env/hub");
  setenv(kHubDirEnv, "", 1);
  EXPECT_EQ(*get_dir(), root_ + "/home/th/hub");
  unsetenv(kTorchHomeEnv);
  EXPECT_EQ(*get_dir(), root_ + "/xdg/torch/hub");
}

TEST_F(HubDirTest, ErrorsNameTheProblem) {
  unsetenv("HOME");
  absl::Status s = get_dir().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              ::testing::HasSubstr("TORCH_HUB_DIR, TORCH_HOME, XDG_CACHE_HOME or HOME"));

  ASSERT_TRUE(make_dirs(root_).ok());
  std::string file = root_ + "/a_file";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  set_dir(file + "/sub");
  s = get_dir().status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::HasSubstr(file));
}

}  // namespace
}  // namespace ember::hub
