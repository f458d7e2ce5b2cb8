// The hub binary run as a real process against the loopback HTTPS server:
// output, exit codes and errors on stderr.
#include <sys/wait.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/sha256.h"
#include "hub/testing/test_server.h"

namespace ember::hub {
namespace {

using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::TestServer;
using ::ember::hub::testing::WriteArchive;
using ::ember::hub::testing::WriteFile;
using ::testing::HasSubstr;

struct Result {
  int code;
  std::string out;
  std::string err;
};

class HubBinaryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmp = std::getenv("TEST_TMPDIR");
    base_ = new std::string(tmp);
    ASSERT_TRUE(WriteArchive(tmp + "/www/alice/models/zipball/main", "zip",
                             {{"top/hubconf.textproto",
                               "entry_points { name: \"tiny\" builder: \"mlp\" "
                               "doc: \"A tiny MLP.\" }\n"
                               "entry_points { name: \"cnn\" builder: "
                               "\"small_cnn\" doc: \"A small CNN.\" }"}})
                    .ok());
    std::string weights = *ReadFile("hub/testdata/tensors.pt");
    name_ =
        new std::string("tensors-" + Sha256Hex(weights).substr(0, 8) + ".pt");
    ASSERT_TRUE(WriteFile(tmp + "/www/w/" + *name_, weights).ok());
    absl::StatusOr<TestServer> s =
        TestServer::Start(tmp + "/www", tmp + "/server");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = new TestServer(std::move(*s));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete base_;
    delete name_;
  }
  // Runs tools/hub/hub with `args` (a shell-quoted string).
  Result Run(const std::string& args) {
    std::string out = *base_ + "/stdout", err = *base_ + "/stderr";
    std::string cmd = "EMBER_HUB_BASE_URL=" + server_->base_url() +
                      " EMBER_HUB_CA_BUNDLE=" + server_->ca_bundle() +
                      " TORCH_HUB_DIR=" + *base_ + "/hub tools/hub/hub " +
                      args + " >" + out + " 2>" + err + " </dev/null";
    int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, *ReadFile(out),
            *ReadFile(err)};
  }
  static std::string* base_;
  static std::string* name_;
  static TestServer* server_;
};
std::string* HubBinaryTest::base_ = nullptr;
std::string* HubBinaryTest::name_ = nullptr;
TestServer* HubBinaryTest::server_ = nullptr;

TEST_F(HubBinaryTest, FetchListHelp) {
  Result r = Run("fetch alice/models");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, *base_ + "/hub/alice_models_main\n");
  EXPECT_EQ(r.err, "");  // no terminal: no progress bar
  r = Run("list alice/models");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tiny\ncnn\n");
  r = Run("help alice/models cnn");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "A small CNN.\n");
  r = Run("list " + *base_ + "/hub/alice_models_main --local");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tiny\ncnn\n");
}

TEST_F(HubBinaryTest, FailuresGoToStderrWithStatusOne) {
  Result r = Run("help alice/models nope");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("cannot find callable nope"));
  EXPECT_THAT(r.err, HasSubstr("tiny, cnn"));
  r = Run("fetch bob/missing");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("neither a master nor a main branch"));
  r = Run("fetch alice/models:0123abcdef");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("looks like a commit"));
}

TEST_F(HubBinaryTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run("").code, 2);
  Result r = Run("frobnicate x/y");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(r.err, HasSubstr("usage: hub fetch"));
  EXPECT_EQ(Run("list a/b --bogus").code, 2);
  EXPECT_EQ(Run("help a/b").code, 2);
}

TEST_F(HubBinaryTest, Weights) {
  Result r = Run("weights " + server_->url("/w/" + *name_) + " --check-hash");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(*base_ + "/hub/checkpoints/" + *name_ + "\n"));
  EXPECT_THAT(r.out, HasSubstr("linear.weight float32 [4, 3]\n"));
  EXPECT_THAT(r.out, HasSubstr("bn.num_batches_tracked int64 []\n"));
  r = Run("weights " + server_->url("/w/missing-01234567.pt"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("HTTP 404"));
}

}  // namespace
}  // namespace ember::hub
