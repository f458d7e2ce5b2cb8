#include "data/distributed_sampler.h"

#include <numeric>
#include <string_view>

#include "distributed/distributed.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

int FromGroup(const std::optional<int>& given, const char* what) {
  if (given) return *given;
  EMBER_CHECK(distributed::is_initialized(), "DistributedSampler: ", what,
              " was not given and the default process group is not initialised; call "
              "init_process_group first or pass ", what);
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
  EMBER_CHECK(dataset_size_ >= 0, "DistributedSampler: the dataset size must be non-negative, "
              "got ", dataset_size_);
  EMBER_CHECK(num_replicas_ > 0, "DistributedSampler: num_replicas must be positive, got ",
              num_replicas_);
  EMBER_CHECK(rank_ >= 0 && rank_ < num_replicas_, "DistributedSampler: Invalid rank ", rank_,
              ", rank should be in the interval [0, ", num_replicas_ - 1, "]");
  num_samples_ = drop_last_ && dataset_size_ % num_replicas_ != 0
                     ? CeilDiv(dataset_size_ - num_replicas_, num_replicas_)
                     : CeilDiv(dataset_size_, num_replicas_);
  total_size_ = num_samples_ * num_replicas_;
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
  if (static_cast<int64_t>(order.size()) > total_size_) {
    order.resize(total_size_);  // drop_last
  } else {
    // Padding: the order repeated from its start (torch's indices[:pad], or
    // the whole order as many times as needed).
    const size_t n = order.size();
    for (size_t i = 0; order.size() < static_cast<size_t>(total_size_); ++i) {
      order.push_back(order[i % n]);
    }
  }
  return order;
}

std::vector<int64_t> DistributedSampler::indices() {
  const std::vector<int64_t> all = global_indices();
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < total_size_; i += num_replicas_) mine.push_back(all[i]);
  return mine;
}

}  // namespace ember::data
