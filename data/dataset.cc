#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace ember::data {
namespace {

std::optional<WorkerInfo>& CurrentWorker() {
  static std::optional<WorkerInfo> info;
  return info;
}

absl::Status OutOfRange(const char* what, int64_t index, int64_t size) {
  return absl::OutOfRangeError(absl::StrCat(
      what, ": index ", index, " is out of range for a dataset of ", size, " samples"));
}

std::map<std::string, DatasetFactory>& Factories() {
  static auto* factories = new std::map<std::string, DatasetFactory>();
  return *factories;
}

std::mutex& FactoriesMu() {
  static auto* mu = new std::mutex();
  return *mu;
}

}  // namespace

void register_dataset_factory(const std::string& name, DatasetFactory factory) {
  std::lock_guard<std::mutex> lock(FactoriesMu());
  Factories()[name] = factory;
}

absl::StatusOr<std::shared_ptr<Dataset>> rebuild_dataset(const Recipe& recipe) {
  DatasetFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(FactoriesMu());
    auto it = Factories().find(recipe.factory);
    if (it != Factories().end()) factory = it->second;
  }
  if (factory == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no dataset factory is registered as '", recipe.factory,
                     "' in this binary; register it with EMBER_REGISTER_DATASET_FACTORY"));
  }
  return factory(recipe.args);
}

namespace {

absl::StatusOr<std::shared_ptr<Dataset>> MakeTensorDataset(const Sample& args) {
  std::vector<Tensor> tensors;
  for (const Sample& t : args.list()) {
    absl::StatusOr<Tensor> tensor = t.as<Tensor>();
    if (!tensor.ok()) return tensor.status();
    tensors.push_back(*tensor);
  }
  try {
    return std::shared_ptr<Dataset>(std::make_shared<TensorDataset>(std::move(tensors)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}
EMBER_REGISTER_DATASET_FACTORY("ember.data.TensorDataset", MakeTensorDataset);

absl::StatusOr<std::shared_ptr<Dataset>> MakeSubset(const Sample& args) {
  const Sample* factory = args.find("factory");
  const Sample* inner = args.find("args");
  const Sample* indices = args.find("indices");
  if (factory == nullptr || !factory->is<std::string>() || inner == nullptr || indices == nullptr ||
      !indices->is<Tensor>()) {
    return absl::InvalidArgumentError("Subset's recipe: expected factory, args and indices");
  }
  absl::StatusOr<std::shared_ptr<Dataset>> base =
      rebuild_dataset({*factory->get_if<std::string>(), *inner});
  if (!base.ok()) return base.status();
  const Tensor t = indices->get_if<Tensor>()->contiguous();
  return std::shared_ptr<Dataset>(std::make_shared<Subset>(
      *std::move(base),
      std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel())));
}
EMBER_REGISTER_DATASET_FACTORY("ember.data.Subset", MakeSubset);

}  // namespace

const WorkerInfo* get_worker_info() {
  const std::optional<WorkerInfo>& info = CurrentWorker();
  return info ? &*info : nullptr;
}

namespace internal {
void set_worker_info(const WorkerInfo& info) { CurrentWorker() = info; }
}  // namespace internal

// --- TensorDataset ------------------------------------------------------------

TensorDataset::TensorDataset(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
  EMBER_CHECK(!tensors_.empty(), "TensorDataset: needs at least one tensor");
  for (size_t i = 0; i < tensors_.size(); ++i) {
    EMBER_CHECK(tensors_[i].defined() && tensors_[i].dim() > 0, "TensorDataset: tensor ", i, " is ",
                tensors_[i].defined() ? "0-dimensional" : "undefined",
                "; every tensor needs a first dimension to index");
    EMBER_CHECK(tensors_[i].size(0) == tensors_[0].size(0),
                "TensorDataset: size mismatch between tensors: tensor 0 has ", tensors_[0].size(0),
                " samples and tensor ", i, " has ", tensors_[i].size(0));
  }
  size_ = tensors_[0].size(0);
}

std::optional<Recipe> TensorDataset::recipe() const {
  Sample::List tensors(tensors_.begin(), tensors_.end());
  return Recipe{"ember.data.TensorDataset", Sample(std::move(tensors))};
}

absl::StatusOr<Sample> TensorDataset::get(int64_t index) {
  if (index < 0 || index >= size_) return OutOfRange("TensorDataset", index, size_);
  Sample::List parts;
  parts.reserve(tensors_.size());
  for (const Tensor& t : tensors_) parts.emplace_back(t.select(0, index));
  return Sample(std::move(parts));
}

// --- Subset -------------------------------------------------------------------

Subset::Subset(std::shared_ptr<Dataset> dataset, std::vector<int64_t> indices)
    : dataset_(std::move(dataset)), indices_(std::move(indices)) {
  EMBER_CHECK(dataset_ != nullptr, "Subset: the dataset is null");
}

std::optional<Recipe> Subset::recipe() const {
  std::optional<Recipe> inner = dataset_->recipe();
  if (!inner) return std::nullopt;
  return Recipe{"ember.data.Subset", Sample::Dict{{"factory", inner->factory},
                                                  {"args", inner->args},
                                                  {"indices", Sample(tensor(indices_))}}};
}

absl::StatusOr<Sample> Subset::get(int64_t index) {
  if (index < 0 || index >= size()) return OutOfRange("Subset", index, size());
  return dataset_->get(indices_[index]);
}

// --- ConcatDataset ------------------------------------------------------------

ConcatDataset::ConcatDataset(std::vector<std::shared_ptr<Dataset>> datasets)
    : datasets_(std::move(datasets)) {
  EMBER_CHECK(!datasets_.empty(), "ConcatDataset: datasets should not be an empty list");
  int64_t total = 0;
  for (size_t i = 0; i < datasets_.size(); ++i) {
    EMBER_CHECK(datasets_[i] != nullptr, "ConcatDataset: dataset ", i, " is null");
    total += datasets_[i]->size();
    cumulative_.push_back(total);
  }
}

absl::StatusOr<Sample> ConcatDataset::get(int64_t index) {
  int64_t i = index < 0 ? size() + index : index;
  if (i < 0 || i >= size()) return OutOfRange("ConcatDataset", index, size());
  const size_t which =
      std::upper_bound(cumulative_.begin(), cumulative_.end(), i) - cumulative_.begin();
  const int64_t first = which == 0 ? 0 : cumulative_[which - 1];
  return datasets_[which]->get(i - first);
}

// --- random_split ---------------------------------------------------------------

absl::StatusOr<std::vector<std::shared_ptr<Subset>>> random_split(
    std::shared_ptr<Dataset> dataset, const std::vector<double>& lengths, Generator& generator) {
  if (dataset == nullptr) return absl::InvalidArgumentError("random_split: the dataset is null");
  const int64_t n = dataset->size();
  const double sum = std::accumulate(lengths.begin(), lengths.end(), 0.0);
  std::vector<int64_t> parts;
  // torch: fractions when math.isclose(sum, 1) (relative tolerance 1e-9)
  // and sum <= 1.
  if (!lengths.empty() && std::abs(sum - 1.0) <= 1e-9 && sum <= 1.0) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 0 || lengths[i] > 1) {
        return absl::InvalidArgumentError(absl::StrCat("random_split: fraction ", i, " (",
                                                       lengths[i], ") is not between 0 and 1"));
      }
      parts.push_back(static_cast<int64_t>(std::floor(static_cast<double>(n) * lengths[i])));
    }
    const int64_t remainder = n - std::accumulate(parts.begin(), parts.end(), int64_t{0});
    for (int64_t i = 0; i < remainder; ++i) ++parts[i % parts.size()];
  } else {
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 0 || lengths[i] != std::floor(lengths[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("random_split: length ", i, " (", lengths[i],
                         ") is not a whole number of samples; give whole lengths that sum to ",
                         "the dataset's size, or fractions that sum to 1"));
      }
      parts.push_back(static_cast<int64_t>(lengths[i]));
    }
  }
  const int64_t total = std::accumulate(parts.begin(), parts.end(), int64_t{0});
  if (total != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("random_split: the lengths sum to ", total, " but the dataset has ", n,
                     " samples; give lengths that sum to its size, or fractions that sum to 1"));
  }
  const Tensor perm = randperm(total, {}, &generator);
  const int64_t* p = perm.data_ptr<int64_t>();
  std::vector<std::shared_ptr<Subset>> subsets;
  int64_t offset = 0;
  for (int64_t length : parts) {
    subsets.push_back(
        std::make_shared<Subset>(dataset, std::vector<int64_t>(p + offset, p + offset + length)));
    offset += length;
  }
  return subsets;
}

}  // namespace ember::data
