#include "data/sampler.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace ember::data {
namespace internal {

const Tensor* FindState(const StateDict& state, const std::string& key) {
  for (const auto& [name, t] : state) {
    if (name == key) return &t;
  }
  return nullptr;
}

absl::StatusOr<int64_t> StateInt(const StateDict& state, const std::string& key) {
  const Tensor* t = FindState(state, key);
  if (t == nullptr || !t->defined() || t->numel() != 1 || is_floating_point(t->dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the loader state has no integer '", key, "'",
                     t == nullptr ? "" : " (it holds another kind of tensor)",
                     "; pass what DataLoader::state_dict() returned"));
  }
  return t->to(kInt64).item<int64_t>();
}

Tensor StateValue(int64_t value) { return full({}, value, kInt64); }

uint64_t DrawSeed(Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.random64() % (uint64_t{1} << 63);
}

}  // namespace internal

namespace {

std::vector<int64_t> ToVector(const Tensor& t) {
  const int64_t* p = t.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

Generator& Or(Generator* g) { return g != nullptr ? *g : default_generator(); }

}  // namespace

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  EMBER_CHECK(n >= 0, "SequentialSampler: the dataset size must be non-negative, got ", n);
}

std::vector<int64_t> SequentialSampler::indices() {
  std::vector<int64_t> out(n_);
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, RandomSamplerOptions options)
    : n_(n),
      num_samples_(options.num_samples.value_or(n)),
      replacement_(options.replacement),
      generator_(options.generator) {
  EMBER_CHECK(n_ > 0, "RandomSampler: the dataset is empty (", n_, " samples); nothing to draw");
  EMBER_CHECK(num_samples_ > 0,
              "RandomSampler: num_samples should be a positive integer value, "
              "but got num_samples=",
              num_samples_, options.num_samples ? "" : " (the dataset's size)");
}

std::vector<int64_t> RandomSampler::indices() {
  std::optional<Generator> own;
  if (generator_ == nullptr) own.emplace(internal::DrawSeed(default_generator()));
  Generator* g = generator_ != nullptr ? generator_ : &*own;
  std::vector<int64_t> out;
  out.reserve(num_samples_);
  if (replacement_) {
    // torch draws 32 at a time; the draws are one sequence either way.
    const Tensor draws = randint(0, n_, {num_samples_}, {}, g);
    return ToVector(draws);
  }
  for (int64_t k = 0; k < num_samples_ / n_; ++k) {
    const std::vector<int64_t> p = ToVector(randperm(n_, {}, g));
    out.insert(out.end(), p.begin(), p.end());
  }
  // torch draws this last permutation even when none of it is kept.
  const std::vector<int64_t> last = ToVector(randperm(n_, {}, g));
  out.insert(out.end(), last.begin(), last.begin() + num_samples_ % n_);
  return out;
}

SubsetRandomSampler::SubsetRandomSampler(std::vector<int64_t> indices, Generator* generator)
    : indices_(std::move(indices)), generator_(generator) {}

std::vector<int64_t> SubsetRandomSampler::indices() {
  const Tensor p = randperm(static_cast<int64_t>(indices_.size()), {}, &Or(generator_));
  std::vector<int64_t> out;
  out.reserve(indices_.size());
  for (int64_t i : ToVector(p)) out.push_back(indices_[i]);
  return out;
}

WeightedRandomSampler::WeightedRandomSampler(std::vector<double> weights, int64_t num_samples,
                                             bool replacement, Generator* generator)
    : weights_(std::move(weights)),
      num_samples_(num_samples),
      replacement_(replacement),
      generator_(generator) {
  EMBER_CHECK(num_samples_ > 0,
              "WeightedRandomSampler: num_samples should be a positive integer "
              "value, but got num_samples=",
              num_samples_);
  EMBER_CHECK(!weights_.empty(), "WeightedRandomSampler: weights is empty");
  double sum = 0;
  int64_t positive = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    EMBER_CHECK(std::isfinite(weights_[i]) && weights_[i] >= 0, "WeightedRandomSampler: weight ", i,
                " is ", weights_[i], "; weights must be finite and non-negative");
    sum += weights_[i];
    positive += weights_[i] > 0;
  }
  EMBER_CHECK(sum > 0,
              "WeightedRandomSampler: the weights sum to 0; at least one must be "
              "positive");
  EMBER_CHECK(replacement_ || num_samples_ <= positive, "WeightedRandomSampler: cannot draw ",
              num_samples_, " samples without replacement from ", positive,
              " non-zero weights; draw fewer or with replacement");
}

std::vector<int64_t> WeightedRandomSampler::indices() {
  Generator& g = Or(generator_);
  std::vector<int64_t> out;
  out.reserve(num_samples_);
  std::lock_guard<std::mutex> lock(g.mutex());
  if (replacement_) {
    // torch.multinomial's CPU kernel: the cumulative sum divided by the
    // total, then for each draw the first category whose cumulative
    // probability is not below a uniform double.
    std::vector<double> cumulative(weights_.size());
    double sum = 0;
    for (size_t i = 0; i < weights_.size(); ++i) cumulative[i] = sum += weights_[i];
    for (double& c : cumulative) c /= sum;
    for (int64_t k = 0; k < num_samples_; ++k) {
      const double u = g.NextDouble();
      out.push_back(std::lower_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin());
    }
    return out;
  }
  // Efraimidis-Spirakis: the num_samples largest u^(1/w).
  std::vector<std::pair<double, int64_t>> keys;
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (weights_[i] > 0) {
      keys.emplace_back(std::log(1.0 - g.NextDouble()) / weights_[i], static_cast<int64_t>(i));
    }
  }
  std::partial_sort(keys.begin(), keys.begin() + num_samples_, keys.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int64_t k = 0; k < num_samples_; ++k) out.push_back(keys[k].second);
  return out;
}

BatchSampler::BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  EMBER_CHECK(sampler_ != nullptr, "BatchSampler: the sampler is null");
  EMBER_CHECK(batch_size_ > 0,
              "BatchSampler: batch_size should be a positive integer value, but "
              "got batch_size=",
              batch_size_);
}

int64_t BatchSampler::size() const {
  const int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

std::vector<std::vector<int64_t>> BatchSampler::batches() {
  const std::vector<int64_t> all = sampler_->indices();
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < all.size(); i += batch_size_) {
    const size_t end = std::min(all.size(), i + static_cast<size_t>(batch_size_));
    if (drop_last_ && end - i < static_cast<size_t>(batch_size_)) break;
    out.emplace_back(all.begin() + i, all.begin() + end);
  }
  return out;
}

}  // namespace ember::data
