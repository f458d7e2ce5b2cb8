// Samplers (torch.utils.data.Sampler and its kinds): which indices of a
// dataset an epoch visits, in which order, and how they group into batches.
//
//   ```cpp
//   #include "data/sampler.h"
//   namespace data = ember::data;
//   ember::Generator g(0);
//   auto shuffled = std::make_shared<data::RandomSampler>(10, data::RandomSamplerOptions{
//       .generator = &g});
//   std::vector<int64_t> order = shuffled->indices();  // torch's order for seed 0
//   data::BatchSampler batches(shuffled, /*batch_size=*/4, /*drop_last=*/false);
//   std::vector<std::vector<int64_t>> b = batches.batches();  // sizes 4, 4, 2
//   ```
//
// indices() is one epoch (torch's iter() run to its end): each call draws a
// new order from the sampler's generator, exactly as torch's sampler draws
// it (randperm, randint and multinomial on the same CPU generator, Note
// [Random numbers] in tensor/factories.h), so for the same seed Ember and
// torch visit the same samples in the same order. A sampler without a
// generator: RandomSampler draws a fresh seed for each epoch from the
// default generator (torch's int64 random_()), the others draw on the
// default generator itself, as torch's do.
//
// Invalid arguments (a non-positive num_samples or batch size, weights that
// are not a distribution) throw ember::Error naming the value, as torch's
// constructors raise ValueError. Samplers are thread-compatible.
#ifndef EMBER_DATA_SAMPLER_H_
#define EMBER_DATA_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "serialization/state_dict.h"
#include "tensor/factories.h"

namespace ember::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // torch's __len__: how many indices an epoch yields.
  virtual int64_t size() const = 0;
  // One epoch's indices, in order.
  virtual std::vector<int64_t> indices() = 0;

  // Resuming mid-epoch (DataLoader::state_dict, Note [Resuming a loader] in
  // dataloader.cc). save_state adds the sampler's part of a loader's state,
  // given how many of the last indices() the loop consumed; load_state
  // takes it back, returning true when the sampler resumes by itself (its
  // next indices() leaves out what was consumed), false when the loader is
  // to replay the epoch's order from its generator and skip the consumed
  // batches. The default saves nothing and returns false.
  virtual void save_state(int64_t consumed, StateDict& out) const {}
  virtual absl::StatusOr<bool> load_state(const StateDict& in) { return false; }
};

// 0, 1, ..., n - 1.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() override;

 private:
  int64_t n_;
};

struct RandomSamplerOptions {
  // Draw with replacement (randint) instead of permutations.
  bool replacement = false;
  // Indices per epoch; n when unset. Without replacement, more than n gives
  // whole permutations one after another, as torch.
  std::optional<int64_t> num_samples;
  // Not owned; null: a seed per epoch from the default generator.
  Generator* generator = nullptr;
};

// torch.utils.data.RandomSampler over n samples.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, RandomSamplerOptions options = {});
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() override;

 private:
  int64_t n_;
  int64_t num_samples_;
  bool replacement_;
  Generator* generator_;
};

// The given indices in a random order (torch's SubsetRandomSampler).
class SubsetRandomSampler : public Sampler {
 public:
  // `generator`: not owned; null: the default generator.
  explicit SubsetRandomSampler(std::vector<int64_t> indices, Generator* generator = nullptr);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  std::vector<int64_t> indices() override;

 private:
  std::vector<int64_t> indices_;
  Generator* generator_;
};

// Index i with probability weights[i] / sum(weights) (torch's
// WeightedRandomSampler, torch.multinomial on float64 weights). With
// replacement (the default) the draws are torch's for the same seed;
// without, Ember draws its own (Efraimidis-Spirakis keys on uniform draws),
// the same distribution in another order than torch's.
class WeightedRandomSampler : public Sampler {
 public:
  // `generator`: not owned; null: the default generator.
  WeightedRandomSampler(std::vector<double> weights, int64_t num_samples, bool replacement = true,
                        Generator* generator = nullptr);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() override;

 private:
  std::vector<double> weights_;
  int64_t num_samples_;
  bool replacement_;
  Generator* generator_;
};

// Groups a sampler's indices into batches (torch's BatchSampler); the last
// one is smaller unless drop_last. A custom batch sampler overrides
// batches().
class BatchSampler {
 public:
  BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last);
  virtual ~BatchSampler() = default;
  // Batches per epoch.
  virtual int64_t size() const;
  virtual std::vector<std::vector<int64_t>> batches();
  const std::shared_ptr<Sampler>& sampler() const { return sampler_; }
  int64_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }

 private:
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
};

namespace internal {
// The tensor under `key` in a loader's state, or null.
const Tensor* FindState(const StateDict& state, const std::string& key);
// The integer under `key`: InvalidArgument naming the key when it is absent
// or not a one-element integer tensor.
absl::StatusOr<int64_t> StateInt(const StateDict& state, const std::string& key);
// A one-element int64 tensor, how integers are saved in a loader's state.
Tensor StateValue(int64_t value);

// A fresh seed from the default generator, drawn as torch's int64 random_()
// draws it (a 64-bit draw modulo 2^63): what torch's samplers and loader
// take when they are given no generator.
uint64_t DrawSeed(Generator& generator);
}  // namespace internal

}  // namespace ember::data

#endif  // EMBER_DATA_SAMPLER_H_
