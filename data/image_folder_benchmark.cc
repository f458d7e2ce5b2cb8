// The image-folder pipeline (decode, RandomResizedCrop(224), flip,
// normalise) through a DataLoader, as torchvision's is measured
// (testdata/torch_image_folder_bench.py makes the images both read and
// prints PyTorch's side): batches of 64, shuffled, num_workers 0, 1, 2, ...;
// images per second over an epoch after its first batch, best of
// --repeats.
//
//   python3 data/testdata/torch_image_folder_bench.py --root /tmp/images --make
//   bazel run -c opt //data:image_folder_benchmark -- --root=/tmp/images [--workers=0,1,2]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "data/benchmark_flags.h"
#include "data/dataloader.h"
#include "data/image_folder.h"

namespace ember::data {
namespace {

int Main(int argc, char** argv) {
  std::string root;
  std::vector<int> workers = {0, 1, 2};
  int repeats = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--root=", 0) == 0) {
      root = arg.substr(7);
    } else if (arg.rfind("--repeats=", 0) == 0) {
      repeats = std::atoi(argv[i] + 10);
    } else if (arg.rfind("--workers=", 0) == 0) {
      workers = IntList(arg.substr(10));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  absl::StatusOr<std::shared_ptr<ImageFolder>> images = ImageFolder::create(root);
  if (!images.ok()) {
    std::fprintf(stderr, "%s\n", std::string(images.status().message()).c_str());
    return 1;
  }
  std::printf("%lld images, batches of 64\n", static_cast<long long>((*images)->size()));
  for (int w : workers) {
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
      absl::StatusOr<DataLoader> loader =
          DataLoader::create(*images, {.batch_size = 64, .shuffle = true, .num_workers = w});
      if (!loader.ok()) return 1;
      absl::StatusOr<DataLoaderIterator> it = loader->iter();
      if (!it.ok()) return 1;
      absl::StatusOr<std::optional<Sample>> first = it->next();
      if (!first.ok() || !first->has_value() ||
          (*first)->list()[0].get_if<Tensor>()->sizes() != SizeVector{64, 3, 224, 224}) {
        std::fprintf(stderr, "the first batch is not 64 x 3 x 224 x 224\n");
        return 1;
      }
      int64_t n = 0;
      const absl::Time start = absl::Now();
      while (true) {
        absl::StatusOr<std::optional<Sample>> b = it->next();
        if (!b.ok()) {
          std::fprintf(stderr, "%s\n", std::string(b.status().message()).c_str());
          return 1;
        }
        if (!b->has_value()) break;
        n += (*b)->list()[0].get_if<Tensor>()->size(0);
      }
      best = std::max(best, n / absl::ToDoubleSeconds(absl::Now() - start));
    }
    std::printf("workers %d: %.1f images/s\n", w, best);
  }
  return 0;
}

}  // namespace
}  // namespace ember::data

int main(int argc, char** argv) { return ember::data::Main(argc, argv); }
