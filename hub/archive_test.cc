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
  // Extracts an archive of `entries`, expects it refused with nothing
  // written, and returns the refusal's message.
  std::string Refused(const std::string& format, const std::vector<ArchiveEntry>& entries) {
    std::string archive = base_ + "/a." + format;
    EXPECT_TRUE(WriteArchive(archive, format, entries).ok());
    absl::Status s = extract_archive(archive, dest_);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(Written(), ::testing::IsEmpty());
    return std::string(s.message());
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
    ASSERT_TRUE(extract_archive(archive, dest).ok());
    EXPECT_EQ(*ReadFile(dest + "/top/hubconf.textproto"), "entry_points {}");
    EXPECT_EQ(*ReadFile(dest + "/top/weights/w.bin"), std::string(5000, 'w'));
    EXPECT_TRUE(fs::is_symlink(dest + "/top/link"));
    EXPECT_EQ(*ReadFile(dest + "/top/link"), std::string(5000, 'w'));
  }
}

TEST_F(ArchiveTest, RefusesDotDotTraversal) {
  std::string message =
      Refused("zip", {{"top/ok.txt", "fine"}, {"top/../../escape.txt", "pwned"}});
  EXPECT_THAT(message, HasSubstr("'top/../../escape.txt'"));
  EXPECT_THAT(message, HasSubstr("nothing was extracted"));
  Refused("tar.gz", {{"top/ok.txt", "fine"}, {"top/sub/../../../escape.txt", "pwned"}});
}

TEST_F(ArchiveTest, RefusesAbsolutePaths) {
  std::string message =
      Refused("tar.gz", {{"top/ok.txt", "fine"}, {base_ + "/abs.txt", "pwned"}});
  EXPECT_THAT(message, HasSubstr("absolute path"));
}

TEST_F(ArchiveTest, RefusesSymlinksPointingOut) {
  std::string message =
      Refused("tar.gz", {{"top/"}, {"top/out", "", "../.."}, {"top/out/escape.txt", "pwned"}});
  EXPECT_THAT(message, HasSubstr("symbolic link to '../..'"));
  Refused("tar.gz", {{"top/etc", "", "/etc"}});
  Refused("zip", {{"top/a/b", "", "../../../x"}});
  // "." components do not count as depth.
  Refused("tar.gz", {{"./././l", "", "../x"}});
  Refused("tar.gz", {{"top/./l", "", "../../x"}});
}

TEST_F(ArchiveTest, RefusesHardlinksPointingOut) {
  std::string message =
      Refused("tar.gz", {{"top/ok.txt", "fine"}, {"top/passwd", "", "", "/etc/passwd"}});
  EXPECT_THAT(message, HasSubstr("hard link"));
  Refused("tar.gz", {{"top/ok.txt", "fine"}, {"top/x", "", "", "../outside"}});
}

TEST_F(ArchiveTest, CorruptArchiveIsAnError) {
  std::string archive = base_ + "/a.zip";
  ASSERT_TRUE(::ember::hub::testing::WriteFile(archive, "PK\x03\x04 this is not a zip").ok());
  absl::Status s = extract_archive(archive, dest_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(archive));
}

TEST_F(ArchiveTest, AnArchiveWithoutFilesIsAnError) {
  // An empty download, and archives holding only folders.
  std::string empty = base_ + "/a.zip";
  ASSERT_TRUE(::ember::hub::testing::WriteFile(empty, "").ok());
  absl::Status s = extract_archive(empty, dest_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("holds no files"));
  EXPECT_THAT(Written(), ::testing::IsEmpty());
  for (std::string format : {"zip", "tar.gz"}) {
    std::string archive = base_ + "/a." + format;
    ASSERT_TRUE(WriteArchive(archive, format, {{"top/"}, {"top/sub/"}}).ok());
    s = extract_archive(archive, dest_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << format << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("holds no files (2 entries"));
    EXPECT_THAT(Written(), ::testing::IsEmpty());
  }
}

TEST_F(ArchiveTest, UnpackedSizeAndEntriesAreCapped) {
  // 24 MiB of zeros compress to a few KiB; the cap here is 8 MiB.
  const std::string zeros(24 << 20, '\0');
  for (std::string format : {"zip", "tar.gz"}) {
    SCOPED_TRACE(format);
    std::string archive = base_ + "/a." + format;
    ASSERT_TRUE(
        WriteArchive(archive, format, {{"top/small.txt", "x"}, {"top/zeros.bin", zeros}}).ok());
    EXPECT_LT(fs::file_size(archive), 1u << 20);
    absl::Status s = extract_archive(archive, dest_, ExtractLimits{8 << 20, 0});
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(s.message(), HasSubstr("unpacks to more than 8388608 bytes"));
    EXPECT_THAT(s.message(), HasSubstr(kMaxUnpackedBytesEnv));
    fs::remove_all(dest_);  // what the caller does after an error
    EXPECT_TRUE(extract_archive(archive, dest_, ExtractLimits{32 << 20, 0}).ok());
    EXPECT_EQ(fs::file_size(dest_ + "/top/zeros.bin"), zeros.size());
    fs::remove_all(dest_);
  }
  fs::remove_all(base_ + "/cache");
  std::vector<ArchiveEntry> many;
  for (int i = 0; i < 20; ++i) many.push_back({"top/f" + std::to_string(i), "x"});
  std::string archive = base_ + "/a.tar.gz";
  ASSERT_TRUE(WriteArchive(archive, "tar.gz", many).ok());
  absl::Status s = extract_archive(archive, dest_, ExtractLimits{0, 10});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("more than 10 entries"));
  EXPECT_THAT(Written(), ::testing::IsEmpty());
}

TEST_F(ArchiveTest, LimitsFromTheEnvironment) {
  std::string archive = base_ + "/a.tar.gz";
  ASSERT_TRUE(WriteArchive(archive, "tar.gz", {{"top/w.bin", std::string(5000, 'w')}}).ok());
  setenv(kMaxUnpackedBytesEnv, "4096", 1);
  absl::Status s = extract_archive(archive, dest_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("more than 4096 bytes"));
  // The option wins over the environment.
  EXPECT_TRUE(extract_archive(archive, dest_, ExtractLimits{8192, 0}).ok());
  setenv(kMaxUnpackedBytesEnv, "lots", 1);
  s = extract_archive(archive, dest_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("EMBER_HUB_MAX_UNPACKED_BYTES='lots' is not a positive number"));
  unsetenv(kMaxUnpackedBytesEnv);
  setenv(kMaxUnpackedEntriesEnv, "0", 1);
  EXPECT_EQ(extract_archive(archive, dest_).code(), absl::StatusCode::kInvalidArgument);
  unsetenv(kMaxUnpackedEntriesEnv);
  absl::StatusOr<ExtractLimits> defaults = resolve_extract_limits({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->max_bytes, kDefaultMaxUnpackedBytes);
  EXPECT_EQ(defaults->max_entries, kDefaultMaxUnpackedEntries);
}

}  // namespace
}  // namespace ember::hub
