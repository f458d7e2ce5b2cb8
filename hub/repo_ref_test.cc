// "owner/repo[:ref]" parsing and cache folder names.
#include "hub/repo_ref.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::hub {
namespace {

using ::testing::HasSubstr;

TEST(RepoRefTest, ParsesOwnerRepoAndRef) {
  absl::StatusOr<RepoRef> r = parse_repo_ref("pytorch/vision:v0.10.0");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->owner, "pytorch");
  EXPECT_EQ(r->repo, "vision");
  EXPECT_EQ(r->ref, "v0.10.0");
  r = parse_repo_ref("alice/my-models");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->repo, "my-models");
  EXPECT_FALSE(r->ref.has_value());
  r = parse_repo_ref("alice/models:feature/x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ref, "feature/x");
}

TEST(RepoRefTest, RejectsMalformedNames) {
  for (const char* bad :
       {"alice", "/models", "alice/", "alice/models/extra", "al ice/models",
        "alice/models:", "alice/models:../x", "../x/y"}) {
    absl::StatusOr<RepoRef> r = parse_repo_ref(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(bad));
  }
}

TEST(RepoRefTest, RefusesBareCommits) {
  absl::StatusOr<RepoRef> r = parse_repo_ref("alice/models:3f2a9c1");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("looks like a commit"));
  r = parse_repo_ref("alice/models:0123456789abcdef0123456789abcdef01234567");
  EXPECT_FALSE(r.ok());
  // Letters only, or too short to be a commit: a branch name.
  EXPECT_TRUE(parse_repo_ref("alice/models:deadbeef").ok());
  EXPECT_TRUE(parse_repo_ref("alice/models:v1").ok());
}

TEST(RepoRefTest, cache_dir_name) {
  EXPECT_EQ(cache_dir_name("alice", "models", "master"), "alice_models_master");
  EXPECT_EQ(cache_dir_name("alice", "models", "feature/x"), "alice_models_feature_x");
}

}  // namespace
}  // namespace ember::hub
