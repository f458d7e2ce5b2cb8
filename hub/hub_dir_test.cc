// Hub directory precedence: SetDir, then TORCH_HUB_DIR, then ~/.torch/hub.
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
    SetDir("");
    unsetenv(kHubDirEnv);
    setenv("HOME", (root_ + "/home").c_str(), 1);
  }
  void TearDown() override { SetDir(""); }
  std::string root_;
};

TEST_F(HubDirTest, Precedence) {
  // Nothing set: ~/.torch/hub, created.
  absl::StatusOr<std::string> dir = GetDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/home/.torch/hub");
  EXPECT_TRUE(IsDir(*dir));

  // The environment variable beats the default.
  setenv(kHubDirEnv, (root_ + "/env/hub/").c_str(), 1);
  dir = GetDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/env/hub");
  EXPECT_TRUE(IsDir(*dir));

  // SetDir beats both; undoing it falls back to the environment.
  SetDir(root_ + "/set");
  EXPECT_EQ(*GetDir(), root_ + "/set");
  SetDir("");
  EXPECT_EQ(*GetDir(), root_ + "/env/hub");
}

TEST_F(HubDirTest, ErrorsNameTheProblem) {
  unsetenv("HOME");
  absl::Status s = GetDir().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("TORCH_HUB_DIR"));

  ASSERT_TRUE(MakeDirs(root_).ok());
  std::string file = root_ + "/a_file";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  SetDir(file + "/sub");
  s = GetDir().status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::HasSubstr(file));
}

}  // namespace
}  // namespace ember::hub
