#include "data/image_folder.h"

#include <csetjmp>
#include <cstdio>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

// A region of a picture, in pixels.
struct Box {
  int64_t x = 0, y = 0, w = 0, h = 0;
};

// What Decode returns: RGB rows of `stride` bytes, the wanted region
// starting `x0` pixels into each row.
struct Decoded {
  std::vector<uint8_t> rgb;
  int64_t stride = 0, x0 = 0, width = 0, height = 0;
};

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
  bool warned = false;
};

void ErrorExit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (corrupt or truncated data) fail the decode too: libjpeg would
// otherwise fill the missing part with gray.
void EmitMessage(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (level < 0 && !e->warned) {
    (*cinfo->err->format_message)(cinfo, e->message);
    e->warned = true;
  }
}

// Decodes the part of `bytes` that `choose` picks from the picture's full
// size, at the smallest DCT scale n/8 that keeps it at least `min_side`
// pixels on each side (0: full size).
absl::StatusOr<Decoded> Decode(std::string_view bytes, std::string_view what,
                               const std::function<Box(int64_t, int64_t)>& choose,
                               int64_t min_side) {
  // Everything libjpeg touches lives on the heap, behind pointers that do
  // not change after setjmp, so a longjmp leaves no local indeterminate.
  struct State {
    jpeg_decompress_struct d;
    ErrorManager err;
    Decoded out;
  };
  const std::unique_ptr<State> s = std::make_unique<State>();
  s->d.err = jpeg_std_error(&s->err.pub);
  s->err.pub.error_exit = ErrorExit;
  s->err.pub.emit_message = EmitMessage;
  if (setjmp(s->err.jump)) {
    jpeg_destroy_decompress(&s->d);
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": not a JPEG libjpeg-turbo can decode: ", s->err.message));
  }
  jpeg_decompress_struct& d = s->d;
  Decoded& out = s->out;
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&d, TRUE);
  d.out_color_space = JCS_RGB;
  const Box box = choose(d.image_width, d.image_height);
  int num = 8;
  for (int n = 1; min_side > 0 && n < 8; ++n) {
    if (box.w * n / 8 >= min_side && box.h * n / 8 >= min_side) {
      num = n;
      break;
    }
  }
  d.scale_num = num;
  d.scale_denom = 8;
  jpeg_start_decompress(&d);
  const int64_t iw = d.image_width, ih = d.image_height;
  const int64_t ow = d.output_width, oh = d.output_height;
  // The box in the decoded scale, rounded outwards.
  const int64_t x0 = box.x * ow / iw, y0 = box.y * oh / ih;
  const int64_t x1 = std::min(ow, ((box.x + box.w) * ow + iw - 1) / iw);
  const int64_t y1 = std::min(oh, ((box.y + box.h) * oh + ih - 1) / ih);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0);
  JDIMENSION cw = static_cast<JDIMENSION>(std::max<int64_t>(1, x1 - x0));
  if (cw < d.output_width) jpeg_crop_scanline(&d, &xoff, &cw);
  out.stride = static_cast<int64_t>(d.output_width) * 3;
  out.x0 = x0 - xoff;
  out.width = std::max<int64_t>(1, x1 - x0);
  out.height = std::max<int64_t>(1, y1 - y0);
  out.rgb.resize(out.stride * out.height);
  if (y0 > 0) jpeg_skip_scanlines(&d, static_cast<JDIMENSION>(y0));
  for (int64_t row = 0; row < out.height;) {
    JSAMPROW p = out.rgb.data() + row * out.stride;
    const JDIMENSION got = jpeg_read_scanlines(&d, &p, 1);
    if (got == 0) {
      std::snprintf(s->err.message, sizeof s->err.message, "no more rows after row %lld",
                    static_cast<long long>(row));
      std::longjmp(s->err.jump, 1);
    }
    row += got;
  }
  if (s->err.warned) std::longjmp(s->err.jump, 1);
  jpeg_abort_decompress(&d);
  jpeg_destroy_decompress(&d);
  return std::move(out);
}

// torchvision's RandomResizedCrop.get_params, on Ember's default generator.
Box CropBox(int64_t width, int64_t height, const ImageFolderOptions& o) {
  Generator& g = default_generator();
  std::lock_guard<std::mutex> lock(g.mutex());
  const double area = static_cast<double>(width) * height;
  const double lr0 = std::log(o.ratio.first), lr1 = std::log(o.ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target =
        area * (o.scale.first + (o.scale.second - o.scale.first) * g.NextDouble());
    const double aspect = std::exp(lr0 + (lr1 - lr0) * g.NextDouble());
    const int64_t w = std::llround(std::sqrt(target * aspect));
    const int64_t h = std::llround(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t y = g.NextInt(0, height - h + 1);
      const int64_t x = g.NextInt(0, width - w + 1);
      return {x, y, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int64_t w = width, h = height;
  if (in_ratio < o.ratio.first) {
    h = std::llround(w / o.ratio.first);
  } else if (in_ratio > o.ratio.second) {
    w = std::llround(h * o.ratio.second);
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

bool Flip(double p) {
  Generator& g = default_generator();
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.NextDouble() < p;
}

// Bilinear resize of `src`'s region to size x size (half-pixel centres),
// mirrored when `flip`, as normalised float32 C x H x W.
Tensor Resample(const Decoded& src, int64_t size, bool flip, const ImageFolderOptions& o) {
  Tensor out = empty({3, size, size});
  float* dst = out.data_ptr<float>();
  const int64_t plane = size * size;
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * o.std[c]);
    shift[c] = -o.mean[c] / o.std[c];
  }
  std::vector<int64_t> xa(size), xb(size);
  std::vector<float> xw(size);
  const double fx = static_cast<double>(src.width) / size;
  for (int64_t x = 0; x < size; ++x) {
    const double sx = std::clamp((x + 0.5) * fx - 0.5, 0.0, static_cast<double>(src.width - 1));
    const int64_t a = static_cast<int64_t>(sx);
    const int64_t at = flip ? size - 1 - x : x;
    xa[at] = (src.x0 + a) * 3;
    xb[at] = (src.x0 + std::min(a + 1, src.width - 1)) * 3;
    xw[at] = static_cast<float>(sx - a);
  }
  const double fy = static_cast<double>(src.height) / size;
  for (int64_t y = 0; y < size; ++y) {
    const double sy = std::clamp((y + 0.5) * fy - 0.5, 0.0, static_cast<double>(src.height - 1));
    const int64_t a = static_cast<int64_t>(sy);
    const float wy = static_cast<float>(sy - a);
    const uint8_t* r0 = src.rgb.data() + a * src.stride;
    const uint8_t* r1 = src.rgb.data() + std::min(a + 1, src.height - 1) * src.stride;
    for (int64_t x = 0; x < size; ++x) {
      const float wx = xw[x];
      for (int c = 0; c < 3; ++c) {
        const float top = r0[xa[x] + c] + wx * (r0[xb[x] + c] - r0[xa[x] + c]);
        const float bottom = r1[xa[x] + c] + wx * (r1[xb[x] + c] - r1[xa[x] + c]);
        dst[c * plane + y * size + x] = (top + wy * (bottom - top)) * scale[c] + shift[c];
      }
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

bool IsJpeg(const std::filesystem::path& p) {
  const std::string ext = absl::AsciiStrToLower(p.extension().string());
  return ext == ".jpg" || ext == ".jpeg";
}

// ImageFolderOptions as a recipe's Value, and back.
Sample OptionsValue(const ImageFolderOptions& o) {
  const Sample::List mean(o.mean.begin(), o.mean.end()), std(o.std.begin(), o.std.end());
  return Sample::Dict{{"size", o.size},
                      {"scale", Sample::List{o.scale.first, o.scale.second}},
                      {"ratio", Sample::List{o.ratio.first, o.ratio.second}},
                      {"flip_p", o.flip_p},
                      {"mean", Sample(mean)},
                      {"std", Sample(std)}};
}

absl::StatusOr<ImageFolderOptions> OptionsOf(const Sample& v) {
  ImageFolderOptions o;
  auto number = [&](const Sample* s) -> std::optional<double> {
    if (s == nullptr) return std::nullopt;
    if (const double* d = s->get_if<double>()) return *d;
    if (const int64_t* i = s->get_if<int64_t>()) return static_cast<double>(*i);
    return std::nullopt;
  };
  const Sample* scale = v.find("scale");
  const Sample* ratio = v.find("ratio");
  const Sample* mean = v.find("mean");
  const Sample* std = v.find("std");
  if (!number(v.find("size")) || !number(v.find("flip_p")) || scale == nullptr ||
      scale->list().size() != 2 || ratio == nullptr || ratio->list().size() != 2 ||
      mean == nullptr || mean->list().size() != 3 || std == nullptr || std->list().size() != 3) {
    return absl::InvalidArgumentError("ImageFolder's recipe: malformed options");
  }
  o.size = static_cast<int64_t>(*number(v.find("size")));
  o.flip_p = *number(v.find("flip_p"));
  o.scale = {*number(&scale->list()[0]), *number(&scale->list()[1])};
  o.ratio = {*number(&ratio->list()[0]), *number(&ratio->list()[1])};
  for (int c = 0; c < 3; ++c) {
    o.mean[c] = static_cast<float>(*number(&mean->list()[c]));
    o.std[c] = static_cast<float>(*number(&std->list()[c]));
  }
  return o;
}

absl::StatusOr<std::shared_ptr<Dataset>> RescanFolder(const Sample& args) {
  const Sample* root = args.find("root");
  const Sample* options = args.find("options");
  if (root == nullptr || !root->is<std::string>() || options == nullptr) {
    return absl::InvalidArgumentError("ImageFolder's recipe: expected root and options");
  }
  absl::StatusOr<ImageFolderOptions> o = OptionsOf(*options);
  if (!o.ok()) return o.status();
  absl::StatusOr<std::shared_ptr<ImageFolder>> f =
      ImageFolder::create(*root->get_if<std::string>(), *o);
  if (!f.ok()) return f.status();
  return std::shared_ptr<Dataset>(*std::move(f));
}
EMBER_REGISTER_DATASET_FACTORY("ember.data.ImageFolder", RescanFolder);

absl::StatusOr<std::shared_ptr<Dataset>> ReopenImageRecords(const Sample& args) {
  const Sample* path = args.find("path");
  const Sample* options = args.find("options");
  if (path == nullptr || !path->is<std::string>() || options == nullptr) {
    return absl::InvalidArgumentError("ImageRecords' recipe: expected path and options");
  }
  absl::StatusOr<ImageFolderOptions> o = OptionsOf(*options);
  if (!o.ok()) return o.status();
  absl::StatusOr<std::shared_ptr<ImageRecords>> r =
      ImageRecords::open(*path->get_if<std::string>(), *o);
  if (!r.ok()) return r.status();
  return std::shared_ptr<Dataset>(*std::move(r));
}
EMBER_REGISTER_DATASET_FACTORY("ember.data.ImageRecords", ReopenImageRecords);

}  // namespace

std::optional<Recipe> ImageFolder::recipe() const {
  return Recipe{"ember.data.ImageFolder",
                Sample::Dict{{"root", root_}, {"options", OptionsValue(options_)}}};
}

std::optional<Recipe> ImageRecords::recipe() const {
  return Recipe{"ember.data.ImageRecords",
                Sample::Dict{{"path", records_->path()}, {"options", OptionsValue(options_)}}};
}

absl::StatusOr<Tensor> decode_jpeg(std::string_view bytes, std::string_view what) {
  absl::StatusOr<Decoded> d = Decode(
      bytes, what,
      [](int64_t w, int64_t h) {
        return Box{0, 0, w, h};
      },
      0);
  if (!d.ok()) return d.status();
  Tensor out = empty({3, d->height, d->width}, kUInt8);
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t plane = d->height * d->width;
  for (int64_t y = 0; y < d->height; ++y) {
    const uint8_t* row = d->rgb.data() + y * d->stride + d->x0 * 3;
    for (int64_t x = 0; x < d->width; ++x) {
      for (int c = 0; c < 3; ++c) dst[c * plane + y * d->width + x] = row[x * 3 + c];
    }
  }
  return out;
}

absl::StatusOr<Tensor> random_resized_crop_jpeg(std::string_view bytes,
                                                const ImageFolderOptions& options,
                                                std::string_view what) {
  absl::StatusOr<Decoded> d = Decode(
      bytes, what, [&](int64_t w, int64_t h) { return CropBox(w, h, options); }, options.size);
  if (!d.ok()) return d.status();
  return Resample(*d, options.size, Flip(options.flip_p), options);
}

absl::StatusOr<std::shared_ptr<ImageFolder>> ImageFolder::create(const std::string& root,
                                                                 ImageFolderOptions options) {
  const ImageFolderOptions& o = options;
  if (o.size < 1 ||
      !(o.scale.first > 0 && o.scale.first <= o.scale.second && o.scale.second <= 1) ||
      !(o.ratio.first > 0 && o.ratio.first <= o.ratio.second) || o.flip_p < 0 || o.flip_p > 1 ||
      o.std[0] == 0 || o.std[1] == 0 || o.std[2] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ImageFolder: options out of range: size ", o.size, " (>= 1), scale (", o.scale.first, ", ",
        o.scale.second, ") (within (0, 1], low <= high), ratio (", o.ratio.first, ", ",
        o.ratio.second, ") (positive, low <= high), flip_p ", o.flip_p, " (in [0, 1]), std (",
        o.std[0], ", ", o.std[1], ", ", o.std[2], ") (non-zero)"));
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat("ImageFolder: ", root, " is not a directory"));
  }
  std::shared_ptr<ImageFolder> folder(new ImageFolder());
  folder->root_ = root;
  folder->options_ = options;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory()) folder->classes_.push_back(e.path().filename().string());
  }
  std::sort(folder->classes_.begin(), folder->classes_.end());
  if (folder->classes_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("ImageFolder: ", root,
                                                   " has no class directories (expected ", root,
                                                   "/<class>/<image>.jpg)"));
  }
  for (size_t label = 0; label < folder->classes_.size(); ++label) {
    const std::string& name = folder->classes_[label];
    folder->class_to_idx_[name] = static_cast<int64_t>(label);
    std::vector<std::string> files;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(
             fs::path(root) / name, fs::directory_options::follow_directory_symlink, ec)) {
      if (e.is_regular_file() && IsJpeg(e.path())) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (std::string& f : files) folder->samples_.emplace_back(std::move(f), label);
  }
  if (folder->samples_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImageFolder: no .jpg or .jpeg file under the class directories of ", root));
  }
  return folder;
}

absl::StatusOr<Sample> ImageFolder::get(int64_t index) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat(
        "ImageFolder: index ", index, " is out of range for a dataset of ", size(), " samples"));
  }
  const auto& [path, label] = samples_[index];
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<Tensor> image = random_resized_crop_jpeg(*bytes, options_, path);
  if (!image.ok()) return image.status();
  return Sample(Sample::List{Sample(*std::move(image)), Sample(label)});
}

absl::StatusOr<std::shared_ptr<ImageRecords>> ImageRecords::open(const std::string& path,
                                                                 ImageFolderOptions options) {
  // The same checks of the options as ImageFolder's, without a folder.
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImageRecords: options out of range: size ", options.size, " (>= 1)"));
  }
  absl::StatusOr<std::shared_ptr<RecordDataset>> records = RecordDataset::open(path);
  if (!records.ok()) return records.status();
  std::shared_ptr<ImageRecords> out(new ImageRecords());
  out->options_ = options;
  out->records_ = *std::move(records);
  return out;
}

int64_t ImageRecords::size() const { return records_->size(); }

absl::StatusOr<Sample> ImageRecords::get(int64_t index) {
  absl::StatusOr<std::string_view> bytes = records_->bytes(index);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<Tensor> image =
      random_resized_crop_jpeg(*bytes, options_, absl::StrCat(records_->path(), " record ", index));
  if (!image.ok()) return image.status();
  return Sample(Sample::List{Sample(*std::move(image)), Sample(records_->label(index))});
}

absl::StatusOr<int64_t> write_image_folder_records(const std::string& root,
                                                   const std::string& out) {
  absl::StatusOr<std::shared_ptr<ImageFolder>> folder = ImageFolder::create(root);
  if (!folder.ok()) return folder.status();
  absl::StatusOr<RecordWriter> writer = RecordWriter::create(out);
  if (!writer.ok()) return writer.status();
  for (const auto& [path, label] : (*folder)->samples()) {
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return bytes.status();
    absl::Status appended = writer->append(*bytes, label);
    if (!appended.ok()) return appended;
  }
  absl::Status closed = writer->close();
  if (!closed.ok()) return closed;
  return (*folder)->size();
}

}  // namespace ember::data
