// The DataLoader's own cost, as torch's is measured (testdata/
// torch_loader_bench.py prints the same table for PyTorch 2.x): a dataset
// whose get() returns a ready 3x224x224 float32 tensor, batches of 64,
// default_collate, num_workers 0, 1, 2, ...; batches per second over
// --batches batches after one warm-up epoch of a few batches, the workers
// started afresh for each count (not persistent), best of --repeats; the first
// batch is checked against the image.
//
//   bazel run -c opt //data:dataloader_benchmark --
//       [--workers=0,1,2] [--batches=200] [--batch=64] [--repeats=3]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "data/benchmark_flags.h"
#include "data/dataloader.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

class Ready : public Dataset {
 public:
  explicit Ready(int64_t n) : n_(n), image_(randn({3, 224, 224})) {}
  int64_t size() const override { return n_; }
  absl::StatusOr<Sample> get(int64_t) override { return Sample(image_); }
  const Tensor& image() const { return image_; }

 private:
  int64_t n_;
  Tensor image_;
};

int Main(int argc, char** argv) {
  std::vector<int> workers = {0, 1, 2};
  int batches = 200, batch = 64, repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string prefix = std::string(flag) + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--workers")) {
      workers = IntList(v);
    } else if (const char* v = value("--batches")) {
      batches = std::atoi(v);
    } else if (const char* v = value("--batch")) {
      batch = std::atoi(v);
    } else if (const char* v = value("--repeats")) {
      repeats = std::atoi(v);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  auto ds = std::make_shared<Ready>(static_cast<int64_t>(batches) * batch);
  std::printf("batch %d of 3x224x224 float32, %d batches\n", batch, batches);
  for (int w : workers) {
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
      absl::StatusOr<DataLoader> loader =
          DataLoader::create(ds, {.batch_size = batch, .num_workers = w});
      if (!loader.ok()) {
        std::fprintf(stderr, "%s\n", std::string(loader.status().message()).c_str());
        return 1;
      }
      absl::StatusOr<DataLoaderIterator> it = loader->iter();
      if (!it.ok()) return 1;
      // The first batches start the workers; time the rest. The first is
      // checked: batch x 3 x 224 x 224, its last sample the image.
      absl::StatusOr<std::optional<Sample>> first = it->next();
      if (!first.ok() || !first->has_value()) return 1;
      const Tensor* x = (*first)->get_if<Tensor>();
      if (x == nullptr || x->sizes() != SizeVector{batch, 3, 224, 224} ||
          !x->select(0, batch - 1).equal(ds->image())) {
        std::fprintf(stderr, "the first batch is not %d copies of the image\n", batch);
        return 1;
      }
      for (int k = 1; k < 2 * std::max(w, 1); ++k) {
        if (!it->next().ok()) return 1;
      }
      const int timed = batches - 2 * std::max(w, 1);
      const absl::Time start = absl::Now();
      for (int k = 0; k < timed; ++k) {
        absl::StatusOr<std::optional<Sample>> b = it->next();
        if (!b.ok() || !b->has_value()) {
          std::fprintf(stderr, "batch %d: %s\n", k, std::string(b.status().message()).c_str());
          return 1;
        }
      }
      best = std::max(best, timed / absl::ToDoubleSeconds(absl::Now() - start));
    }
    std::printf("workers %d: %.1f batches/s\n", w, best);
  }
  return 0;
}

}  // namespace
}  // namespace ember::data

int main(int argc, char** argv) { return ember::data::Main(argc, argv); }
