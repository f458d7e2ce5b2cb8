// Downloads against a real HTTPS server on loopback
// (hub/testing/hub_server.py).
#include "hub/download.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/sha256.h"
#include "hub/testing/test_server.h"

namespace ember::hub {
namespace {

namespace fs = std::filesystem;
using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::TestServer;
using ::ember::hub::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::Not;

class DownloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmp = std::getenv("TEST_TMPDIR");
    root_ = new std::string(tmp + "/www");
    ASSERT_TRUE(WriteFile(*root_ + "/files/blob.bin", Blob()).ok());
    absl::StatusOr<TestServer> s = TestServer::Start(*root_, tmp + "/server");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = new TestServer(std::move(*s));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete root_;
  }
  void SetUp() override {
    unsetenv(kCaBundleEnv);
    out_dir_ = std::string(std::getenv("TEST_TMPDIR")) + "/out/" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(out_dir_);
    options_.ca_bundle = server_->ca_bundle();
    options_.progress = false;
    options_.initial_backoff = absl::Milliseconds(10);
  }
  static std::string Blob() {
    std::string b;
    for (int i = 0; i < 200000; ++i) b.push_back(static_cast<char>(i * 7 % 251));
    return b;
  }
  // Files in out_dir_ (to check that no temporary is left behind).
  std::vector<std::string> Listing() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out_dir_)) names.push_back(e.path().filename());
    return names;
  }

  static std::string* root_;
  static TestServer* server_;
  std::string out_dir_;
  DownloadOptions options_;
};
std::string* DownloadTest::root_ = nullptr;
TestServer* DownloadTest::server_ = nullptr;

TEST_F(DownloadTest, DownloadsAndChecksHashPrefix) {
  std::string dest = out_dir_ + "/blob.bin";
  options_.hash_prefix = sha256_hex(Blob()).substr(0, 10);
  ASSERT_TRUE(download_url_to_file(server_->url("/files/blob.bin"), dest, options_).ok());
  EXPECT_EQ(*ReadFile(dest), Blob());
  EXPECT_THAT(Listing(), ::testing::ElementsAre("blob.bin"));
}

TEST_F(DownloadTest, HashMismatchKeepsTheOldFile) {
  std::string dest = out_dir_ + "/blob.bin";
  ASSERT_TRUE(WriteFile(dest, "old contents").ok());
  options_.hash_prefix = "00000000";
  absl::Status s = download_url_to_file(server_->url("/files/blob.bin"), dest, options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("expected the SHA-256 to start with '00000000'"));
  EXPECT_THAT(s.message(), HasSubstr(sha256_hex(Blob())));
  EXPECT_EQ(*ReadFile(dest), "old contents");
  EXPECT_THAT(Listing(), ::testing::ElementsAre("blob.bin"));
}

TEST_F(DownloadTest, NotFound) {
  absl::Status s = download_url_to_file(server_->url("/files/missing.bin"), out_dir_ + "/m", options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/files/missing.bin"));
  EXPECT_TRUE(Listing().empty());
}

TEST_F(DownloadTest, InterruptedTransferIsRetriedThenLeavesNothing) {
  options_.max_attempts = 2;
  absl::Status s =
      download_url_to_file(server_->url("/cut/files/blob.bin"), out_dir_ + "/blob.bin", options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("after 2 attempts"));
  EXPECT_TRUE(Listing().empty());
  EXPECT_EQ(*server_->RequestCount("/cut/files/blob.bin"), 2);
}

TEST_F(DownloadTest, ServerErrorIsRetried) {
  std::string dest = out_dir_ + "/blob.bin";
  ASSERT_TRUE(download_url_to_file(server_->url("/flaky/files/blob.bin"), dest, options_).ok());
  EXPECT_EQ(*ReadFile(dest), Blob());
  EXPECT_EQ(*server_->RequestCount("/flaky/files/blob.bin"), 2);
}

TEST_F(DownloadTest, RedirectsOnlyToHttps) {
  std::string dest = out_dir_ + "/blob.bin";
  ASSERT_TRUE(
      download_url_to_file(server_->url("/redirect-https/files/blob.bin"), dest, options_).ok());
  EXPECT_EQ(*ReadFile(dest), Blob());
  fs::remove(dest);
  absl::Status s = download_url_to_file(server_->url("/redirect-http/files/blob.bin"), dest, options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("redirect"));
  EXPECT_TRUE(Listing().empty());
}

TEST_F(DownloadTest, OtherSchemesAreUnsupportedNotRedirects) {
  for (const std::string url :
       {"ftp://127.0.0.1/x-01234567.pt", "file:///etc/passwd", "gopher://127.0.0.1/x"}) {
    SCOPED_TRACE(url);
    absl::Status s = download_url_to_file(url, out_dir_ + "/x", options_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("unsupported URL scheme '" + url.substr(0, url.find(':'))));
    EXPECT_THAT(s.message(), Not(HasSubstr("redirect")));
  }
  absl::Status s = download_url_to_file("127.0.0.1/x", out_dir_ + "/x", options_);
  EXPECT_THAT(s.message(), HasSubstr("has no scheme"));
  EXPECT_TRUE(Listing().empty());
  // The scheme is case-insensitive, as in curl.
  std::string upper = server_->url("/files/blob.bin");
  upper.replace(0, 5, "HTTPS");
  EXPECT_TRUE(download_url_to_file(upper, out_dir_ + "/b", options_).ok());
}

TEST_F(DownloadTest, VerifiesTheServerCertificate) {
  options_.ca_bundle.clear();  // the system's CAs do not trust the test certificate
  absl::Status s = download_url_to_file(server_->url("/files/blob.bin"), out_dir_ + "/b", options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(kCaBundleEnv));
  EXPECT_TRUE(Listing().empty());
  // The environment variable names the bundle too.
  setenv(kCaBundleEnv, server_->ca_bundle().c_str(), 1);
  EXPECT_TRUE(download_url_to_file(server_->url("/files/blob.bin"), out_dir_ + "/b", options_).ok());
}

TEST_F(DownloadTest, ConnectionRefusedFailsAfterRetries) {
  options_.max_attempts = 2;
  absl::Status s = download_url_to_file("https://127.0.0.1:1/x", out_dir_ + "/x", options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace ember::hub
