// Datasets (torch.utils.data): map-style datasets, iterable datasets and the
// worker information that lets a stream split itself between workers, with
// TensorDataset, Subset, ConcatDataset and random_split.
//
//   ```cpp
//   #include "tensor/status_macros.h"
//   #include "data/dataset.h"
//   #include "tensor/factories.h"
//   namespace data = ember::data;
//   auto ds = std::make_shared<data::TensorDataset>(
//       std::vector<ember::Tensor>{ember::randn({100, 3}), ember::arange(100)});
//   EMBER_ASSIGN_OR_RETURN(data::Sample s, ds->get(7));  // [x[7], y[7]]
//   ember::Generator g(42);
//   EMBER_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<data::Subset>> parts,
//                          data::random_split(ds, {0.8, 0.2}, g));  // 80 and 20 samples
//   ```
//
// A sample is a multiprocessing Value (None, numbers, strings, tensors,
// nested lists and string-keyed dicts), the C++ counterpart of the Python
// objects a torch dataset returns; tuples are lists. get() reports failure
// as a Status (an ember::Error thrown by it is caught where it runs, in the
// loop or in a worker, and reported the same way).
//
// In a DataLoader worker process each worker holds its own copy of the
// dataset (the fork's); get_worker_info() says which worker the calling
// process is, so an IterableDataset can give each worker its share of a
// stream. Datasets are thread-compatible: the loader calls one from one
// thread at a time.
#ifndef EMBER_DATA_DATASET_H_
#define EMBER_DATA_DATASET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "multiprocessing/value.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::data {

using Sample = multiprocessing::Value;

// How to build a dataset again in a fresh process (a DataLoader worker
// started with the spawn or forkserver method), as pickling is for torch's:
// the name of a registered factory and the Value it takes (tensors travel
// in shared memory).
struct Recipe {
  std::string factory;
  Sample args;
};

// A map-style dataset (torch.utils.data.Dataset): size() samples, each got
// by its index.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // __len__.
  virtual int64_t size() const = 0;
  // __getitem__ for 0 <= index < size(); OutOfRange (naming the index and
  // the size) otherwise, by convention.
  virtual absl::StatusOr<Sample> get(int64_t index) = 0;
  // The recipe that rebuilds this dataset elsewhere, or nullopt (the
  // default) when it has none: then its workers can only be forked.
  virtual std::optional<Recipe> recipe() const { return std::nullopt; }
};

// What a recipe names: builds the dataset from its args.
using DatasetFactory = absl::StatusOr<std::shared_ptr<Dataset>> (*)(const Sample& args);
// Registers `factory` under `name` (at start-up, e.g. through the macro
// below, so that a spawned worker, which runs the same binary, has it).
void register_dataset_factory(const std::string& name, DatasetFactory factory);
#define EMBER_REGISTER_DATASET_FACTORY(name, fn)       \
  static const bool ember_dataset_factory_##fn = [] {  \
    ::ember::data::register_dataset_factory(name, fn); \
    return true;                                       \
  }()
// Builds a dataset from its recipe: NotFound naming the factory when none is
// registered under its name, else the factory's own errors.
absl::StatusOr<std::shared_ptr<Dataset>> rebuild_dataset(const Recipe& recipe);

// The next sample of a stream, or nullopt at its end.
using SampleStream = std::function<absl::StatusOr<std::optional<Sample>>()>;

// An iterable dataset (torch.utils.data.IterableDataset): a stream of
// samples, started afresh by each iter() (each epoch). With workers, every
// worker runs its own copy's iter(): without get_worker_info() to split the
// stream, every worker yields all of it (as in torch).
class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  virtual SampleStream iter() = 0;
  // The number of samples when known (torch's optional __len__).
  virtual std::optional<int64_t> size() const { return std::nullopt; }
};

// What a DataLoader worker knows of itself (torch.utils.data.get_worker_info).
struct WorkerInfo {
  int id = 0;
  int num_workers = 0;
  // The worker's seed: the loader's base seed + id; Ember's default
  // generators (manual_seed) were seeded with it when the worker started.
  uint64_t seed = 0;
  // The worker's copy of the loader's dataset (one of the two is set).
  Dataset* dataset = nullptr;
  IterableDataset* iterable_dataset = nullptr;
};

// The calling process's worker information, or null outside a worker (in
// the loop's process).
const WorkerInfo* get_worker_info();

namespace internal {
// Called once by a worker as it starts (data/dataloader.cc).
void set_worker_info(const WorkerInfo& info);
}  // namespace internal

// Samples of equal-length tensors, sample i being [t[i] for t in tensors]
// (torch.utils.data.TensorDataset).
class TensorDataset : public Dataset {
 public:
  // Throws ember::Error when `tensors` is empty or their first dimensions
  // differ (naming both sizes).
  explicit TensorDataset(std::vector<Tensor> tensors);
  int64_t size() const override { return size_; }
  absl::StatusOr<Sample> get(int64_t index) override;
  std::optional<Recipe> recipe() const override;
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<Tensor> tensors_;
  int64_t size_ = 0;
};

// The samples of `dataset` at `indices`, in that order (torch's Subset).
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<Dataset> dataset, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  absl::StatusOr<Sample> get(int64_t index) override;
  // The inner dataset's recipe and the indices (nullopt without the former).
  std::optional<Recipe> recipe() const override;
  const std::vector<int64_t>& indices() const { return indices_; }
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  std::vector<int64_t> indices_;
};

// Datasets one after another (torch's ConcatDataset); a negative index
// counts from the end, as in torch.
class ConcatDataset : public Dataset {
 public:
  // Throws ember::Error for an empty list or a null dataset.
  explicit ConcatDataset(std::vector<std::shared_ptr<Dataset>> datasets);
  int64_t size() const override { return cumulative_.empty() ? 0 : cumulative_.back(); }
  absl::StatusOr<Sample> get(int64_t index) override;
  // torch's cumulative_sizes.
  const std::vector<int64_t>& cumulative_sizes() const { return cumulative_; }

 private:
  std::vector<std::shared_ptr<Dataset>> datasets_;
  std::vector<int64_t> cumulative_;
};

// torch.utils.data.random_split: non-overlapping subsets of `lengths`, read
// as torch reads them: fractions of size() when they sum to 1 (each part
// gets floor(fraction * size), the remainder one each from the first part
// on), else whole lengths summing to size(). The parts come from
// randperm(size) drawn on `generator`, so torch's call with a generator of
// the same seed gives the same parts. InvalidArgument naming the offending
// value when the lengths do not sum to size(), a length is not a whole
// number or a fraction is outside [0, 1].
absl::StatusOr<std::vector<std::shared_ptr<Subset>>> random_split(
    std::shared_ptr<Dataset> dataset, const std::vector<double>& lengths,
    Generator& generator = default_generator());

}  // namespace ember::data

#endif  // EMBER_DATA_DATASET_H_
