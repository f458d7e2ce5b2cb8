// What every Ember tool (launch, shm_manager, hub, lighthouse) promises on its command
// line: --version prints "<tool> <VERSION> (git <commit>)", --help prints the
// usage with its exit codes and exits 0, a usage error exits 2, and a tool
// that lacks something it needs says what and exits non-zero. The binaries
// run as real processes with an empty environment (env -i).
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::tools {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

struct Result {
  int code;
  std::string out;
  std::string err;
};

std::string Runfile(const std::string& path) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") + "/" + path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `tool` (tools/<tool>/<tool>) with `args` (shell words) under env -i.
Result RunTool(const std::string& tool, const std::string& args) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string out = tmp + "/stdout", err = tmp + "/stderr";
  const std::string cmd = "cd " + tmp + " && env -i " + Runfile("tools/" + tool + "/" + tool) +
                          " " + args + " >" + out + " 2>" + err + " </dev/null";
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out), ReadFile(err)};
}

class ToolTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ToolTest, VersionNamesToolVersionAndCommit) {
  std::string version = ReadFile(Runfile("VERSION"));
  version.erase(version.find_last_not_of(" \n") + 1);
  Result r = RunTool(GetParam(), "--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, MatchesRegex(GetParam() + " " + version + " \\(git [0-9a-z-]+\\)\n"));
  EXPECT_EQ(r.err, "");
}

TEST_P(ToolTest, HelpDocumentsExitCodesAndExitsZero) {
  Result r = RunTool(GetParam(), "--help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("usage: " + GetParam()));
  EXPECT_THAT(r.out, ContainsRegex("Exit status: 0 [^\n]*"));
  EXPECT_THAT(r.out, HasSubstr("2 usage error"));
  EXPECT_THAT(r.out, HasSubstr("--version"));
}

TEST_P(ToolTest, UnknownFlagIsAUsageError) {
  Result r = RunTool(GetParam(), "--no-such-flag x");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: " + GetParam()));
  EXPECT_THAT(r.err, HasSubstr("--no-such-flag"));
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(EveryTool, ToolTest, ::testing::Values("launch", "shm_manager", "hub", "lighthouse"),
                         [](const auto& info) { return info.param; });

TEST(MissingRequirements, ShmManagerNamesTheMissingSocketDirectory) {
  Result r = RunTool("shm_manager", "--socket=/nonexistent-ember-dir/manager.sock");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("the socket's directory '/nonexistent-ember-dir/' does not exist"));
}

TEST(MissingRequirements, HubWithoutAnyHomeSaysWhatToSet) {
  Result r = RunTool("hub", "fetch owner/repo");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no hub directory"));
  EXPECT_THAT(r.err, HasSubstr("TORCH_HUB_DIR"));
}

TEST(MissingRequirements, LighthouseNamesTheAddressItCannotServe) {
  Result r = RunTool("lighthouse", "--bind=192.0.2.1:29510");  // not this host's
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot listen on 192.0.2.1:29510"));
}

TEST(MissingRequirements, LaunchNamesTheMissingProgram) {
  Result r = RunTool("launch", "--nproc_per_node=2 no-such-program-anywhere");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot run 'no-such-program-anywhere'"));
}

}  // namespace
}  // namespace ember::tools
