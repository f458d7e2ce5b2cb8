// Archive extraction: well-formed zip and tar.gz archives extract; traversal,
// absolute, symlink and hardlink entries make the whole archive refused with
// nothing written.
#include "hub/archive.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/testing/test_server.h"

namespace ember::hub {
namespace {

namespace fs = std::filesystem;
using ::ember::hub::testing::ArchiveEntry;
using ::ember::hub::testing::ReadFile;
using ::ember::hub::testing::WriteArchive;
using ::testing::HasSubstr;

class ArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(base_);
    dest_ = base_ + "/cache/repo";
  }
  // Everything under base_ except the archive itself.
  std::vector<std::string> Written() {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(base_)) {
      if (e.path().filename() != "a.zip" && e.path().filename() != "a.tar.gz") {
        out.push_back(fs::relative(e.path(), base_));
      }
    }
    return out;
  }
  absl::Status Refused(const std::string& format,
                       const std::vector<ArchiveEntry>& entries) {
    std::string archive = base_ + "/a." + format;
    EXPECT_TRUE(WriteArchive(archive, format, entries).ok());
    absl::Status s = ExtractArchive(archive, dest_);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(Written(), ::testing::IsEmpty());
    return s;
  }
  std::string base_;
  std::string dest_;
};

TEST_F(ArchiveTest, ExtractsZipAndTarGz) {
  for (std::string format : {"zip", "tar.gz"}) {
    std::string archive = base_ + "/a." + format;
    ASSERT_TRUE(WriteArchive(archive, format,
                             {{"top/"},
                              {"top/hubconf.textproto", "entry_points {}"},
                              {"top/weights/w.bin", std::string(5000, 'w')},
                              {"top/link", "", "weights/w.bin"},
                              {"top/weights/up", "", "../hubconf.textproto"}})
                    .ok());
    std::string dest = base_ + "/out-" + format;
    ASSERT_TRUE(ExtractArchive(archive, dest).ok());
    EXPECT_EQ(*ReadFile(dest + "/top/hubconf.textproto"), "entry_points {}");
    EXPECT_EQ(*ReadFile(dest + "/top/weights/w.bin"), std::string(5000, 'w'));
    EXPECT_TRUE(fs::is_symlink(dest + "/top/link"));
    EXPECT_EQ(*ReadFile(dest + "/top/link"), std::string(5000, 'w'));
  }
}

TEST_F(ArchiveTest, RefusesDotDotTraversal) {
  absl::Status s = Refused(
      "zip", {{"top/ok.txt", "fine"}, {"top/../../escape.txt", "pwned"}});
  EXPECT_THAT(s.message(), HasSubstr("'top/../../escape.txt'"));
  EXPECT_THAT(s.message(), HasSubstr("nothing was extracted"));
  Refused("tar.gz",
          {{"top/ok.txt", "fine"}, {"top/sub/../../../escape.txt", "pwned"}});
}

TEST_F(ArchiveTest, RefusesAbsolutePaths) {
  absl::Status s = Refused(
      "tar.gz", {{"top/ok.txt", "fine"}, {base_ + "/abs.txt", "pwned"}});
  EXPECT_THAT(s.message(), HasSubstr("absolute path"));
}

TEST_F(ArchiveTest, RefusesSymlinksPointingOut) {
  absl::Status s = Refused(
      "tar.gz",
      {{"top/"}, {"top/out", "", "../.."}, {"top/out/escape.txt", "pwned"}});
  EXPECT_THAT(s.message(), HasSubstr("symbolic link to '../..'"));
  Refused("tar.gz", {{"top/etc", "", "/etc"}});
  Refused("zip", {{"top/a/b", "", "../../../x"}});
  // "." components do not count as depth.
  Refused("tar.gz", {{"./././l", "", "../x"}});
  Refused("tar.gz", {{"top/./l", "", "../../x"}});
}

TEST_F(ArchiveTest, RefusesHardlinksPointingOut) {
  absl::Status s = Refused("tar.gz", {{"top/ok.txt", "fine"},
                                      {"top/passwd", "", "", "/etc/passwd"}});
  EXPECT_THAT(s.message(), HasSubstr("hard link"));
  Refused("tar.gz", {{"top/ok.txt", "fine"}, {"top/x", "", "", "../outside"}});
}

TEST_F(ArchiveTest, CorruptArchiveIsAnError) {
  std::string archive = base_ + "/a.zip";
  ASSERT_TRUE(
      ::ember::hub::testing::WriteFile(archive, "PK\x03\x04 this is not a zip")
          .ok());
  absl::Status s = ExtractArchive(archive, dest_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(archive));
}

}  // namespace
}  // namespace ember::hub
