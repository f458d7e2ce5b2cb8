// DistributedSampler (torch.utils.data.distributed.DistributedSampler): each
// rank's share of a dataset, disjoint across ranks, reshuffled by
// set_epoch.
//
//   ```cpp compile-only
//   #include "data/distributed_sampler.h"
//   namespace data = ember::data;
//   // After init_process_group: num_replicas and rank from the default group.
//   auto sampler = std::make_shared<data::DistributedSampler>(/*dataset_size=*/1000);
//   for (int epoch = 0; epoch < 3; ++epoch) {
//     sampler->set_epoch(epoch);  // a new order each epoch, the same on every rank
//     std::vector<int64_t> mine = sampler->indices();  // 1000 / world_size of them
//   }
//   ```
//
// The order is torch's: randperm(size) on a generator seeded with seed +
// epoch (or 0..size-1 without shuffle), padded by repeating its start until
// it divides evenly (or cut to a multiple of num_replicas with drop_last),
// then every num_replicas-th index from `rank`. The same seed and epoch give
// the indices torch's sampler gives every rank.
//
// Resuming (save_state / load_state, through DataLoader::state_dict): the
// state is the epoch, the seed and how many positions of the epoch's global
// order every rank together consumed (consumed * num_replicas, ranks
// stepping in lockstep as DDP does). A sampler that loads it leaves those
// positions out of that epoch's next indices() and splits the rest over its
// own num_replicas, padded from the order's start as torch pads, so a job
// resumed at another world size sees every sample of the epoch once; at
// the same world size it yields exactly the indices the uninterrupted run
// would have.
//
// With num_replicas or rank unset, the default process group gives them
// (get_world_size(), get_rank()); unset without an initialised group, or a
// rank outside [0, num_replicas), throws ember::Error saying which, as
// torch raises.
#ifndef EMBER_DATA_DISTRIBUTED_SAMPLER_H_
#define EMBER_DATA_DISTRIBUTED_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "data/sampler.h"

namespace ember::data {

struct DistributedSamplerOptions {
  std::optional<int> num_replicas;  // the default group's size when unset
  std::optional<int> rank;          // this process's rank in it when unset
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler : public Sampler {
 public:
  explicit DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options = {});
  // Indices per rank per epoch (torch's num_samples; after a resumed
  // start, those left).
  int64_t size() const override;
  std::vector<int64_t> indices() override;
  // The epoch the next indices() shuffles for. A resumed start (below)
  // belongs to one epoch and is dropped when another is set.
  void set_epoch(int64_t epoch) {
    if (epoch != epoch_) start_ = 0;
    epoch_ = epoch;
  }
  int64_t epoch() const { return epoch_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  // size() * num_replicas.
  int64_t total_size() const { return size() * num_replicas_; }
  // The whole epoch's order before it is split over ranks (padded or cut
  // to total_size()): rank r's indices are every num_replicas-th from r.
  std::vector<int64_t> global_indices() const;
  // Positions of this epoch's global order already consumed (a resumed
  // start; 0 otherwise). The next indices() begins after them, once.
  int64_t start() const { return start_; }
  void set_start(int64_t start);

  void save_state(int64_t consumed, StateDict& out) const override;
  absl::StatusOr<bool> load_state(const StateDict& in) override;

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;
  // What indices() drew last: its start (for save_state).
  int64_t drawn_start_ = 0;
};

}  // namespace ember::data

#endif  // EMBER_DATA_DISTRIBUTED_SAMPLER_H_
