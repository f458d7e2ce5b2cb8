// JPEG decoding and ImageFolder: pictures encoded here with libjpeg-turbo
// come back as torchvision lays them out, the augmentation maps the crop
// where it should (also when the decoder scales the picture down), and bad
// files are errors naming them.
#include "data/image_folder.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "data/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

using ::ember::data::testing::EncodeJpeg;

std::array<int, 3> Gradient(int x, int y, int w, int h) {
  return {x * 255 / (w - 1), y * 255 / (h - 1), 128};
}

TEST(DecodeJpegTest, GivesUint8ChwRgbCloseToThePicture) {
  const std::string bytes = EncodeJpeg(40, 30, [](int x, int y) { return Gradient(x, y, 40, 30); });
  absl::StatusOr<Tensor> t = decode_jpeg(bytes);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->sizes(), (SizeVector{3, 30, 40}));
  EXPECT_EQ(t->dtype(), kUInt8);
  double error = 0;
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 30; ++y) {
      for (int x = 0; x < 40; ++x) {
        const int want = Gradient(x, y, 40, 30)[c];
        error += std::abs(want - (*t)[c][y][x].item<int64_t>());
      }
    }
  }
  EXPECT_LT(error / (3 * 30 * 40), 3.0);
}

TEST(DecodeJpegTest, GrayscaleBecomesThreeEqualChannels) {
  const std::string bytes = EncodeJpeg(
      16, 16,
      [](int x, int) {
        return std::array<int, 3>{x * 16, 0, 0};
      },
      true);
  absl::StatusOr<Tensor> t = decode_jpeg(bytes);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(0), 3);
  EXPECT_TRUE((*t)[0].equal((*t)[1]));
  EXPECT_TRUE((*t)[1].equal((*t)[2]));
}

TEST(DecodeJpegTest, BadAndTruncatedBytesNameTheFile) {
  absl::StatusOr<Tensor> bad = decode_jpeg("not a jpeg at all", "cat.jpg");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("cat.jpg: not a JPEG libjpeg-turbo can decode: "));
  const std::string whole = EncodeJpeg(64, 64, [](int x, int y) { return Gradient(x, y, 64, 64); });
  absl::StatusOr<Tensor> cut = decode_jpeg(whole.substr(0, whole.size() / 2), "dog.jpg");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("dog.jpg: "));
}

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

fs::path Fresh(const std::string& name) {
  fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(ImageFolderTest, FindsClassesAndImagesAsTorchvisionDoes) {
  const fs::path root = Fresh("scan");
  const std::string jpg = EncodeJpeg(8, 8, [](int, int) { return std::array<int, 3>{1, 2, 3}; });
  Write(root / "zebra" / "2.jpg", jpg);
  Write(root / "zebra" / "1.JPEG", jpg);
  Write(root / "ant" / "sub" / "b.jpeg", jpg);
  Write(root / "ant" / "a.jpg", jpg);
  Write(root / "ant" / "notes.txt", "text");
  Write(root / "ant" / "c.png", "png");
  Write(root / "readme.jpg", jpg);  // not in a class directory
  absl::StatusOr<std::shared_ptr<ImageFolder>> f = ImageFolder::create(root.string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->classes(), (std::vector<std::string>{"ant", "zebra"}));
  EXPECT_EQ((*f)->class_to_idx().at("zebra"), 1);
  ASSERT_EQ((*f)->size(), 4);
  std::vector<std::pair<std::string, int64_t>> expect = {
      {(root / "ant" / "a.jpg").string(), 0},
      {(root / "ant" / "sub" / "b.jpeg").string(), 0},
      {(root / "zebra" / "1.JPEG").string(), 1},
      {(root / "zebra" / "2.jpg").string(), 1}};
  EXPECT_EQ((*f)->samples(), expect);

  EXPECT_EQ(ImageFolder::create((root / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
  const fs::path empty = Fresh("empty");
  fs::create_directories(empty / "cls");
  EXPECT_THAT(std::string(ImageFolder::create(empty.string()).status().message()),
              HasSubstr("no .jpg or .jpeg file"));
  EXPECT_THAT(std::string(ImageFolder::create(root.string(), {.size = 0}).status().message()),
              HasSubstr("size 0 (>= 1)"));
}

// The whole picture (scale 1, its own aspect ratio) at its own size: the
// output is the decoded picture normalised, mirrored with flip_p = 1.
TEST(ImageFolderTest, AWholeCropIsTheNormalisedPictureAndFlipMirrorsIt) {
  const std::string bytes = EncodeJpeg(32, 32, [](int x, int y) { return Gradient(x, y, 32, 32); });
  absl::StatusOr<Tensor> decoded = decode_jpeg(bytes);
  ASSERT_TRUE(decoded.ok());
  ImageFolderOptions o{.size = 32, .scale = {1, 1}, .ratio = {1, 1}, .flip_p = 0};
  absl::StatusOr<Tensor> plain = random_resized_crop_jpeg(bytes, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  o.flip_p = 1;
  absl::StatusOr<Tensor> flipped = random_resized_crop_jpeg(bytes, o);
  ASSERT_TRUE(flipped.ok());
  ASSERT_EQ(plain->sizes(), (SizeVector{3, 32, 32}));
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        const double want = ((*decoded)[c][y][x].item<double>() / 255.0 - o.mean[c]) / o.std[c];
        ASSERT_NEAR((*plain)[c][y][x].item<double>(), want, 1e-4) << c << " " << y << " " << x;
        ASSERT_NEAR((*flipped)[c][y][31 - x].item<double>(), want, 1e-4);
      }
    }
  }
}

// A 1600 x 1200 picture decoded at 1/4 scale for a 224 output: each output
// pixel still shows the picture where it maps to.
TEST(ImageFolderTest, ADownscaledDecodeMapsTheCropWhereItBelongs) {
  const int w = 1600, h = 1200;
  const std::string bytes = EncodeJpeg(w, h, [](int x, int y) { return Gradient(x, y, w, h); });
  ImageFolderOptions o{.size = 224, .scale = {1, 1}, .ratio = {4.0 / 3, 4.0 / 3}, .flip_p = 0};
  absl::StatusOr<Tensor> out = random_resized_crop_jpeg(bytes, o);
  ASSERT_TRUE(out.ok()) << out.status();
  double worst = 0;
  for (int y = 0; y < 224; y += 7) {
    for (int x = 0; x < 224; x += 7) {
      const double red = ((x + 0.5) / 224) * 255, green = ((y + 0.5) / 224) * 255;
      const double got_r = (*out)[0][y][x].item<double>() * o.std[0] + o.mean[0];
      const double got_g = (*out)[1][y][x].item<double>() * o.std[1] + o.mean[1];
      worst = std::max({worst, std::abs(got_r * 255 - red), std::abs(got_g * 255 - green)});
    }
  }
  EXPECT_LT(worst, 4.0);
}

TEST(ImageFolderTest, ADataLoaderBatchesAugmentedImagesFromWorkers) {
  const fs::path root = Fresh("loader");
  for (int i = 0; i < 10; ++i) {
    Write(root / (i % 2 ? "odd" : "even") / (std::to_string(i) + ".jpg"),
          EncodeJpeg(120 + i, 90, [&](int x, int y) { return Gradient(x, y, 120 + i, 90); }));
  }
  Write(root / "odd" / "broken.jpg", "not a jpeg");
  absl::StatusOr<std::shared_ptr<ImageFolder>> f = ImageFolder::create(root.string(), {.size = 64});
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<DataLoader> loader = DataLoader::create(*f, {.batch_size = 4, .num_workers = 2});
  ASSERT_TRUE(loader.ok());
  absl::StatusOr<DataLoaderIterator> it = loader->iter();
  int images = 0;
  std::vector<std::string> errors;
  while (true) {
    absl::StatusOr<std::optional<Sample>> b = it->next();
    if (!b.ok()) {
      errors.push_back(std::string(b.status().message()));
      continue;
    }
    if (!b->has_value()) break;
    const Tensor x = *(*b)->list()[0].get_if<Tensor>();
    EXPECT_EQ(x.size(1), 3);
    EXPECT_EQ(x.size(2), 64);
    images += static_cast<int>(x.size(0));
  }
  // 5 even, then 6 odd files in sorted order: odd/broken.jpg sorts after
  // the digits, sample 10, in the last batch (of 3), which fails; the
  // other two batches come.
  EXPECT_EQ(images, 11 - 3);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr("odd/broken.jpg: not a JPEG"));
}

}  // namespace
}  // namespace ember::data
