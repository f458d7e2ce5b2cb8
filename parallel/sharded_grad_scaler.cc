#include "parallel/sharded_grad_scaler.h"

#include <utility>

#include "distributed/distributed.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::parallel {

ShardedGradScaler::ShardedGradScaler(std::shared_ptr<distributed::ProcessGroup> process_group,
                                     DeviceType device_type, nn::optim::GradScalerOptions options)
    : GradScaler(device_type, options), process_group_(std::move(process_group)) {}

void ShardedGradScaler::reduce_found_inf(std::vector<Tensor>& found_infs, Device scale_device) {
  std::shared_ptr<distributed::ProcessGroup> group = process_group_;
  if (group == nullptr) {
    absl::StatusOr<distributed::Group> world = distributed::get_default_group();
    EMBER_CHECK(world.ok(), "ShardedGradScaler: no process group given and no default one: ",
                world.status().message(), "; call init_process_group first");
    group = *world;
  }
  // One flag, on the scale's device (the backend's), whatever devices this
  // rank's gradients are on: the same single collective on every rank.
  Tensor flag = zeros({1}, TensorOptions().dtype(kFloat32).device(scale_device));
  for (const Tensor& f : found_infs) flag.add_(f.to(scale_device));
  absl::StatusOr<std::shared_ptr<distributed::Work>> work =
      group->allreduce(flag, {.op = distributed::ReduceOp::kSum});
  absl::Status done = work.ok() ? (*work)->wait() : work.status();
  EMBER_CHECK(done.ok(), "ShardedGradScaler: the all-reduce of the found-inf flag failed: ",
              done.message());
  found_infs = {flag};
}

}  // namespace ember::parallel
