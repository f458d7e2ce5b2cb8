// ShardedGradScaler: GradScaler for gradients sharded across processes
// (fully_shard / FullyShardedDataParallel), as
// torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler.
//
//   ```cpp compile-only
//   #include "parallel/sharded_grad_scaler.h"
//   // fsdp, opt and loss as in parallel/fully_sharded_data_parallel.h's example:
//   ember::parallel::ShardedGradScaler scaler(nullptr, ember::DeviceType::kCPU);
//   scaler.scale(loss).backward();
//   scaler.step(opt);  // every rank steps, or every rank skips
//   scaler.update();
//   ```
//
// Each rank holds the gradients of its own shards, so an inf or NaN may
// appear in one rank's shard only; a plain GradScaler would then skip the
// step on that rank and take it on the others, and the replicas would drift
// apart. This scaler all-reduces the found-inf flag over the process group
// (one collective per unscale_, summing every rank's flags) before the
// decision, so the ranks agree (Note [Loss scaling] in
// nn/optim/grad_scaler.h). Every rank of the group must unscale the same
// optimizers in the same order. A failed collective throws ember::Error
// naming it.
#ifndef EMBER_PARALLEL_SHARDED_GRAD_SCALER_H_
#define EMBER_PARALLEL_SHARDED_GRAD_SCALER_H_

#include <memory>
#include <vector>

#include "distributed/process_group.h"
#include "nn/optim/grad_scaler.h"

namespace ember::parallel {

class ShardedGradScaler : public nn::optim::GradScaler {
 public:
  // `process_group` null: the default group.
  explicit ShardedGradScaler(std::shared_ptr<distributed::ProcessGroup> process_group = nullptr,
                             DeviceType device_type = DeviceType::kCUDA,
                             nn::optim::GradScalerOptions options = {});

 protected:
  void reduce_found_inf(std::vector<Tensor>& found_infs, Device scale_device) override;

 private:
  std::shared_ptr<distributed::ProcessGroup> process_group_;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_SHARDED_GRAD_SCALER_H_
