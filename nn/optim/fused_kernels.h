// The optimizers' per-device step kernels (private to nn/optim and the
// libraries that implement them for a device, e.g. nn/cuda/).
//
// Note [Fused optimizer steps]
// SGD::step() and Adam(W)::step() do not update one parameter at a time.
// They gather the parameters that have a gradient into lists that share a
// device, a dtype and every scalar of the update (the group's options, the
// step count, whether the momentum buffer is new), and hand each list to the
// kernel slot of its device (Note [nn device kernels] in
// nn/device_kernels.h). A device's kernel steps the whole list at once: on
// CUDA (nn/cuda/optim_kernels.cu) a few multi-tensor launches over chunked
// lists of pointers, each thread block updating one chunk of one tensor with
// every elementwise operation of the update fused, so a ResNet's 62
// parameters cost one or two launches rather than a dozen per parameter. The
// CPU kernel is the loop it always was: one fused pass per contiguous
// float32/float64 tensor, tensor ops for anything else.
//
// The lists are parallel (params[i], grads[i], states[i] belong together)
// and every tensor is on params[0]'s device. A kernel writes the parameters
// and states in place and bumps their versions; a state list is either empty
// (the update has no such state) or as long as params. A first SGD step with
// momentum finds its buffers allocated but unset and sets them to the
// gradient (PyTorch's `buf = d.clone()`). A kernel may step a tensor it
// cannot fuse (non-contiguous, a dtype it lacks) through
// SgdStepWithTensorOps / AdamStepWithTensorOps, which compute the same
// formulas with tensor ops on any device.
#ifndef EMBER_NN_OPTIM_FUSED_KERNELS_H_
#define EMBER_NN_OPTIM_FUSED_KERNELS_H_

#include <cstdint>
#include <vector>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::optim::internal {

// Note [Capturable steps]
// A step captured into a CUDA graph (cuda/graphs.h) replays the kernels it
// launched with the arguments they had: a learning rate or an Adam step count
// passed by value would stay the capture's. So with `capturable` options the
// optimizers pass them as tensors instead: lr_tensor, float32 [1] on the
// parameters' device (OptimizerBase::lr_tensor, refilled by set_lr: a
// scheduler between replays reaches the graph), and Adam's step_tensor, the
// state's float32 [1] count that the step itself increments on the device.
// The kernels read them from memory when they run (the CUDA kernels through
// pointers, the tensor-op formulas as tensors, the CPU kernels once per
// call); lr and step then only describe the host's view. Take one step
// before capturing: it makes the state, whose creation is not captured.

// The scalars of one SGD update (sgd.h's formulas).
struct SgdStepArgs {
  Tensor lr_tensor;  // Note [Capturable steps]; undefined: lr
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  bool first_step = false;  // the momentum buffers are new: set them to d
};

// The scalars of one Adam / AdamW update (adam.h's formulas).
struct AdamStepArgs {
  Tensor lr_tensor;    // Note [Capturable steps]; undefined: lr
  Tensor step_tensor;  // the count after this step; undefined: step
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled = false;  // AdamW's weight decay
  int64_t step = 1;        // the step count after this step (bias corrections)
};

// momentum_buffers: empty when args.momentum == 0.
using SgdStepFn = void(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& momentum_buffers, const SgdStepArgs& args);
// max_exp_avg_sqs: empty unless args.amsgrad.
using AdamStepFn = void(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                        const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepArgs& args);

extern constinit ::ember::nn::internal::DeviceKernel<SgdStepFn> sgd_step;
extern constinit ::ember::nn::internal::DeviceKernel<AdamStepFn> adam_step;

// Parameter i of the lists through tensor ops (any device, dtype, layout).
void SgdStepWithTensorOps(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                          const SgdStepArgs& args);
void AdamStepWithTensorOps(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq,
                           const AdamStepArgs& args);

// Throws unless the lists are parallel (the state lists empty or as long as
// params) and every tensor is on params[0]'s device; names `op`.
void CheckStepLists(const char* op, const std::vector<Tensor>& params,
                    std::initializer_list<const std::vector<Tensor>*> others);

}  // namespace ember::nn::optim::internal

#endif  // EMBER_NN_OPTIM_FUSED_KERNELS_H_
