// load_state_dict_from_url against a real HTTPS server on loopback: caching,
// the name-<sha256>.ext check on download and on the cached file, interrupted
// downloads.
#include "hub/load_state_dict_from_url.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/hub_dir.h"
#include "hub/sha256.h"
#include "hub/testing/test_server.h"

namespace ember::hub {
namespace {

namespace fs = std::filesystem;
using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::TestServer;
using ::ember::hub::testing::WriteFile;
using ::testing::HasSubstr;

TEST(HashPrefixTest, FollowsTorchHubsRegex) {
  EXPECT_EQ(hash_prefix_from_file_name("resnet18-f37072fd.pth"), "f37072fd");
  EXPECT_EQ(hash_prefix_from_file_name("my-model-0123abcd.tar.gz"), "0123abcd");
  EXPECT_EQ(hash_prefix_from_file_name("model.pt"), "");
  EXPECT_EQ(hash_prefix_from_file_name("model-v2.pt"), "");
}

class LoadFromUrlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    hub_dir_ = base_ + "/hub";
    set_dir(hub_dir_);
    fixture_ = *ReadFile("serialization/testdata/tensors.pt");
    digest_ = sha256_hex(fixture_);
    good_name_ = "tensors-" + digest_.substr(0, 10) + ".pt";
    ASSERT_TRUE(WriteFile(base_ + "/www/w/" + good_name_, fixture_).ok());
    ASSERT_TRUE(WriteFile(base_ + "/www/w/tensors-00000000.pt", fixture_).ok());
    ASSERT_TRUE(WriteFile(base_ + "/www/w/plain.pt", fixture_).ok());
    absl::StatusOr<TestServer> s = TestServer::Start(base_ + "/www", base_ + "/server");
    ASSERT_TRUE(s.ok()) << s.status();
    server_.emplace(std::move(*s));
    options_.download.ca_bundle = server_->ca_bundle();
    options_.download.initial_backoff = absl::Milliseconds(10);
    options_.progress = false;
    options_.check_hash = true;
  }
  void TearDown() override { set_dir(""); }
  std::vector<std::string> Cache() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(hub_dir_ + "/checkpoints")) {
      names.push_back(e.path().filename());  // lock files included: none may be left
    }
    return names;
  }

  std::string base_, hub_dir_, fixture_, digest_, good_name_;
  std::optional<TestServer> server_;
  LoadFromUrlOptions options_;
};

TEST_F(LoadFromUrlTest, DownloadsIntoCheckpointsAndReusesTheFile) {
  absl::StatusOr<StateDict> sd =
      load_state_dict_from_url(server_->url("/w/" + good_name_), options_);
  ASSERT_TRUE(sd.ok()) << sd.status();
  ASSERT_EQ(sd->size(), 13u);
  EXPECT_EQ((*sd)[2].first, "bn.num_batches_tracked");
  EXPECT_EQ((*sd)[2].second.item<int64_t>(), 7);
  EXPECT_EQ(*ReadFile(hub_dir_ + "/checkpoints/" + good_name_), fixture_);

  sd = load_state_dict_from_url(server_->url("/w/" + good_name_), options_);
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_EQ(*server_->RequestCount("/w/" + good_name_), 1);
  server_.reset();  // offline: the cached file still loads
  EXPECT_TRUE(load_state_dict_from_url("https://127.0.0.1:1/w/" + good_name_, options_).ok());
}

TEST_F(LoadFromUrlTest, HashMismatchOnDownloadLeavesNoCacheEntry) {
  absl::Status s =
      load_state_dict_from_url(server_->url("/w/tensors-00000000.pt"), options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'00000000'"));
  EXPECT_THAT(s.message(), HasSubstr(digest_));
  EXPECT_THAT(Cache(), ::testing::IsEmpty());
}

TEST_F(LoadFromUrlTest, CachedFileIsCheckedBeforeLoading) {
  std::string cached = hub_dir_ + "/checkpoints/" + good_name_;
  ASSERT_TRUE(WriteFile(cached, "tampered").ok());
  absl::Status s = load_state_dict_from_url(server_->url("/w/" + good_name_), options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("delete it to download it again"));
  EXPECT_EQ(*ReadFile(cached), "tampered");  // left for inspection
  EXPECT_EQ(*server_->RequestCount("/w/" + good_name_), 0);
}

TEST_F(LoadFromUrlTest, HubconfSha256IsCheckedToo) {
  options_.check_hash = false;
  options_.sha256 = "ffffffff";
  absl::Status s = load_state_dict_from_url(server_->url("/w/plain.pt"), options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Cache(), ::testing::IsEmpty());
  options_.sha256 = digest_.substr(0, 16);
  EXPECT_TRUE(load_state_dict_from_url(server_->url("/w/plain.pt"), options_).ok());
}

TEST_F(LoadFromUrlTest, CheckHashNeedsAHashInTheName) {
  absl::Status s = load_state_dict_from_url(server_->url("/w/plain.pt"), options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'plain.pt'"));
  options_.check_hash = false;
  EXPECT_TRUE(load_state_dict_from_url(server_->url("/w/plain.pt"), options_).ok());
}

TEST_F(LoadFromUrlTest, InterruptedDownloadLeavesNothing) {
  options_.download.max_attempts = 2;
  options_.model_dir = base_ + "/models";
  absl::Status s =
      load_state_dict_from_url(server_->url("/cut/w/" + good_name_), options_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(base_ + "/models"))
    left.push_back(e.path().filename());
  EXPECT_THAT(left, ::testing::IsEmpty());  // no partial download, no lock file
}

}  // namespace
}  // namespace ember::hub
