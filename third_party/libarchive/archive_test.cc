// Proves libarchive links: writes a gzipped tar in memory and reads it back.
#include <archive.h>
#include <archive_entry.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

TEST(ArchiveTest, TarGzRoundTripInMemory) {
  std::vector<char> buffer(1 << 16);
  size_t used = 0;
  const std::string content = "hello from the archive";
  {
    archive* a = archive_write_new();
    ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    ASSERT_EQ(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    ASSERT_EQ(archive_write_open_memory(a, buffer.data(), buffer.size(), &used),
              ARCHIVE_OK);
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, "repo/README");
    archive_entry_set_size(e, content.size());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    ASSERT_EQ(archive_write_header(a, e), ARCHIVE_OK);
    ASSERT_EQ(archive_write_data(a, content.data(), content.size()),
              static_cast<la_ssize_t>(content.size()));
    archive_entry_free(e);
    ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
  }
  ASSERT_GT(used, 0u);

  archive* r = archive_read_new();
  archive_read_support_filter_all(r);
  archive_read_support_format_all(r);
  ASSERT_EQ(archive_read_open_memory(r, buffer.data(), used), ARCHIVE_OK);
  archive_entry* entry = nullptr;
  ASSERT_EQ(archive_read_next_header(r, &entry), ARCHIVE_OK);
  EXPECT_STREQ(archive_entry_pathname(entry), "repo/README");
  std::string read(content.size(), '\0');
  EXPECT_EQ(archive_read_data(r, read.data(), read.size()),
            static_cast<la_ssize_t>(content.size()));
  EXPECT_EQ(read, content);
  EXPECT_EQ(archive_read_next_header(r, &entry), ARCHIVE_EOF);
  archive_read_free(r);
}

}  // namespace
