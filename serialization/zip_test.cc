// The checkpoint zip container: round trips, a PyTorch-written file, zip64,
// and refusal of truncated, corrupt, duplicate and oversized archives.
#include "serialization/zip.h"

#include <archive.h>
#include <archive_entry.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::serialization {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Written(const std::vector<std::pair<std::string, std::string>>& entries) {
  ZipWriter w;
  for (const auto& [name, data] : entries) w.add(name, data);
  absl::StatusOr<std::string> bytes = std::move(w).finish();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

// A zip written by libarchive directly with zip format `options` (e.g.
// "zip:zip64", "zip:compression=deflate"), for what ZipWriter never writes.
std::string WrittenWithOptions(const std::string& options, const std::string& name,
                               const std::string& data) {
  struct Deleter {
    void operator()(struct archive* a) const { archive_write_free(a); }
  };
  std::unique_ptr<struct archive, Deleter> a(archive_write_new());
  std::vector<char> buf(data.size() + 4096);
  size_t used = 0;
  archive_write_set_format_zip(a.get());
  EXPECT_EQ(archive_write_set_options(a.get(), options.c_str()), ARCHIVE_OK)
      << archive_error_string(a.get());
  archive_write_set_bytes_per_block(a.get(), 0);
  EXPECT_EQ(archive_write_open_memory(a.get(), buf.data(), buf.size(), &used), ARCHIVE_OK);
  struct archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  EXPECT_EQ(archive_write_header(a.get(), e), ARCHIVE_OK);
  archive_entry_free(e);
  EXPECT_EQ(archive_write_data(a.get(), data.data(), data.size()),
            static_cast<la_ssize_t>(data.size()));
  EXPECT_EQ(archive_write_close(a.get()), ARCHIVE_OK) << archive_error_string(a.get());
  return std::string(buf.data(), used);
}

// Bytes that deflate cannot shrink.
std::string Incompressible(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 12345;
  for (char& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

TEST(ZipTest, RoundTripsEntriesInOrder) {
  std::string binary = Incompressible(100000);
  binary[17] = '\0';
  std::string bytes = Written({{"archive/data.pkl", "pickle"},
                               {"archive/empty", ""},
                               {"archive/data/0", binary},
                               {"archive/version", "3\n"}});
  absl::StatusOr<ZipReader> zip = ZipReader::open(bytes, "a.pt");
  ASSERT_TRUE(zip.ok()) << zip.status();
  EXPECT_THAT(zip->names(), ElementsAre("archive/data.pkl", "archive/empty", "archive/data/0",
                                        "archive/version"));
  EXPECT_EQ(*zip->read("archive/data.pkl"), "pickle");
  EXPECT_EQ(*zip->read("archive/empty"), "");
  EXPECT_EQ(*zip->read("archive/data/0"), binary);
  EXPECT_EQ(*zip->read("archive/version"), "3\n");
  EXPECT_TRUE(zip->contains("archive/version"));
  EXPECT_FALSE(zip->contains("archive/data/1"));
  absl::Status missing = zip->read("archive/data/1").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("a.pt: no record 'archive/data/1'"));
}

TEST(ZipTest, ReadsAPyTorchWrittenFile) {
  std::ifstream in("serialization/testdata/tensors.pt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ZipReader> zip = ZipReader::open(ss.str(), "tensors.pt");
  ASSERT_TRUE(zip.ok()) << zip.status();
  EXPECT_TRUE(zip->contains("tensors/data.pkl"));
  EXPECT_EQ(*zip->read("tensors/version"), "3\n");
}

TEST(ZipTest, ReadsZip64Records) {
  std::string data = Incompressible(5000);
  std::string bytes = WrittenWithOptions("zip:zip64", "archive/data/0", data);
  // The zip64 end-of-directory record and its locator are present.
  ASSERT_NE(bytes.find("PK\x06\x06"), std::string::npos);
  ASSERT_NE(bytes.find("PK\x06\x07"), std::string::npos);
  absl::StatusOr<ZipReader> zip = ZipReader::open(bytes, "z64.pt");
  ASSERT_TRUE(zip.ok()) << zip.status();
  EXPECT_EQ(*zip->read("archive/data/0"), data);
}

TEST(ZipTest, EveryTruncationIsRefusedNamingTheFile) {
  std::string bytes =
      Written({{"archive/data.pkl", "pickle bytes"}, {"archive/data/0", Incompressible(300)}});
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<ZipReader> zip = ZipReader::open(bytes.substr(0, n), "t.pt");
    ASSERT_FALSE(zip.ok()) << "accepted the first " << n << " bytes";
    EXPECT_EQ(zip.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(zip.status().message(), HasSubstr("t.pt: "));
  }
  absl::Status junk = ZipReader::open("PK\x03\x04 not a zip", "j.pt").status();
  EXPECT_EQ(junk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(junk.message(), HasSubstr("truncated or not a zip"));
}

TEST(ZipTest, CorruptDataFailsItsCrc) {
  std::string payload = Incompressible(1000);
  std::string bytes = Written({{"archive/data/0", payload}});
  size_t at = bytes.find(payload);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 500] ^= 0x5a;
  absl::Status s = ZipReader::open(bytes, "c.pt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("c.pt: record 'archive/data/0'"));
  EXPECT_THAT(s.message(), HasSubstr("CRC"));
}

TEST(ZipTest, RefusesDuplicateNames) {
  std::string bytes = Written({{"archive/data/0", "a"}, {"archive/data/0", "b"}});
  absl::Status s = ZipReader::open(bytes, "d.pt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("d.pt: "));
  EXPECT_THAT(s.message(), HasSubstr("'archive/data/0' appears twice"));
}

TEST(ZipTest, DecodesCompressedEntriesOnlyWithinTheFileSize) {
  // Deflated but incompressible: decodes to fewer bytes than the file holds.
  std::string data = Incompressible(4000);
  std::string bytes = WrittenWithOptions("zip:compression=deflate", "archive/data/0", data);
  absl::StatusOr<ZipReader> zip = ZipReader::open(bytes, "ok.pt");
  ASSERT_TRUE(zip.ok()) << zip.status();
  EXPECT_EQ(*zip->read("archive/data/0"), data);

  // 1 MiB of zeros deflates to about a kilobyte: refused, not decoded.
  bytes =
      WrittenWithOptions("zip:compression=deflate", "archive/data/0", std::string(1 << 20, '\0'));
  ASSERT_LT(bytes.size(), 1u << 16);
  absl::Status s = ZipReader::open(bytes, "bomb.pt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("bomb.pt: "));
  EXPECT_THAT(s.message(), HasSubstr("'archive/data/0'"));
  EXPECT_THAT(s.message(), HasSubstr("uncompressed"));
}

}  // namespace
}  // namespace ember::serialization
