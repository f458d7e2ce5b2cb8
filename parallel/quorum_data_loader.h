// QuorumDataLoader: the data of a fault-tolerant job (parallel/
// fault_tolerance.h) as a function of its committed steps, so that no
// sample is lost or trained twice whatever the failures.
//
//   ```cpp compile-only
//   #include "data/dataset.h"
//   #include "nn/linear.h"
//   #include "parallel/quorum_data_loader.h"
//   #include "tensor/factories.h"
//   #include "tensor/status_macros.h"
//   namespace par = ember::parallel;
//   auto model = std::make_shared<ember::nn::Linear>(16, 4);
//   EMBER_ASSIGN_OR_RETURN(auto ft, par::Manager::create(model, nullptr, {.replica_id = "r1"}));
//   auto ds = std::make_shared<ember::data::TensorDataset>(
//       std::vector<ember::Tensor>{ember::randn({960, 16})});
//   EMBER_ASSIGN_OR_RETURN(auto loader,
//                          par::QuorumDataLoader::create(ds, ft.get(), {.global_batch_size = 96}));
//   while (ft->current_step() < 1000) {
//     EMBER_RETURN_IF_ERROR(ft->start_quorum());
//     EMBER_ASSIGN_OR_RETURN(ember::data::Sample batch, loader->next());  // this step's share
//     EMBER_ASSIGN_OR_RETURN(ember::Tensor x, batch.list()[0].as<ember::Tensor>());
//     // ... forward and backward on x, ft->allreduce_gradients() ...
//     ft->should_commit();
//   }
//   ```
//
// Note [Data that follows the quorum]
// Committed step s is epoch s / steps_per_epoch() (steps_per_epoch() =
// dataset size / global_batch_size; the tail of each epoch is left out, as
// drop_last leaves it) and takes positions [(s % steps_per_epoch()) * B,
// + B) of that epoch's order (B = global_batch_size): torch's
// DistributedSampler order for one replica, randperm on seed + epoch, or
// 0..size-1 without shuffle. The participant of participant_rank() p among
// num_participants() n takes every n-th of those positions from p. next()
// reads (current_step(), p, n) from the Manager at each call: when they
// follow the last batch's (the next step, the same p and n) it hands out
// the next batch of the running epoch (workers prefetch as a DataLoader's
// do); otherwise (the quorum changed, a discarded step is tried again, a
// state recovered from a peer moved the step) it starts the loader again at
// that step's batch. Since the step is part of the state a recovering group
// receives, its data follows with no state of its own, and every committed
// step trains each position of its batch exactly once. With
// B % n != 0 the first B % n participants take one sample more: a mean
// loss then weighs samples unevenly (scale it by the share's size * n / B,
// or pick B divisible by every participant count the job may see).
//
// Errors: InvalidArgument from create() for a global_batch_size outside
// [1, dataset size], a null dataset or manager, or loader options that pick
// the batches themselves (batch_size, shuffle, sampler, batch_sampler,
// drop_last); from next(), InvalidArgument when the step's participants
// outnumber B, and the loader's own errors. Thread-compatible, driven by
// the Manager's thread.
#ifndef EMBER_PARALLEL_QUORUM_DATA_LOADER_H_
#define EMBER_PARALLEL_QUORUM_DATA_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "parallel/fault_tolerance.h"

namespace ember::parallel {

struct QuorumDataLoaderOptions {
  // Samples per committed step, over all participants together.
  int64_t global_batch_size = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  // Workers, collate_fn, pin_memory, timeout, persistent_workers...; the
  // options that choose batches must stay unset.
  data::DataLoaderOptions loader;
};

class QuorumDataLoader {
 public:
  // `manager` is not owned and must outlive the loader.
  static absl::StatusOr<std::unique_ptr<QuorumDataLoader>> create(
      std::shared_ptr<data::Dataset> dataset, const Manager* manager,
      QuorumDataLoaderOptions options);
  ~QuorumDataLoader();

  // This participant's share of current_step()'s batch (Note [Data that
  // follows the quorum]).
  absl::StatusOr<data::Sample> next();
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The dataset indices of the last batch next() returned.
  const std::vector<int64_t>& last_indices() const { return last_indices_; }
  // The indices participant `rank` of `participants` takes at `step`.
  std::vector<int64_t> indices(int64_t step, int rank, int participants) const;

 private:
  class StepBatches;
  QuorumDataLoader() = default;
  absl::Status Restart(int64_t step, int rank, int participants);
  // The epoch's order (the last one asked for is kept), and the share of
  // `step` in it.
  const std::vector<int64_t>& Order(int64_t epoch) const;
  std::vector<int64_t> Share(const std::vector<int64_t>& order, int64_t step, int rank,
                             int participants) const;

  const Manager* manager_ = nullptr;
  QuorumDataLoaderOptions options_;
  int64_t size_ = 0;
  int64_t steps_per_epoch_ = 0;
  std::shared_ptr<StepBatches> batches_;
  std::optional<data::DataLoader> loader_;
  std::optional<data::DataLoaderIterator> it_;
  // What the running iterator hands out next.
  int64_t next_step_ = -1;
  int rank_ = -1;
  int participants_ = 0;
  std::vector<int64_t> last_indices_;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_QUORUM_DATA_LOADER_H_
