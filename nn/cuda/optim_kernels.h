// The interface between the optimizers' multi-tensor CUDA kernels
// (optim_kernels.cu, built by nvcc) and their host side (optim_kernels.cc,
// which fills nn/optim's sgd_step and adam_step slots for CUDA devices).
// Kernel-internal.
//
// Note [Multi-tensor launches]
// One launch steps many tensors: each thread block updates one chunk of
// kChunkSize elements of one tensor, found through a table passed by value
// as a kernel argument (the tensors' pointers and sizes, and for every block
// its tensor and chunk), so no launch needs a device-side buffer. A table
// holds at most kMaxBlocks blocks and kMaxTensors tensors for Adam (five
// pointers a tensor), kMaxSgdTensors for SGD (three), which keeps each under
// the 4 KiB of kernel arguments every architecture accepts; a longer list
// takes several launches. PlanMultiTensorLaunches cuts a list into launches (a tensor
// larger than one table continues in the next), on the host, where the CPU
// tests check it.
#ifndef EMBER_NN_CUDA_OPTIM_KERNELS_H_
#define EMBER_NN_CUDA_OPTIM_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::nn::cuda::kernels {

inline constexpr int kMaxTensors = 36;
inline constexpr int kMaxSgdTensors = 64;
inline constexpr int kMaxBlocks = 320;
inline constexpr int64_t kChunkSize = 65536;

// The dtypes the kernels fuse (parameter, gradient and state alike).
enum StepDtype : int { kStepFloat32, kStepFloat64, kStepFloat16, kStepBFloat16 };

// One launch: the tensors it steps (indices into the caller's lists) and,
// for each block, the tensor (an index into `tensors`) and chunk it updates.
struct LaunchPlan {
  int num_tensors = 0;
  int num_blocks = 0;
  int64_t tensors[kMaxSgdTensors] = {};
  uint8_t block_tensor[kMaxBlocks] = {};
  int32_t block_chunk[kMaxBlocks] = {};
};
static_assert(kMaxTensors <= kMaxSgdTensors && kMaxSgdTensors <= 256,
              "plans hold either table's tensors; block_tensor is a byte");

// Calls launch(plan) for each launch that steps the `n` tensors of
// `numels` elements (empty tensors are left out), at most `max_tensors`
// (kMaxTensors or kMaxSgdTensors) a launch, in order; stops at the first
// launch that returns an error and returns it.
template <typename Launch>
cudaError_t PlanMultiTensorLaunches(int64_t n, const int64_t* numels, Launch&& launch,
                                    int max_tensors = kMaxTensors) {
  LaunchPlan plan;
  int slot = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (numels[i] <= 0) continue;
    plan.tensors[slot] = i;
    plan.num_tensors = slot + 1;
    const int64_t chunks = (numels[i] + kChunkSize - 1) / kChunkSize;
    for (int64_t c = 0; c < chunks; ++c) {
      plan.block_tensor[plan.num_blocks] = static_cast<uint8_t>(slot);
      plan.block_chunk[plan.num_blocks] = static_cast<int32_t>(c);
      ++plan.num_blocks;
      const bool last_chunk = c + 1 == chunks;
      if (plan.num_blocks == kMaxBlocks || (last_chunk && slot + 1 == max_tensors)) {
        if (cudaError_t e = launch(static_cast<const LaunchPlan&>(plan)); e != cudaSuccess) return e;
        plan.num_blocks = 0;
        // A tensor cut in the middle continues as the next table's first.
        plan.tensors[0] = i;
        plan.num_tensors = last_chunk ? 0 : 1;
        slot = last_chunk ? -1 : 0;
      }
    }
    ++slot;
  }
  if (plan.num_blocks > 0) return launch(static_cast<const LaunchPlan&>(plan));
  return cudaSuccess;
}

// lr_ptr / step_ptr: float32 values in device memory the kernels read
// instead of lr and the step's bias corrections (Note [Capturable steps] in
// nn/optim/fused_kernels.h); null: the values here.
struct SgdScalars {
  const float* lr_ptr = nullptr;
  double lr = 0;
  double momentum = 0;  // 0: no buffers
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  bool first_step = false;
};

struct AdamScalars {
  const float* lr_ptr = nullptr;    // set exactly when step_ptr is
  const float* step_ptr = nullptr;
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  double step_size = 0;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1;  // sqrt(1 - beta2^t)
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled = false;
};

// Steps the n tensors of `dtype` on `stream` (the current device's): lists
// of n device pointers each, `buffers` null when s.momentum == 0. Adds the
// number of kernel launches to *launches. Returns the first launch error.
cudaError_t LaunchSgdStep(cudaStream_t stream, int dtype, int64_t n, void* const* params,
                          void* const* grads, void* const* buffers, const int64_t* numels,
                          const SgdScalars& s, int* launches);
// `max_exp_avg_sqs` null unless s.amsgrad.
cudaError_t LaunchAdamStep(cudaStream_t stream, int dtype, int64_t n, void* const* params,
                           void* const* grads, void* const* exp_avgs, void* const* exp_avg_sqs,
                           void* const* max_exp_avg_sqs, const int64_t* numels,
                           const AdamScalars& s, int* launches);

// GradScaler's unscale (nn/optim/grad_scaler_kernels.h): the n gradients of
// `dtype` multiplied in place by *inv_scale, *found_inf set to 1 when any
// value is an inf or a NaN; both are float32 device pointers. Multi-tensor
// launches as the steps', one pointer a tensor.
cudaError_t LaunchAmpUnscale(cudaStream_t stream, int dtype, int64_t n, void* const* grads,
                             const int64_t* numels, float* found_inf, const float* inv_scale,
                             int* launches);
// GradScaler's update of *scale and *growth_tracker from *found_inf, one
// thread on the device.
cudaError_t LaunchAmpUpdateScale(cudaStream_t stream, float* scale, int32_t* growth_tracker,
                                 const float* found_inf, double growth_factor,
                                 double backoff_factor, int64_t growth_interval);

// The kernel launches of every SGD and Adam step on CUDA so far, in this
// process (for tests).
int64_t StepLaunchCount();

}  // namespace ember::nn::cuda::kernels

#endif  // EMBER_NN_CUDA_OPTIM_KERNELS_H_
