#include "data/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "distributed/distributed.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::data {
namespace {

int FromGroup(const std::optional<int>& given, const char* what) {
  if (given) return *given;
  EMBER_CHECK(distributed::is_initialized(), "DistributedSampler: ", what,
              " was not given and the default process group is not initialised; call "
              "init_process_group first or pass ",
              what);
  return std::string_view(what) == "num_replicas" ? distributed::get_world_size()
                                                  : distributed::get_rank();
}

// ceil(a / b) for b > 0 and any a (Python's math.ceil of the quotient).
int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size),
      num_replicas_(FromGroup(options.num_replicas, "num_replicas")),
      rank_(FromGroup(options.rank, "rank")),
      shuffle_(options.shuffle),
      seed_(options.seed),
      drop_last_(options.drop_last) {
  EMBER_CHECK(dataset_size_ >= 0,
              "DistributedSampler: the dataset size must be non-negative, "
              "got ",
              dataset_size_);
  EMBER_CHECK(num_replicas_ > 0, "DistributedSampler: num_replicas must be positive, got ",
              num_replicas_);
  EMBER_CHECK(rank_ >= 0 && rank_ < num_replicas_, "DistributedSampler: Invalid rank ", rank_,
              ", rank should be in the interval [0, ", num_replicas_ - 1, "]");
}

int64_t DistributedSampler::size() const {
  const int64_t n = dataset_size_ - start_;
  return drop_last_ && n % num_replicas_ != 0 ? CeilDiv(n - num_replicas_, num_replicas_)
                                              : CeilDiv(n, num_replicas_);
}

void DistributedSampler::set_start(int64_t start) {
  EMBER_CHECK(start >= 0 && start <= dataset_size_, "DistributedSampler::set_start: ", start,
              " positions cannot have been consumed of an epoch of ", dataset_size_);
  start_ = start;
}

std::vector<int64_t> DistributedSampler::global_indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    Generator g(seed_ + static_cast<uint64_t>(epoch_));
    const Tensor p = randperm(dataset_size_, {}, &g);
    order.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
  } else {
    order.resize(dataset_size_);
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // After a resumed start only the rest is split; it is padded from the
  // whole order's start, as torch pads the whole order, so at the same
  // world size the padding is the uninterrupted run's.
  std::vector<int64_t> rest(order.begin() + start_, order.end());
  const int64_t total = size() * num_replicas_;
  if (static_cast<int64_t>(rest.size()) > total) {
    rest.resize(total);  // drop_last
  } else {
    for (size_t i = 0; static_cast<int64_t>(rest.size()) < total; ++i) {
      rest.push_back(order[i % order.size()]);
    }
  }
  return rest;
}

std::vector<int64_t> DistributedSampler::indices() {
  const std::vector<int64_t> all = global_indices();
  std::vector<int64_t> mine;
  for (size_t i = rank_; i < all.size(); i += num_replicas_) mine.push_back(all[i]);
  drawn_start_ = start_;
  start_ = 0;  // a resumed start serves one pass
  return mine;
}

void DistributedSampler::save_state(int64_t consumed, StateDict& out) const {
  out.emplace_back("sampler.epoch", internal::StateValue(epoch_));
  out.emplace_back("sampler.seed", internal::StateValue(static_cast<int64_t>(seed_)));
  out.emplace_back(
      "sampler.consumed",
      internal::StateValue(std::min(dataset_size_, drawn_start_ + consumed * num_replicas_)));
}

absl::StatusOr<bool> DistributedSampler::load_state(const StateDict& in) {
  if (internal::FindState(in, "sampler.consumed") == nullptr) return false;
  EMBER_ASSIGN_OR_RETURN(int64_t epoch, internal::StateInt(in, "sampler.epoch"));
  EMBER_ASSIGN_OR_RETURN(int64_t seed, internal::StateInt(in, "sampler.seed"));
  EMBER_ASSIGN_OR_RETURN(int64_t consumed, internal::StateInt(in, "sampler.consumed"));
  if (static_cast<uint64_t>(seed) != seed_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: the loader state was saved with seed ", seed,
                     " and this sampler has seed ", seed_,
                     "; the epoch's order would differ, so the "
                     "consumed samples cannot be left out: give the sampler the saved seed"));
  }
  if (consumed < 0 || consumed > dataset_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: the loader state says ", consumed,
                     " samples of the epoch were consumed, but the dataset has ", dataset_size_,
                     "; it was saved for another dataset"));
  }
  epoch_ = epoch;
  start_ = consumed;
  return true;
}

}  // namespace ember::data
