#include "distributed/checkpoint/data_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed::checkpoint {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Memory aligned to a block, filled with a pattern that differs per byte.
struct AlignedBytes {
  explicit AlignedBytes(size_t n, int seed)
      : data(static_cast<char*>(std::aligned_alloc(kDirectAlignment, n + kDirectAlignment))) {
    for (size_t i = 0; i < n + kDirectAlignment; ++i) {
      data.get()[i] = static_cast<char>((i * 131 + seed) % 251);
    }
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data;
};

// Appends every run to the writer and to `expected`, the file's bytes as the
// runs' concatenation.
void AppendAll(DataFileWriter& file, const std::vector<std::pair<const char*, size_t>>& runs,
               std::string& expected) {
  for (const auto& [p, n] : runs) {
    ASSERT_TRUE(file.Append(p, n).ok());
    expected.append(p, n);
    ASSERT_EQ(file.size(), static_cast<int64_t>(expected.size()));
  }
}

// Runs that take every path: aligned from the caller's memory with a tail,
// unaligned, tiny, empty, longer than the gathering buffer (which fills and
// is written), and aligned runs that are gathered because the buffer holds
// bytes.
std::vector<std::pair<const char*, size_t>> MixedRuns(const AlignedBytes& big,
                                                      const AlignedBytes& small) {
  return {
      {big.data.get(), 3 * kDirectAlignment + 100},  // aligned, then a tail of 100
      {big.data.get() + 1, 7},                       // unaligned and tiny
      {small.data.get(), 0},                         // nothing
      {big.data.get() + 3, (size_t{5} << 20) + 11},  // past the 4 MiB buffer, unaligned
      {small.data.get(), 2 * kDirectAlignment},      // aligned, gathered
      {big.data.get(), size_t{6} << 20},             // aligned, gathered, the buffer fills
  };
}

class DataFileWriterTest : public ::testing::TestWithParam<bool> {};

TEST_P(DataFileWriterTest, FileHoldsExactlyTheAppendedBytes) {
  const bool direct = GetParam();
  const std::string path = TempPath(absl::StrCat("mixed_", direct, ".bin"));
  AlignedBytes big(size_t{8} << 20, 1), small(size_t{1} << 16, 2);
  absl::StatusOr<DataFileWriter> file = DataFileWriter::Create(path, direct);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string expected;
  AppendAll(*file, MixedRuns(big, small), expected);
  ASSERT_TRUE(file->Close(/*sync=*/true).ok());
  const std::string got = ReadFile(path);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected) << "the file's bytes differ from what was appended";
}

TEST_P(DataFileWriterTest, BlockSizedAlignedRunsLeaveTheFileUnpadded) {
  const bool direct = GetParam();
  const std::string path = TempPath(absl::StrCat("blocks_", direct, ".bin"));
  AlignedBytes big(size_t{2} << 20, 3);
  absl::StatusOr<DataFileWriter> file = DataFileWriter::Create(path, direct);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string expected;
  AppendAll(*file, {{big.data.get(), size_t{1} << 20}, {big.data.get(), kDirectAlignment}},
            expected);
  ASSERT_TRUE(file->Close(/*sync=*/false).ok());
  EXPECT_EQ(ReadFile(path), expected);
}

TEST_P(DataFileWriterTest, EmptyFile) {
  const std::string path = TempPath(absl::StrCat("empty_", GetParam(), ".bin"));
  absl::StatusOr<DataFileWriter> file = DataFileWriter::Create(path, GetParam());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Close(/*sync=*/true).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

TEST_P(DataFileWriterTest, RefusesUseAfterClose) {
  const std::string path = TempPath(absl::StrCat("closed_", GetParam(), ".bin"));
  absl::StatusOr<DataFileWriter> file = DataFileWriter::Create(path, GetParam());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Close(/*sync=*/false).ok());
  const absl::Status append = file->Append("x", 1);
  EXPECT_EQ(append.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(append.message(), HasSubstr(path));
  EXPECT_EQ(file->Close(false).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(DataFileWriterTest, MissingDirectoryIsNamed) {
  const std::string path = TempPath("no_such_dir/file.bin");
  absl::StatusOr<DataFileWriter> file = DataFileWriter::Create(path, GetParam());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, DataFileWriterTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Buffered"; });

// Where the test's file system takes O_DIRECT (ext4, xfs, tmpfs since Linux
// 6.6), a direct writer stays direct through the mixed runs; elsewhere it
// says so and writes buffered (FileHoldsExactlyTheAppendedBytes covers that).
TEST(DataFileWriterDirectTest, StaysDirectWhereTheFileSystemTakesIt) {
  const std::string path = TempPath("stays_direct.bin");
  absl::StatusOr<DataFileWriter> file = DataFileWriter::Create(path, /*direct=*/true);
  ASSERT_TRUE(file.ok()) << file.status();
  if (!file->direct()) GTEST_SKIP() << "TEST_TMPDIR's file system refuses O_DIRECT at open";
  AlignedBytes big(size_t{8} << 20, 4), small(size_t{1} << 16, 5);
  std::string expected;
  AppendAll(*file, MixedRuns(big, small), expected);
  EXPECT_TRUE(file->direct());
  ASSERT_TRUE(file->Close(/*sync=*/true).ok());
  EXPECT_EQ(ReadFile(path).size(), expected.size());
}

TEST(DataFileWriterDirectTest, BufferedWriterIsNeverDirect) {
  absl::StatusOr<DataFileWriter> file =
      DataFileWriter::Create(TempPath("buffered.bin"), /*direct=*/false);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->direct());
  ASSERT_TRUE(file->Close(false).ok());
}

}  // namespace
}  // namespace ember::distributed::checkpoint
