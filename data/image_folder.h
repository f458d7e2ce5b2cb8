// Images: JPEG decoding (libjpeg-turbo) and an image-folder dataset with the
// usual training augmentations (torchvision's ImageFolder with
// RandomResizedCrop, RandomHorizontalFlip, ToTensor and Normalize), run
// where get() runs: in the DataLoader's workers.
//
//   ```cpp compile-only
//   #include "data/dataloader.h"
//   #include "data/image_folder.h"
//   #include "tensor/status_macros.h"
//   namespace data = ember::data;
//   // train/<class>/<image>.jpg, as torchvision's ImageFolder reads it.
//   EMBER_ASSIGN_OR_RETURN(auto images, data::ImageFolder::create("train"));
//   EMBER_ASSIGN_OR_RETURN(data::DataLoader loader,
//                          data::DataLoader::create(images, {.batch_size = 64, .shuffle = true,
//                                                            .num_workers = 2}));
//   // each batch: [64 x 3 x 224 x 224 float32, 64 int64 labels]
//   ```
//
// ImageFolder finds its classes and images as torchvision's does: the
// class names are root's subdirectories in sorted order (label i is the
// i-th), the images every .jpg / .jpeg file (any case) under each, in sorted
// order. A sample is [image, label]: the image decoded, cropped to a random
// area of scale (0.08, 1) of the picture and aspect ratio (3/4, 4/3) (ten
// tries, then the central crop; torchvision's RandomResizedCrop), resized
// to size x size (bilinear), flipped left to right with probability
// flip_p, as float32 C x H x W in [0, 1] normalised by mean and std. The
// random draws come from Ember's default generator, which each DataLoader
// worker seeds with its own seed. Decoding reads only what the crop needs:
// libjpeg-turbo scales the picture down in the DCT (by 1/8 to 8/8, keeping
// the crop at least size pixels on each side) and skips the rows and
// columns outside the crop.
//
// Failures are Statuses naming the file: NotFound, and InvalidArgument for
// bytes that are not a baseline or progressive JPEG (libjpeg's message).
#ifndef EMBER_DATA_IMAGE_FOLDER_H_
#define EMBER_DATA_IMAGE_FOLDER_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "data/dataset.h"
#include "data/record_file.h"
#include "tensor/tensor.h"

namespace ember::data {

// torchvision.io.decode_jpeg: the picture as a uint8 3 x H x W RGB tensor
// (grayscale pictures are expanded to RGB). `what` names the bytes in
// errors (a file name).
absl::StatusOr<Tensor> decode_jpeg(std::string_view bytes, std::string_view what = "the JPEG");

struct ImageFolderOptions {
  // The side of the square output (RandomResizedCrop's size).
  int64_t size = 224;
  // RandomResizedCrop's scale and ratio ranges.
  std::pair<double, double> scale = {0.08, 1.0};
  std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0};
  // RandomHorizontalFlip's probability.
  double flip_p = 0.5;
  // Normalize's per-channel mean and std (ImageNet's, as torchvision's
  // examples use).
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
};

class ImageFolder : public Dataset {
 public:
  // Scans `root`. NotFound when it is not a directory, InvalidArgument
  // naming it when it has no class directory or no image, and for options
  // out of range (size < 1, a scale or ratio range that is empty or
  // outside (0, 1] / (0, inf), flip_p outside [0, 1], a std of 0).
  static absl::StatusOr<std::shared_ptr<ImageFolder>> create(const std::string& root,
                                                             ImageFolderOptions options = {});
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  // [image, label]; errors name the file.
  absl::StatusOr<Sample> get(int64_t index) override;
  // Scans the same root with the same options.
  std::optional<Recipe> recipe() const override;

  // torchvision's classes, class_to_idx and samples (path, label).
  const std::vector<std::string>& classes() const { return classes_; }
  const std::map<std::string, int64_t>& class_to_idx() const { return class_to_idx_; }
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }

 private:
  ImageFolder() = default;
  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<std::pair<std::string, int64_t>> samples_;
};

// An ImageFolder packed in a record file (record_file.h; the tool
// //data:make_records writes one): sample i is record i's picture with
// ImageFolder's augmentation, and its label. Decoding reads the mapped
// bytes in place.
class ImageRecords : public Dataset {
 public:
  static absl::StatusOr<std::shared_ptr<ImageRecords>> open(const std::string& path,
                                                            ImageFolderOptions options = {});
  int64_t size() const override;
  absl::StatusOr<Sample> get(int64_t index) override;
  std::optional<Recipe> recipe() const override;

 private:
  ImageRecords() = default;
  ImageFolderOptions options_;
  std::shared_ptr<RecordDataset> records_;
};

// Writes every image of the ImageFolder under `root` (each file's bytes as
// they are, labelled with its class index, in the folder's order) to the
// record file `out`; returns how many. The errors of ImageFolder::create,
// of reading a file and of RecordWriter.
absl::StatusOr<int64_t> write_image_folder_records(const std::string& root, const std::string& out);

// The augmentation of one picture (what ImageFolder::get applies after
// reading the file), for pictures from elsewhere.
absl::StatusOr<Tensor> random_resized_crop_jpeg(std::string_view bytes,
                                                const ImageFolderOptions& options,
                                                std::string_view what = "the JPEG");

}  // namespace ember::data

#endif  // EMBER_DATA_IMAGE_FOLDER_H_
