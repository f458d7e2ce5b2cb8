// Record files: what is written comes back, byte for byte, as views of the
// mapping; damaged and foreign files are errors naming them; make_records
// packs an image folder that ImageRecords then serves through workers.
#include "data/record_file.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "data/dataloader.h"
#include "data/image_folder.h"
#include "data/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::data {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Tmp(const std::string& name) {
  return (fs::path(std::getenv("TEST_TMPDIR")) / name).string();
}

std::string Bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.numel());
}

TEST(RecordFileTest, RecordsComeBackWithTheirLabels) {
  const std::string path = Tmp("a.records");
  std::vector<std::string> records = {"alpha", "", std::string(100000, 'x'), "omega"};
  {
    absl::StatusOr<RecordWriter> w = RecordWriter::create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    for (size_t i = 0; i < records.size(); ++i) {
      ASSERT_TRUE(w->append(records[i], static_cast<int64_t>(10 * i)).ok());
    }
    EXPECT_FALSE(fs::exists(path)) << "visible before close()";
    ASSERT_TRUE(w->close().ok());
    EXPECT_EQ(w->append("late").code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_FALSE(fs::exists(path + ".partial"));
  absl::StatusOr<std::shared_ptr<RecordDataset>> ds = RecordDataset::open(path);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 4);
  for (int64_t i = 0; i < 4; ++i) {
    absl::StatusOr<Sample> s = (*ds)->get(i);
    ASSERT_TRUE(s.ok()) << s.status();
    const Tensor t = *s->list()[0].get_if<Tensor>();
    EXPECT_EQ(t.dtype(), kUInt8);
    EXPECT_EQ(Bytes(t), records[i]) << i;
    EXPECT_EQ(*s->list()[1].get_if<int64_t>(), 10 * i);
  }
  // A record outlives its dataset: the view keeps the mapping.
  Tensor last = *(*(*ds)->get(3)).list()[0].get_if<Tensor>();
  ds->reset();
  EXPECT_EQ(Bytes(last), "omega");
}

TEST(RecordFileTest, AnUnclosedWriterLeavesNothing) {
  const std::string path = Tmp("unclosed.records");
  {
    absl::StatusOr<RecordWriter> w = RecordWriter::create(path);
    ASSERT_TRUE(w->append("x").ok());
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST(RecordFileTest, ForeignAndDamagedFilesAreNamed) {
  EXPECT_EQ(RecordDataset::open(Tmp("missing.records")).status().code(),
            absl::StatusCode::kNotFound);
  const std::string foreign = Tmp("foreign.records");
  std::ofstream(foreign) << "this is not a record file, just some text in a file";
  absl::Status s = RecordDataset::open(foreign).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(foreign + " is not an Ember record file"));

  const std::string path = Tmp("damaged.records");
  {
    absl::StatusOr<RecordWriter> w = RecordWriter::create(path);
    ASSERT_TRUE(w->append("0123456789").ok());
    ASSERT_TRUE(w->close().ok());
  }
  // The record's length in the index (bytes 8 + 10 + 8 onwards) made huge.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8 + 10 + 8);
  const char big[8] = {0, 0, 0, 0, 1, 0, 0, 0};
  f.write(big, 8);
  f.close();
  s = RecordDataset::open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("record 0"));
}

std::string Jpeg(int w, int h, int shade) {
  return testing::EncodeJpeg(w, h, [&](int, int) {
    return std::array<int, 3>{shade, shade, shade};
  });
}

TEST(RecordFileTest, MakeRecordsPacksAnImageFolderThatImageRecordsServes) {
  const fs::path root = Tmp("folder");
  fs::remove_all(root);
  for (int i = 0; i < 6; ++i) {
    const fs::path file = root / (i < 2 ? "a" : "b") / absl::StrCat(i, ".jpg");
    fs::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << Jpeg(80, 60, 40 * i);
  }
  const std::string out = Tmp("folder.records");
  const std::string tool = "data/make_records";
  ASSERT_EQ(std::system(absl::StrCat(tool, " --root=", root.string(), " --out=", out).c_str()), 0);
  EXPECT_NE(
      std::system(
          absl::StrCat(tool, " --root=", Tmp("nowhere"), " --out=", out, " 2>/dev/null").c_str()),
      0);

  absl::StatusOr<std::shared_ptr<ImageRecords>> images =
      ImageRecords::open(out, {.size = 32, .flip_p = 0});
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ((*images)->size(), 6);
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(*images, {.batch_size = 3, .num_workers = 2});
  ASSERT_TRUE(loader.ok());
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  std::vector<int64_t> labels;
  std::vector<double> shades;
  while (true) {
    absl::StatusOr<std::optional<Sample>> b = it->next();
    ASSERT_TRUE(b.ok()) << b.status();
    if (!b->has_value()) break;
    const Tensor x = *(*b)->list()[0].get_if<Tensor>();
    const Tensor y = *(*b)->list()[1].get_if<Tensor>();
    ASSERT_EQ(x.sizes(), (SizeVector{3, 3, 32, 32}));
    for (int64_t k = 0; k < 3; ++k) {
      labels.push_back(y.data_ptr<int64_t>()[k]);
      // A flat picture stays flat: its red channel de-normalised.
      shades.push_back((x[k][0][5][5].item<double>() * 0.229 + 0.485) * 255);
    }
  }
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 0, 1, 1, 1, 1}));
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(shades[i], 40 * i, 2.0) << i;
}

}  // namespace
}  // namespace ember::data
