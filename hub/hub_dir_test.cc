// Hub directory precedence: SetDir, TORCH_HUB_DIR, TORCH_HOME/hub,
// XDG_CACHE_HOME/torch/hub, an existing ~/.torch/hub, ~/.cache/torch/hub.
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

TEST_F(HubDirTest, Precedence) {
  // Nothing set: ~/.cache/torch/hub, created.
  absl::StatusOr<std::string> dir = get_dir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/home/.cache/torch/hub");
  EXPECT_TRUE(IsDir(*dir));

  // An existing ~/.torch/hub (PyTorch 1.0, older Ember) stays in use.
  ASSERT_TRUE(make_dirs(root_ + "/home/.torch/hub").ok());
  EXPECT_EQ(*get_dir(), root_ + "/home/.torch/hub");

  // Then, each beating the ones before: XDG_CACHE_HOME, TORCH_HOME,
  // TORCH_HUB_DIR, SetDir.
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
