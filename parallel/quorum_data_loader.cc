#include "parallel/quorum_data_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "data/distributed_sampler.h"
#include "data/sampler.h"
#include "tensor/status_macros.h"

namespace ember::parallel {

// The batches of one share from a step to the end of its epoch.
class QuorumDataLoader::StepBatches : public data::BatchSampler {
 public:
  StepBatches(const QuorumDataLoader* owner, int64_t size)
      : data::BatchSampler(std::make_shared<data::SequentialSampler>(size), 1, true),
        owner_(owner) {}
  void set(int64_t step, int rank, int participants) {
    step_ = step;
    rank_ = rank;
    participants_ = participants;
  }
  int64_t size() const override {
    return owner_->steps_per_epoch_ - step_ % owner_->steps_per_epoch_;
  }
  std::vector<std::vector<int64_t>> batches() override {
    std::vector<std::vector<int64_t>> out;
    const int64_t end = (step_ / owner_->steps_per_epoch_ + 1) * owner_->steps_per_epoch_;
    const std::vector<int64_t>& order = owner_->Order(step_ / owner_->steps_per_epoch_);
    for (int64_t s = step_; s < end; ++s) out.push_back(owner_->Share(order, s, rank_, participants_));
    return out;
  }

 private:
  const QuorumDataLoader* owner_;
  int64_t step_ = 0;
  int rank_ = 0;
  int participants_ = 1;
};

absl::StatusOr<std::unique_ptr<QuorumDataLoader>> QuorumDataLoader::create(
    std::shared_ptr<data::Dataset> dataset, const Manager* manager,
    QuorumDataLoaderOptions options) {
  if (dataset == nullptr) return absl::InvalidArgumentError("QuorumDataLoader: dataset is null");
  if (manager == nullptr) return absl::InvalidArgumentError("QuorumDataLoader: manager is null");
  const int64_t size = dataset->size();
  if (options.global_batch_size < 1 || options.global_batch_size > size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuorumDataLoader: global_batch_size must be in [1, ", size,
        "] (the dataset's size), got ", options.global_batch_size));
  }
  const data::DataLoaderOptions& l = options.loader;
  if (l.batch_size != 1 || l.shuffle || l.sampler != nullptr || l.batch_sampler != nullptr ||
      l.drop_last) {
    return absl::InvalidArgumentError(
        "QuorumDataLoader: loader options batch_size, shuffle, sampler, batch_sampler and "
        "drop_last must stay unset: the committed step chooses the batch (set "
        "global_batch_size, shuffle and seed in QuorumDataLoaderOptions)");
  }
  std::unique_ptr<QuorumDataLoader> q(new QuorumDataLoader());
  q->manager_ = manager;
  q->size_ = size;
  q->steps_per_epoch_ = size / options.global_batch_size;
  q->batches_ = std::make_shared<StepBatches>(q.get(), size);
  data::DataLoaderOptions lo = options.loader;
  lo.batch_sampler = q->batches_;
  q->options_ = std::move(options);
  EMBER_ASSIGN_OR_RETURN(data::DataLoader loader, data::DataLoader::create(std::move(dataset), lo));
  q->loader_.emplace(std::move(loader));
  return q;
}

QuorumDataLoader::~QuorumDataLoader() {
  it_.reset();
  loader_.reset();
}

const std::vector<int64_t>& QuorumDataLoader::Order(int64_t epoch) const {
  if (epoch != order_epoch_) {
    data::DistributedSampler order(
        size_, {.num_replicas = 1, .rank = 0, .shuffle = options_.shuffle, .seed = options_.seed});
    order.set_epoch(epoch);
    order_ = order.global_indices();
    order_epoch_ = epoch;
  }
  return order_;
}

std::vector<int64_t> QuorumDataLoader::indices(int64_t step, int rank, int participants) const {
  return Share(Order(step / steps_per_epoch_), step, rank, participants);
}

std::vector<int64_t> QuorumDataLoader::Share(const std::vector<int64_t>& all, int64_t step,
                                             int rank, int participants) const {
  const int64_t begin = (step % steps_per_epoch_) * options_.global_batch_size;
  std::vector<int64_t> out;
  for (int64_t i = rank; i < options_.global_batch_size; i += participants) {
    out.push_back(all[static_cast<size_t>(begin + i)]);
  }
  return out;
}

absl::Status QuorumDataLoader::Restart(int64_t step, int rank, int participants) {
  it_.reset();
  batches_->set(step, rank, participants);
  EMBER_ASSIGN_OR_RETURN(data::DataLoaderIterator it, loader_->iter());
  it_.emplace(std::move(it));
  next_step_ = step;
  rank_ = rank;
  participants_ = participants;
  return absl::OkStatus();
}

absl::StatusOr<data::Sample> QuorumDataLoader::next() {
  const int64_t step = manager_->current_step();
  const int rank = manager_->participant_rank();
  const int participants = manager_->num_participants();
  if (participants > options_.global_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuorumDataLoader: step ", step, " has ", participants,
        " participants, more than global_batch_size ", options_.global_batch_size,
        ": some would train no sample; raise global_batch_size"));
  }
  const bool follows = it_.has_value() && step == next_step_ && rank == rank_ &&
                       participants == participants_ && step % steps_per_epoch_ != 0;
  if (!follows) EMBER_RETURN_IF_ERROR(Restart(step, rank, participants));
  EMBER_ASSIGN_OR_RETURN(std::optional<data::Sample> batch, it_->next());
  if (!batch.has_value()) {
    return absl::InternalError(absl::StrCat("QuorumDataLoader: no batch for step ", step));
  }
  last_indices_ = indices(step, rank, participants);
  next_step_ = step + 1;
  return *std::move(batch);
}

}  // namespace ember::parallel
