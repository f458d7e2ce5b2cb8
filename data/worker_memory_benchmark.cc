// What a DataLoader worker costs in memory beside its dataset
// (testdata/torch_worker_memory.py prints the same table for PyTorch 2.x): a
// TensorDataset of one --gib GiB float32 tensor (rows of 16,384 values, 64
// KiB each), persistent workers that go through one whole epoch in batches
// of 64, then each worker's memory from /proc/<pid>/smaps_rollup: its
// resident set and its private part (pages no other process shares; the
// dataset's pages stay shared with the loop's process, copy-on-write, so
// they are not in it). The figure the issue sets: private growth at most 5%
// of the dataset's size.
//
//   bazel run -c opt //data:worker_memory_benchmark -- [--gib=2] [--workers=1,2,4]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/benchmark_flags.h"
#include "data/dataloader.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

constexpr int64_t kRow = 16384;

// Sample i: [row i, the pid of the process that got it].
class Rows : public Dataset {
 public:
  explicit Rows(Tensor rows) : rows_(std::move(rows)) {}
  int64_t size() const override { return rows_.size(0); }
  absl::StatusOr<Sample> get(int64_t index) override {
    return Sample(
        Sample::List{Sample(rows_.select(0, index)), Sample(static_cast<int64_t>(::getpid()))});
  }

 private:
  Tensor rows_;
};

// kB figures of /proc/<pid>/smaps_rollup.
std::map<std::string, double> Memory(int64_t pid) {
  std::map<std::string, double> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    double kb = 0;
    if (words >> key >> kb) out[key.substr(0, key.size() - 1)] = kb;
  }
  return out;
}

int Main(int argc, char** argv) {
  double gib = 2;
  std::vector<int> workers = {1, 2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--gib=", 0) == 0) {
      gib = std::atof(argv[i] + 6);
    } else if (arg.rfind("--workers=", 0) == 0) {
      workers = IntList(arg.substr(10));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const int64_t rows = static_cast<int64_t>(gib * (1 << 30) / (kRow * 4));
  Tensor data = empty({rows, kRow});
  data.fill_(1.0);  // resident in the loop's process
  const double dataset_mb = rows * kRow * 4 / 1e6;
  std::printf("dataset: %lld rows of %lld float32, %.0f MB\n", static_cast<long long>(rows),
              static_cast<long long>(kRow), dataset_mb);
  auto ds = std::make_shared<Rows>(data);
  for (int w : workers) {
    absl::StatusOr<DataLoader> loader = DataLoader::create(
        ds, {.batch_size = 64, .shuffle = true, .num_workers = w, .persistent_workers = true});
    if (!loader.ok()) return 1;
    std::set<int64_t> pids;
    {
      absl::StatusOr<DataLoaderIterator> it = loader->iter();
      if (!it.ok()) return 1;
      while (true) {
        absl::StatusOr<std::optional<Sample>> b = it->next();
        if (!b.ok()) {
          std::fprintf(stderr, "%s\n", std::string(b.status().message()).c_str());
          return 1;
        }
        if (!b->has_value()) break;
        const Tensor pid = *(*b)->list()[1].get_if<Tensor>();
        pids.insert(pid.data_ptr<int64_t>()[0]);
      }
    }
    double rss = 0, priv = 0;
    for (int64_t pid : pids) {
      std::map<std::string, double> m = Memory(pid);
      rss += m["Rss"] / 1e3;
      priv += (m["Private_Clean"] + m["Private_Dirty"]) / 1e3;
    }
    const double n = static_cast<double>(pids.size());
    std::printf(
        "workers %d: per worker resident %.1f MB, private %.1f MB (%.2f%% of the dataset)\n", w,
        rss / n, priv / n, 100 * priv / n / dataset_mb);
  }
  return 0;
}

}  // namespace
}  // namespace ember::data

int main(int argc, char** argv) { return ember::data::Main(argc, argv); }
