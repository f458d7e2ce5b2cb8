// Fetching repositories from a real HTTPS server on loopback: cache layout and
// reuse, force_reload, the default branch, offline use and refused archives.
#include "hub/repo_cache.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/archive.h"
#include "hub/hub_dir.h"
#include "hub/testing/test_server.h"

namespace ember::hub {
namespace {

namespace fs = std::filesystem;
using ::ember::hub::testing::ArchiveEntry;
using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::TestServer;
using ::ember::hub::testing::WriteArchive;
using ::ember::hub::testing::WriteFile;
using ::testing::HasSubstr;

class RepoCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    www_ = base_ + "/www";
    hub_dir_ = base_ + "/hub";
    set_dir(hub_dir_);
    absl::StatusOr<TestServer> s = TestServer::Start(www_, base_ + "/server");
    ASSERT_TRUE(s.ok()) << s.status();
    server_.emplace(std::move(*s));
    options_.base_url = server_->base_url();
    options_.download.ca_bundle = server_->ca_bundle();
    options_.download.progress = false;
    options_.download.initial_backoff = absl::Milliseconds(10);
  }
  void TearDown() override { set_dir(""); }

  // Publishes owner/repo at `ref` with a hubconf whose doc is `doc`.
  void Publish(const std::string& owner_repo, const std::string& ref, const std::string& doc,
               const std::string& format = "zip") {
    std::string top = "x-" + ref + "-0123abc/";
    ASSERT_TRUE(
        WriteArchive(www_ + "/" + owner_repo + "/zipball/" + ref, format,
                     {{top},
                      {top + "hubconf.textproto",
                       "entry_points { name: \"m\" builder: \"mlp\" doc: \"" + doc + "\" }"},
                      {top + "weights/w.bin", "weights of " + doc}})
            .ok());
  }
  absl::StatusOr<FetchedRepo> Fetch(const std::string& text) {
    absl::StatusOr<RepoRef> ref = parse_repo_ref(text);
    if (!ref.ok()) return ref.status();
    return fetch_repo(*ref, options_);
  }
  int Requests(const std::string& path) { return *server_->RequestCount(path); }

  std::string base_, www_, hub_dir_;
  std::optional<TestServer> server_;
  FetchOptions options_;
};

TEST_F(RepoCacheTest, FetchesIntoOwnerRepoRefAndReusesTheCache) {
  Publish("alice/models", "v1", "first", "tar.gz");
  absl::StatusOr<FetchedRepo> r = Fetch("alice/models:v1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dir, hub_dir_ + "/alice_models_v1");
  EXPECT_EQ(r->ref, "v1");
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("first"));
  EXPECT_EQ(*ReadFile(r->dir + "/weights/w.bin"), "weights of first");

  // Published again: the cache still answers, without a request.
  Publish("alice/models", "v1", "second");
  r = Fetch("alice/models:v1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("first"));
  EXPECT_EQ(Requests("/alice/models/zipball/v1"), 1);

  // force_reload fetches the new copy.
  options_.force_reload = true;
  r = Fetch("alice/models:v1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("second"));
  EXPECT_EQ(Requests("/alice/models/zipball/v1"), 2);
  // Nothing but the repository is left in the hub directory (no lock file).
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(hub_dir_)) names.push_back(e.path().filename());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("alice_models_v1"));
}

TEST_F(RepoCacheTest, ForceReloadDeletesDownloadedWeights) {
  std::string top = "t/";
  ASSERT_TRUE(WriteArchive(www_ + "/alice/models/zipball/v1", "zip",
                           {{top + "hubconf.textproto",
                             "entry_points { name: \"m\" builder: \"mlp\" weights { url: "
                             "\"https://example.org/m-0123abcd.pt\" sha256: \"0123abcd\" } }"}})
                  .ok());
  ASSERT_TRUE(Fetch("alice/models:v1").ok());
  ASSERT_TRUE(WriteFile(hub_dir_ + "/checkpoints/m-0123abcd.pt", "downloaded").ok());
  ASSERT_TRUE(WriteFile(hub_dir_ + "/checkpoints/other-01234567.pt", "someone else's").ok());
  options_.force_reload = true;
  ASSERT_TRUE(Fetch("alice/models:v1").ok());
  EXPECT_FALSE(fs::exists(hub_dir_ + "/checkpoints/m-0123abcd.pt"));
  EXPECT_TRUE(fs::exists(hub_dir_ + "/checkpoints/other-01234567.pt"));
}

TEST_F(RepoCacheTest, DefaultBranchIsMasterThenMain) {
  Publish("alice/models", "master", "on master");
  Publish("alice/models", "main", "on main");
  absl::StatusOr<FetchedRepo> r = Fetch("alice/models");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ref, "master");
  EXPECT_EQ(r->dir, hub_dir_ + "/alice_models_master");

  Publish("bob/mainonly", "main", "only main");
  r = Fetch("bob/mainonly");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ref, "main");
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("only main"));
  EXPECT_EQ(Requests("/bob/mainonly/zipball/master"), 1);

  r = Fetch("carol/nothing");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("neither a master nor a main branch"));
  r = Fetch("alice/models:v9");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("'v9'"));
}

TEST_F(RepoCacheTest, WorksOfflineFromTheCache) {
  Publish("alice/models", "main", "cached");
  ASSERT_TRUE(Fetch("alice/models").ok());
  server_.reset();  // the network is gone
  absl::StatusOr<FetchedRepo> r = Fetch("alice/models");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ref, "main");
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("cached"));
  // A reload cannot reach the server; the cached copy survives.
  options_.force_reload = true;
  options_.download.max_attempts = 1;
  r = Fetch("alice/models:main");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(*ReadFile(hub_dir_ + "/alice_models_main/hubconf.textproto"), HasSubstr("cached"));
}

TEST_F(RepoCacheTest, MaliciousArchiveLeavesNoCacheEntry) {
  ASSERT_TRUE(
      WriteArchive(www_ + "/evil/repo/zipball/master", "tar.gz",
                   {{"t/hubconf.textproto", "entry_points {}"}, {"t/../../../pwned.txt", "x"}})
          .ok());
  absl::StatusOr<FetchedRepo> r = Fetch("evil/repo");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(hub_dir_)) names.push_back(e.path().filename());
  EXPECT_THAT(names, ::testing::IsEmpty());
  EXPECT_FALSE(fs::exists(base_ + "/pwned.txt"));
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  return names;
}

TEST_F(RepoCacheTest, EmptyDownloadLeavesNoCacheEntry) {
  ASSERT_TRUE(WriteFile(www_ + "/alice/models/zipball/master", "").ok());
  absl::StatusOr<FetchedRepo> r = Fetch("alice/models");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("holds no files"));
  EXPECT_THAT(Listing(hub_dir_), ::testing::IsEmpty());
  // Once the repository is published, a plain fetch (no force_reload) works.
  Publish("alice/models", "master", "published");
  r = Fetch("alice/models");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("published"));
}

TEST_F(RepoCacheTest, EmptyCachedFolderIsFetchedAgain) {
  // What an older version left after an empty download.
  fs::create_directories(hub_dir_ + "/alice_models_master");
  Publish("alice/models", "master", "fresh");
  absl::StatusOr<FetchedRepo> r = Fetch("alice/models");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*ReadFile(r->dir + "/hubconf.textproto"), HasSubstr("fresh"));
}

TEST_F(RepoCacheTest, ArchiveUnpackingPastTheLimitLeavesNoCacheEntry) {
  const std::string top = "x-master-0123abc/";
  ASSERT_TRUE(WriteArchive(www_ + "/alice/models/zipball/master", "zip",
                           {{top + "hubconf.textproto", "entry_points {}"},
                            {top + "zeros.bin", std::string(8 << 20, '\0')}})
                  .ok());
  options_.max_unpacked_bytes = 1 << 20;
  absl::StatusOr<FetchedRepo> r = Fetch("alice/models");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("unpacks to more than 1048576 bytes"));
  EXPECT_THAT(Listing(hub_dir_), ::testing::IsEmpty());
  options_.max_unpacked_bytes = 0;
  setenv(kMaxUnpackedBytesEnv, "1048576", 1);
  r = Fetch("alice/models");
  unsetenv(kMaxUnpackedBytesEnv);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(Listing(hub_dir_), ::testing::IsEmpty());
  EXPECT_TRUE(Fetch("alice/models").ok());  // the default allows 8 MiB
}

TEST_F(RepoCacheTest, ConcurrentLoadersDownloadOnce) {
  Publish("alice/models", "v2", "shared");
  std::vector<absl::StatusOr<FetchedRepo>> results(4, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    ranks.emplace_back([&, rank] { results[rank] = Fetch("alice/models:v2"); });
  }
  for (std::thread& t : ranks) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->dir, hub_dir_ + "/alice_models_v2");
  }
  EXPECT_EQ(Requests("/alice/models/zipball/v2"), 1);
  EXPECT_THAT(*ReadFile(hub_dir_ + "/alice_models_v2/hubconf.textproto"), HasSubstr("shared"));
}

TEST_F(RepoCacheTest, BaseUrlFromEnvironment) {
  FetchOptions defaults;
  unsetenv(kBaseUrlEnv);
  EXPECT_EQ(resolve_base_url(defaults), "https://github.com");
  setenv(kBaseUrlEnv, "https://mirror.example/", 1);
  EXPECT_EQ(resolve_base_url(defaults), "https://mirror.example");
  defaults.base_url = "https://explicit.example";
  EXPECT_EQ(resolve_base_url(defaults), "https://explicit.example");
  unsetenv(kBaseUrlEnv);
}

}  // namespace
}  // namespace ember::hub
