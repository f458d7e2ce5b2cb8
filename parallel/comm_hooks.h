// PyTorch's DDP communication hooks (torch.distributed.algorithms.
// ddp_comm_hooks): the built-in ways to reduce a gradient bucket, for
// DistributedDataParallel::register_comm_hook (Note [Communication hooks] in
// parallel/reducer.h).
//
//   ```cpp compile-only
//   #include "parallel/comm_hooks.h"
//   #include "parallel/distributed_data_parallel.h"
//   absl::Status Compress(ember::parallel::DistributedDataParallel& ddp) {
//     namespace hooks = ember::parallel::comm_hooks;
//     // Gradients travel as bfloat16, half the bytes:
//     //   return ddp.register_comm_hook(hooks::bf16_compress_hook());
//     // Or PowerSGD of rank 4 after 10 plain iterations:
//     EMBER_ASSIGN_OR_RETURN(auto state,
//                            hooks::PowerSGDState::create(nullptr, {.matrix_approximation_rank = 4,
//                                                                   .start_powerSGD_iter = 10}));
//     return ddp.register_comm_hook(hooks::powerSGD_hook(state));
//   }
//   ```
//
// Every hook takes the group to reduce over; null means the DDP module's own
// group (GradBucket::process_group()), where torch's None means the default
// group. Each computes what torch's hook of the same name computes, step for
// step, so that training with it gives torch's parameters:
// - allreduce_hook: divide by the world size, all_reduce SUM (what DDP does
//   without a hook).
// - fp16_compress_hook / bf16_compress_hook: the bucket cast to float16 /
//   bfloat16, divided by the world size in that dtype, all_reduced, and cast
//   back into the bucket.
// - fp16_compress_wrapper / bf16_compress_wrapper(hook): runs `hook` on a
//   float16 / bfloat16 copy of the bucket and casts its result back.
// - powerSGD_hook (Vogels et al., NeurIPS 2019, as torch implements it):
//   Note [PowerSGD] in comm_hooks.cc.
//
// Thread-safety: a hook and its state belong to one DDP module; they run on
// the thread that runs its backward.
#ifndef EMBER_PARALLEL_COMM_HOOKS_H_
#define EMBER_PARALLEL_COMM_HOOKS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>

#include "absl/status/statusor.h"
#include "distributed/process_group.h"
#include "parallel/reducer.h"
#include "tensor/tensor.h"

namespace ember::parallel::comm_hooks {

CommHook allreduce_hook(std::shared_ptr<distributed::ProcessGroup> group = nullptr);
CommHook fp16_compress_hook(std::shared_ptr<distributed::ProcessGroup> group = nullptr);
CommHook bf16_compress_hook(std::shared_ptr<distributed::ProcessGroup> group = nullptr);
CommHook fp16_compress_wrapper(CommHook hook);
CommHook bf16_compress_wrapper(CommHook hook);

// torch's PowerSGDState arguments, with its defaults.
struct PowerSGDOptions {
  // The rank r of each compressed matrix's approximation.
  int64_t matrix_approximation_rank = 1;
  // Plain allreduce_hook for this many iterations first (> 1 with error
  // feedback or warm start, as torch requires).
  int64_t start_powerSGD_iter = 1000;
  // A gradient of n x m is compressed only when (n + m) r times this is
  // below n m.
  double min_compression_rate = 2;
  // Add the previous iteration's compression error before compressing.
  bool use_error_feedback = true;
  // Start each iteration's power iteration from the previous Q (else from
  // fresh random values every iteration).
  bool warm_start = true;
  // Added to the norms in Gram-Schmidt; 0 divides a zero column by zero
  // (NaN), as torch does: set it when gradients may be all zero.
  double orthogonalization_epsilon = 0;
  // Seeds the generator that seeds each random Q (numpy's RandomState in
  // torch; the same values here).
  uint32_t random_seed = 0;
  // With TORCH_DISTRIBUTED_DEBUG=INFO or DETAIL, the compression statistics
  // go to stderr every this many iterations (torch logs them at INFO).
  int64_t compression_stats_logging_frequency = 10000;
  // Compress the bucket's same-shaped matrices as one batch.
  bool batch_tensors_with_same_shape = false;
};

class PowerSGDState {
 public:
  // InvalidArgument naming the offending option: rank < 1,
  // min_compression_rate <= 0, orthogonalization_epsilon < 0,
  // start_powerSGD_iter <= 1 with error feedback or warm start (torch's
  // ValueError), compression_stats_logging_frequency < 1.
  static absl::StatusOr<std::shared_ptr<PowerSGDState>> create(
      std::shared_ptr<distributed::ProcessGroup> group, PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  // Iterations done (counted at each last bucket).
  int64_t iter() const { return iter_; }
  // torch's compression_stats(): the ratio of elements before to after
  // compression, and both counts, summed since the first PowerSGD
  // iteration.
  struct CompressionStats {
    double compress_rate = 0;
    int64_t numel_before_compression = 0;
    int64_t numel_after_compression = 0;
  };
  CompressionStats compression_stats() const;

 private:
  friend class PowerSGD;
  PowerSGDState(std::shared_ptr<distributed::ProcessGroup> group, PowerSGDOptions options)
      : group_(std::move(group)), options_(options), rng_(options.random_seed) {}
  // numpy's RandomState(random_seed).randint(1_000_000_000).
  uint64_t NextSeed();
  void MaybeIncreaseIter(const GradBucket& bucket);

  std::shared_ptr<distributed::ProcessGroup> group_;
  PowerSGDOptions options_;
  std::mt19937 rng_;  // numpy's legacy seeding of a 32-bit seed is MT19937's
  int64_t iter_ = 0;
  int64_t next_stats_report_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
  // Per bucket index: the error feedback, and the P and Q memories.
  std::map<size_t, Tensor> error_;
  std::map<size_t, Tensor> p_memory_;
  std::map<size_t, Tensor> q_memory_;
};

CommHook powerSGD_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace ember::parallel::comm_hooks

#endif  // EMBER_PARALLEL_COMM_HOOKS_H_
