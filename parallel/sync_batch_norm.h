// SyncBatchNorm: batch normalisation whose statistics cover the batches of
// every rank of a process group (torch.nn.SyncBatchNorm), and
// convert_sync_batchnorm, which puts one in place of every BatchNorm1d and
// BatchNorm2d of a model.
//
//   ```cpp compile-only
//   #include "distributed/distributed.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "nn/normalization.h"
//   #include "parallel/distributed_data_parallel.h"
//   #include "parallel/sync_batch_norm.h"
//   #include "tensor/factories.h"
//   // Every process, started by `launch --nproc_per_node=2 prog`:
//   EMBER_RETURN_IF_ERROR(ember::distributed::init_process_group({.backend = "gloo"}));
//   auto net = std::make_shared<ember::nn::Sequential>();
//   net->push_back(std::make_shared<ember::nn::Linear>(8, 16));
//   net->push_back(std::make_shared<ember::nn::BatchNorm1d>(16));
//   net->push_back(std::make_shared<ember::nn::Linear>(16, 4));
//   std::shared_ptr<ember::nn::Module> model =
//       ember::parallel::SyncBatchNorm::convert_sync_batchnorm(net);  // a Sequential, "1" synced
//   EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(model));
//   ember::Tensor y = (*ddp)(ember::randn({32, 8}));  // statistics over both ranks' 64 rows
//   // Or one layer, over the default group:
//   auto bn = std::make_shared<ember::parallel::SyncBatchNorm>(64);
//   ```
//
// In training mode over a group of two or more ranks, each SyncBatchNorm
// normalises every channel (dim 1) with the mean and biased variance of that
// channel over the whole group's batch: each rank computes its own batch's
// mean, sum of squared deviations and element count per channel, one
// all_gather brings every rank's to every rank, and each combines them
// (Chan's parallel update), so ranks may hold batches of different sizes, an
// empty one included. running_mean and running_var are updated with the
// global mean and the global unbiased variance and `momentum` (unset:
// a cumulative average over num_batches_tracked), so every rank keeps the
// same running statistics. Backward needs, per channel, the group-wide sums
// of grad_output and of grad_output * x^ (x^ the normalised input): one
// all_reduce of 2 * C values (Note [SyncBatchNorm backward] in the .cc). The
// gradients of weight and bias are this rank's own, as torch's;
// DistributedDataParallel averages them like any other.
//
// With no communication, as torch: in eval mode (it then normalises with the
// running statistics, or with the batch's own when track_running_stats is
// false), when the group has one rank, and when no group is given and no
// default group is initialised (torch.nn.SyncBatchNorm falls back to plain
// batch norm then too). Each of these gives exactly BatchNorm's results.
//
// The group: the one given to the constructor or to convert_sync_batchnorm,
// else the default group (distributed::init_process_group) at the time of
// each forward, as torch's WORLD. Every rank must run the same sequence of
// SyncBatchNorm forwards and backwards in training mode, as with any
// collective; the forward blocks for its all_gather and backward for its
// all_reduce, each up to the group's timeout.
//
// Devices: the statistics and both collectives stay on the input's device
// (a CUDA tensor over nccl, or gloo, which stages device tensors), behind the
// work already queued there; the layer's own arithmetic is tensor ops and
// nn's batch_norm kernels of that device.
//
// convert_sync_batchnorm(module, process_group) returns `module` with every
// BatchNorm1d, BatchNorm2d and SyncBatchNorm beneath it replaced by a
// SyncBatchNorm with its options, its training flag and the very same
// parameter and buffer tensors (so state_dict() keys and values, and an
// optimizer made before, are unchanged), as torch's; a module that is such a
// layer itself comes back as a new SyncBatchNorm. A parent must let its
// child be replaced (Note [Replacing a child] in nn/module.h): ResNet18 and
// modules that read their children through child() do; a Sequential, which
// keeps its own list of children and refuses, is rebuilt: a new Sequential
// with its hooks and training flag holding the same children, the converted
// ones in their places, takes its place (Note [Converting inside a
// Sequential] in the .cc). Any other parent that refuses (nn::models'
// BasicBlock) is an error naming the layer and that parent, and the model is
// left as it was.
//
// Limits: not differentiable twice (create_graph in backward throws, as
// torch's kernels have no derivative); one process group per layer; no
// channels-last layout of its own (the input is read as [N, C, *]). The
// collectives block and a group runs its ops in order, so under
// DistributedDataParallel over the same group a backward all_reduce waits for
// the gradient buckets queued before it; a group of its own (new_group())
// keeps the two apart.
//
// Errors: tensor math behind Module::operator(), so failures throw
// ember::Error (tensor/error.h), as BatchNorm's do: an input with fewer than
// 2 dims ("expected at least 2D input (got 1D input)", torch's words), no
// channels, a channel count other than num_features (both named), a weight
// or bias of another dtype than the input, parameters or running statistics
// on another device, and a failed collective, with the group's message and code (a dead peer or the
// group's timeout). The input is checked before any communication: a mistake every rank makes fails
// on every rank at once, while a rank that fails alone leaves the others waiting until the group's
// timeout, as with any collective.
//
// Thread-safety: as Module (nn/module.h): one forward (and its backward) at
// a time; training-mode forward writes the running buffers.
#ifndef EMBER_PARALLEL_SYNC_BATCH_NORM_H_
#define EMBER_PARALLEL_SYNC_BATCH_NORM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "distributed/process_group.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "tensor/tensor.h"

namespace ember::parallel {

class SyncBatchNorm : public nn::Cloneable<SyncBatchNorm, nn::BatchNormBase> {
 public:
  // torch's SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
  // track_running_stats=True, process_group=None): the options are
  // BatchNorm's; a null `process_group` means the default group.
  explicit SyncBatchNorm(nn::BatchNormOptions options,
                         std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);
  explicit SyncBatchNorm(int64_t num_features,
                         std::shared_ptr<distributed::ProcessGroup> process_group = nullptr)
      : SyncBatchNorm(nn::BatchNormOptions{num_features}, std::move(process_group)) {}

  void reset() override { RegisterState(); }
  // input [N, C, *] (any rank of 2 or more, as torch's).
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "SyncBatchNorm"; }

  // The group given at construction (null: the default group at forward).
  const std::shared_ptr<distributed::ProcessGroup>& process_group() const { return process_group_; }

  // torch.nn.SyncBatchNorm.convert_sync_batchnorm (see above). Use the
  // returned module: it is `module` itself unless `module` is a batch norm
  // layer or a Sequential that held one. Throws ember::Error for a null
  // module and for a parent that does not allow the replacement (nothing is
  // changed then).
  static std::shared_ptr<nn::Module> convert_sync_batchnorm(
      std::shared_ptr<nn::Module> module,
      std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);

 protected:
  void CheckInputDim(const Tensor& input) const override;

 private:
  // A SyncBatchNorm holding `source`'s options, training flag and tensors.
  SyncBatchNorm(const nn::BatchNormBase& source,
                std::shared_ptr<distributed::ProcessGroup> process_group);

  // The group this forward synchronises over, or null for none.
  std::shared_ptr<distributed::ProcessGroup> GroupForForward() const;

  std::shared_ptr<distributed::ProcessGroup> process_group_;
};

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_SYNC_BATCH_NORM_H_
