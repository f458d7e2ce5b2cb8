// Where //base/testing:peers looks for the PyTorch 2.x peer, that it agrees
// with tools/install_peers.sh, and that the installed peer (when there is
// one) runs PyTorch 2.x.
#include "base/testing/peers.h"

#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// tools/install_peers.sh (a data file of this test).
constexpr char kScript[] = "tools/install_peers.sh";

// Runs `command` under sh; its exit status and what it wrote to stdout and
// stderr.
std::pair<int, std::string> RunShell(const std::string& command) {
  FILE* pipe = ::popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

void WriteFile(const fs::path& path, const std::string& text, bool executable) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  if (executable) ::chmod(path.c_str(), 0755);
}

// Each case sets the variables the lookup reads and gets the test's own
// environment back afterwards.
class PeersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& [name, value] : saved_) {
      const char* v = std::getenv(name);
      if (v != nullptr) value = v;
    }
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = fs::path(tmp != nullptr ? tmp : "/tmp") /
            absl::StrCat("peers_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    ::unsetenv(kTorch2PythonEnv);
    ::unsetenv("XDG_CACHE_HOME");
    ::unsetenv("HOME");
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }

  fs::path root_;

 private:
  std::pair<const char*, std::optional<std::string>> saved_[3] = {
      {kTorch2PythonEnv, std::nullopt}, {"XDG_CACHE_HOME", std::nullopt}, {"HOME", std::nullopt}};
};

TEST_F(PeersTest, OverrideNamesTheInterpreter) {
  const fs::path python = root_ / "py";
  WriteFile(python, "#!/bin/sh\n", /*executable=*/true);
  ::setenv(kTorch2PythonEnv, python.c_str(), 1);
  // It wins over an installed peer.
  ::setenv("XDG_CACHE_HOME", root_.c_str(), 1);
  WriteFile(torch2_peer_dir() + "/bin/python", "#!/bin/sh\n", true);
  WriteFile(torch2_peer_dir() + "/ember-peer-installed", "", false);
  absl::StatusOr<std::string> got = torch2_python();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, python.string());
}

TEST_F(PeersTest, OverrideThatIsNotAnExecutableIsRefused) {
  const fs::path missing = root_ / "no" / "python";
  ::setenv(kTorch2PythonEnv, missing.c_str(), 1);
  absl::StatusOr<std::string> got = torch2_python();
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(absl::StrCat("EMBER_TORCH2_PYTHON is ",
                                                             missing.string(), ", which is not")));

  WriteFile(missing, "not a program", /*executable=*/false);
  EXPECT_EQ(torch2_python().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PeersTest, PeerDirIsInEmbersCacheDirectory) {
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(torch2_peer_dir(), "/home/someone/.cache/ember/peers/torch-2.15.0");
  ::setenv("XDG_CACHE_HOME", "/var/cache/u", 1);
  EXPECT_EQ(torch2_peer_dir(), "/var/cache/u/ember/peers/torch-2.15.0");
  ::setenv("XDG_CACHE_HOME", "relative/cache", 1);
  EXPECT_EQ(torch2_peer_dir(), "/home/someone/.cache/ember/peers/torch-2.15.0");
}

TEST_F(PeersTest, WithoutHomeTheAccountsHomeDirectory) {
  const std::pair<int, std::string> home = RunShell("getent passwd \"$(id -u)\" | cut -d: -f6");
  ASSERT_EQ(home.first, 0) << home.second;
  const std::string want(absl::StripSuffix(home.second, "\n"));
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(torch2_peer_dir(), absl::StrCat(want, "/.cache/ember/peers/torch-2.15.0"));
}

TEST_F(PeersTest, PeerIsFoundOnceItsInstallIsComplete) {
  ::setenv("XDG_CACHE_HOME", root_.c_str(), 1);
  const std::string dir = torch2_peer_dir();
  ASSERT_EQ(dir, (root_ / "ember/peers/torch-2.15.0").string());

  absl::StatusOr<std::string> got = torch2_python();
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(),
              HasSubstr(absl::StrCat("no PyTorch 2.x peer at ", dir,
                                     "; install it with tools/install_peers.sh")));

  // An install that stopped half way: an interpreter but no stamp.
  WriteFile(dir + "/bin/python", "#!/bin/sh\n", /*executable=*/true);
  got = torch2_python();
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("is incomplete"));
  EXPECT_THAT(got.status().message(), HasSubstr("rerun tools/install_peers.sh"));

  WriteFile(dir + "/ember-peer-installed", "torch==2.15.0\n", /*executable=*/false);
  got = torch2_python();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, dir + "/bin/python");
}

// The script and the helper name the same directory, with XDG_CACHE_HOME,
// with HOME, and with neither (as under bazel test).
TEST_F(PeersTest, InstallScriptLooksInTheSameDirectory) {
  const std::string empty = (root_ / "empty").string();
  for (const char* env : {"XDG_CACHE_HOME", "HOME", ""}) {
    ::unsetenv("XDG_CACHE_HOME");
    ::unsetenv("HOME");
    if (env[0] != '\0') ::setenv(env, empty.c_str(), 1);
    const std::string want = torch2_peer_dir();
    std::pair<int, std::string> got = RunShell(absl::StrCat(kScript, " --python"));
    // Without either, the peer may really be installed there.
    if (env[0] == '\0' && got.first == 0) {
      EXPECT_EQ(got.second, want + "/bin/python\n");
      continue;
    }
    EXPECT_EQ(got.first, 1) << env << ": " << got.second;
    EXPECT_THAT(got.second, HasSubstr(absl::StrCat("no PyTorch 2.x peer at ", want, ";"))) << env;
  }
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");

  const std::string python = (root_ / "py").string();
  WriteFile(python, "#!/bin/sh\n", /*executable=*/true);
  std::pair<int, std::string> got =
      RunShell(absl::StrCat("EMBER_TORCH2_PYTHON=", python, " ", kScript, " --python"));
  EXPECT_EQ(got, std::make_pair(0, python + "\n"));
  got = RunShell(
      absl::StrCat("EMBER_TORCH2_PYTHON=", root_.string(), "/nothing ", kScript, " --python"));
  EXPECT_EQ(got.first, 1) << got.second;
  EXPECT_THAT(got.second, HasSubstr("EMBER_TORCH2_PYTHON is "));
}

// The peer this test process finds, in its own environment: PyTorch 2.x with
// torch.distributed. Skips, saying which command installs it, without one.
TEST(Torch2PeerTest, RunsPyTorch2) {
  absl::StatusOr<std::string> python = torch2_python();
  if (!python.ok()) GTEST_SKIP() << python.status().message();
  std::pair<int, std::string> got =
      RunShell(absl::StrCat(*python,
                            " -c 'import torch, torch.distributed as d; "
                            "print(torch.__version__, d.is_available())'"));
  ASSERT_EQ(got.first, 0) << *python << ": " << got.second;
  EXPECT_THAT(got.second, StartsWith("2.")) << *python;
  EXPECT_THAT(got.second, HasSubstr(" True\n")) << *python;
  std::cout << *python << ": torch " << got.second;
}

}  // namespace
}  // namespace ember::testing
