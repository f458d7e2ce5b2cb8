// DataLoader (torch.utils.data.DataLoader): batches of a dataset, made in
// the calling thread or in worker processes that hand them over through
// shared memory.
//
//   ```cpp
//   #include "tensor/status_macros.h"
//   #include "data/dataloader.h"
//   #include "tensor/factories.h"
//   namespace data = ember::data;
//   auto ds = std::make_shared<data::TensorDataset>(
//       std::vector<ember::Tensor>{ember::randn({1000, 8}), ember::randint(0, 2, {1000})});
//   EMBER_ASSIGN_OR_RETURN(data::DataLoader loader,
//                          data::DataLoader::create(ds, {.batch_size = 64, .shuffle = true,
//                                                        .num_workers = 2}));
//   for (int epoch = 0; epoch < 2; ++epoch) {
//     EMBER_ASSIGN_OR_RETURN(data::DataLoaderIterator it, loader.iter());
//     while (true) {
//       EMBER_ASSIGN_OR_RETURN(std::optional<data::Sample> batch, it.next());
//       if (!batch) break;  // the epoch's end
//       EMBER_ASSIGN_OR_RETURN(ember::Tensor x, batch->list()[0].as<ember::Tensor>());  // 64 x 8
//     }
//   }
//   ```
//
// The options are torch's, with its defaults and its refusals of
// conflicting ones (InvalidArgument, with torch's wording). Sampling is
// torch's: shuffle gives a RandomSampler on `generator`, batch_size a
// BatchSampler; an epoch first draws the workers' base seed from
// `generator` (or the default generator), then the sampler's order, so a
// seed gives torch's order (Note [Random numbers] in tensor/factories.h).
//
// Workers (Note [DataLoader workers] in dataloader.cc): num_workers
// processes (forked, or started by spawn or forkserver and given the
// dataset's recipe()), each with its own copy of the dataset, its Ember generators
// seeded with base_seed + id (so workers never draw the same numbers), and
// get_worker_info() set. The loop keeps prefetch_factor batches per worker
// requested, round robin; a worker collates a batch straight into shared
// memory and the loop receives views of the same bytes, no copy. Batches
// come in sampler order (in_order), or as they are ready (in_order=false).
// Workers end with the epoch (the iterator's end or destruction) unless
// persistent_workers keeps them for the next one. They die with the
// process that started them.
//
// Failures, each a Status from next():
//   - the dataset's get() or the collate function fails (or throws): its
//     code, naming the worker (with workers) and the sample index; the
//     iterator goes on with the next batch, as torch's re-raise does;
//   - a worker dies (a signal, an exit): Aborted naming the worker, its
//     pid and how it ended; the other workers are stopped, and every later
//     next() returns the same error;
//   - `timeout` passes while waiting for a batch: DeadlineExceeded naming
//     the batch and the worker;
//   - shared memory runs out: ResourceExhausted naming the size asked,
//     the free space and what to do.
// pin_memory copies each batch's tensors into pinned host memory in the
// loop (ready for non_blocking copies to a GPU); without a usable GPU it
// says so once on stderr and is ignored, as torch's.
//
// A DataLoader is thread-compatible; one iterator at a time (as torch's
// with workers: a new iter() ends the previous epoch's workers).
#ifndef EMBER_DATA_DATALOADER_H_
#define EMBER_DATA_DATALOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "serialization/state_dict.h"
#include "tensor/factories.h"

namespace ember::data {

struct DataLoaderOptions {
  // Samples per batch; nullopt disables batching (each sample as it is,
  // torch's batch_size=None).
  std::optional<int64_t> batch_size = 1;
  bool shuffle = false;
  std::shared_ptr<Sampler> sampler;
  std::shared_ptr<BatchSampler> batch_sampler;
  // 0: batches are made in the calling thread.
  int num_workers = 0;
  // default_collate when batching, the sample itself when not.
  CollateFn collate_fn;
  bool pin_memory = false;
  bool drop_last = false;
  // How long next() waits for a worker's batch; zero: no limit.
  absl::Duration timeout = absl::ZeroDuration();
  // Runs in each worker after seeding, before its first batch; a failure
  // is reported by next() as the worker's.
  std::function<absl::Status(int worker_id)> worker_init_fn;
  // The start method of the workers: "fork" (also when empty), "spawn" or
  // "forkserver". The last two start fresh processes of this binary (its
  // main() calls multiprocessing::maybe_run_spawned_child() first), which
  // rebuild the dataset from its recipe() (tensors arrive in shared
  // memory); collate_fn and worker_init_fn must be unset for them.
  std::string multiprocessing_context;
  // Not owned. Draws the base seed and the shuffle order; null: the
  // default generator.
  Generator* generator = nullptr;
  // Batches requested ahead per worker (2 when unset); only with workers.
  std::optional<int> prefetch_factor;
  bool persistent_workers = false;
  bool in_order = true;
};

class DataLoader;
struct LoaderState;  // data/dataloader.cc

// One epoch (torch's iter(loader)).
class DataLoaderIterator {
 public:
  DataLoaderIterator(DataLoaderIterator&&) noexcept;
  DataLoaderIterator& operator=(DataLoaderIterator&&) noexcept;
  // Ends the epoch: non-persistent workers are stopped.
  ~DataLoaderIterator();
  // The next batch, or nullopt at the epoch's end (and after).
  absl::StatusOr<std::optional<Sample>> next();

 private:
  friend class DataLoader;
  struct Epoch;
  explicit DataLoaderIterator(std::unique_ptr<Epoch> epoch);
  std::unique_ptr<Epoch> epoch_;
};

class DataLoader {
 public:
  // InvalidArgument for options torch refuses (naming them) and for start
  // methods other than fork.
  static absl::StatusOr<DataLoader> create(std::shared_ptr<Dataset> dataset,
                                           DataLoaderOptions options = {});
  static absl::StatusOr<DataLoader> create(std::shared_ptr<IterableDataset> dataset,
                                           DataLoaderOptions options = {});
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  // Stops persistent workers (once no iterator of it is left).
  ~DataLoader();

  // Starts an epoch: draws the base seed, then the sampler's order, and
  // starts the workers (unless persistent ones are running). Errors:
  // those of starting a process or creating its queues.
  absl::StatusOr<DataLoaderIterator> iter();
  // Resuming mid-epoch (Note [Resuming a loader] in dataloader.cc). Where
  // the loop stands, as named tensors that ember::save and distributed
  // checkpoints store beside a model's: the state of the generator the loader
  // draws from when the epoch began, the batches and samples the loop has
  // taken, each worker's generator state after the last batch taken from
  // it, and the sampler's part (DistributedSampler: the positions of the
  // epoch all ranks took).
  StateDict state_dict() const;
  // Takes such a state (into a new loader over the same dataset, in a new
  // process, at another world size): the next iter() yields the rest of the
  // saved epoch, the batches the uninterrupted run would have yielded (with
  // a DistributedSampler at another world size: the samples no rank took,
  // split over the new ranks). The loader's generator (options.generator,
  // or the default generator) is set back to its saved state first and
  // draws the epoch again. InvalidArgument naming a missing or malformed
  // entry (nothing changes then); Unimplemented for an iterable dataset,
  // whose stream has no state to resume from.
  absl::Status load_state_dict(const StateDict& state);

  // torch's len(loader): batches per epoch (samples without batching);
  // nullopt for an iterable dataset without a size.
  std::optional<int64_t> size() const;
  const DataLoaderOptions& options() const;

 private:
  explicit DataLoader(std::shared_ptr<LoaderState> state);
  std::shared_ptr<LoaderState> state_;
};

}  // namespace ember::data

#endif  // EMBER_DATA_DATALOADER_H_
