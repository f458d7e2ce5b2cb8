// Device side of the optimizers' steps: SGD and Adam(W) over lists of
// tensors, every elementwise operation of an update fused into one pass, many
// tensors a launch (Note [Multi-tensor launches] in optim_kernels.h). The
// formulas are nn/optim's (sgd.h, adam.h), computed in float for the 16-bit
// dtypes and in the tensor's dtype otherwise (Note [16-bit optimizer math] in
// nn/optim/fused_kernels.cc): an element's parameter, gradient and states are
// read once, the whole update runs on those values, and each result is
// rounded once, as it is stored; no value is read back rounded within a step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/loops.cuh"
#include "nn/cuda/optim_kernels.h"

namespace ember::nn::cuda::kernels {
namespace {

constexpr int kThreads = 512;

// A launch's table: N pointers a tensor (parameter, gradient, states).
template <int N>
struct TensorTable {
  void* ptrs[N][kMaxTensors];
  int64_t numels[kMaxTensors];
  uint8_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
};
static_assert(sizeof(TensorTable<5>) + sizeof(AdamScalars) <= 4000,
              "a launch's arguments must stay within 4 KiB");

// The arithmetic type of an element type (float for the 16-bit floats).
using ::ember::cuda::kernels::Math;

template <typename T>
__device__ __forceinline__ Math<T> Load(const T* p, int64_t i) {
  return static_cast<Math<T>>(p[i]);
}
// Stores v rounded to T (the value computed with stays unrounded).
template <typename T>
__device__ __forceinline__ void Store(T* p, int64_t i, Math<T> v) {
  p[i] = static_cast<T>(v);
}

__device__ __forceinline__ float Sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double Sqrt(double x) { return sqrt(x); }

// The range of elements of this block's chunk, and its tensor's slot.
template <int N>
__device__ __forceinline__ int BlockRange(const TensorTable<N>& table, int64_t& begin,
                                          int64_t& end) {
  const int t = table.block_tensor[blockIdx.x];
  begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunkSize;
  end = begin + kChunkSize < table.numels[t] ? begin + kChunkSize : table.numels[t];
  return t;
}

template <typename T, bool kMomentum>
__global__ void __launch_bounds__(kThreads) SgdKernel(TensorTable<3> table, SgdScalars s) {
  using M = Math<T>;
  int64_t begin, end;
  const int t = BlockRange(table, begin, end);
  T* p = static_cast<T*>(table.ptrs[0][t]);
  const T* g = static_cast<const T*>(table.ptrs[1][t]);
  T* buf = static_cast<T*>(table.ptrs[2][t]);
  const M lr = static_cast<M>(s.lr), wd = static_cast<M>(s.weight_decay);
  const M momentum = static_cast<M>(s.momentum), keep = static_cast<M>(1.0 - s.dampening);
  const M sign = s.maximize ? M(-1) : M(1);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const M pi = Load(p, i);
    M d = sign * Load(g, i);
    if (wd != M(0)) d += wd * pi;
    if constexpr (kMomentum) {
      const M b = s.first_step ? d : momentum * Load(buf, i) + keep * d;
      Store(buf, i, b);
      d = s.nesterov ? d + momentum * b : b;
    }
    Store(p, i, pi - lr * d);
  }
}

template <typename T, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads) AdamKernel(TensorTable<5> table, AdamScalars s) {
  using M = Math<T>;
  int64_t begin, end;
  const int t = BlockRange(table, begin, end);
  T* p = static_cast<T*>(table.ptrs[0][t]);
  const T* g = static_cast<const T*>(table.ptrs[1][t]);
  T* m = static_cast<T*>(table.ptrs[2][t]);
  T* v = static_cast<T*>(table.ptrs[3][t]);
  T* vmax = static_cast<T*>(table.ptrs[4][t]);
  const M beta1 = static_cast<M>(s.beta1), beta2 = static_cast<M>(s.beta2);
  const M one_minus_beta1 = static_cast<M>(1.0 - s.beta1);
  const M one_minus_beta2 = static_cast<M>(1.0 - s.beta2);
  const M wd = static_cast<M>(s.weight_decay), decay = static_cast<M>(1.0 - s.lr * s.weight_decay);
  const M eps = static_cast<M>(s.eps), step_size = static_cast<M>(s.step_size);
  const M bc2_sqrt = static_cast<M>(s.bias_correction2_sqrt);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    M pi = Load(p, i);
    M gi = Load(g, i);
    if (s.maximize) gi = -gi;
    if (wd != M(0)) {
      if (s.decoupled) {
        pi *= decay;
      } else {
        gi += wd * pi;
      }
    }
    const M mi = beta1 * Load(m, i) + one_minus_beta1 * gi;
    Store(m, i, mi);
    M second = beta2 * Load(v, i) + one_minus_beta2 * (gi * gi);
    Store(v, i, second);
    if constexpr (kAmsgrad) {
      const M previous = Load(vmax, i);
      second = previous > second ? previous : second;
      Store(vmax, i, second);
    }
    const M denom = Sqrt(second) / bc2_sqrt + eps;
    Store(p, i, pi - step_size * (mi / denom));
  }
}

// The table of one launch from the caller's N lists (null lists give null
// pointers).
template <int N>
TensorTable<N> TableOf(const LaunchPlan& plan, void* const* const (&lists)[N],
                       const int64_t* numels) {
  TensorTable<N> table;
  for (int k = 0; k < plan.num_tensors; ++k) {
    const int64_t i = plan.tensors[k];
    for (int l = 0; l < N; ++l) table.ptrs[l][k] = lists[l] == nullptr ? nullptr : lists[l][i];
    table.numels[k] = numels[i];
  }
  for (int b = 0; b < plan.num_blocks; ++b) {
    table.block_tensor[b] = plan.block_tensor[b];
    table.block_chunk[b] = plan.block_chunk[b];
  }
  return table;
}

// Calls f.template operator()<T>() for the dtype's element type.
template <typename F>
cudaError_t VisitStepDtype(int dtype, F&& f) {
  switch (dtype) {
    case kStepFloat32:
      return f.template operator()<float>();
    case kStepFloat64:
      return f.template operator()<double>();
    case kStepFloat16:
      return f.template operator()<__half>();
    case kStepBFloat16:
      return f.template operator()<__nv_bfloat16>();
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchSgdStep(cudaStream_t stream, int dtype, int64_t n, void* const* params,
                          void* const* grads, void* const* buffers, const int64_t* numels,
                          const SgdScalars& s, int* launches) {
  void* const* const lists[3] = {params, grads, buffers};
  const bool momentum = s.momentum != 0.0;
  return VisitStepDtype(dtype, [&]<typename T>() {
    return PlanMultiTensorLaunches(n, numels, [&](const LaunchPlan& plan) {
      const TensorTable<3> table = TableOf<3>(plan, lists, numels);
      if (momentum) {
        SgdKernel<T, true><<<plan.num_blocks, kThreads, 0, stream>>>(table, s);
      } else {
        SgdKernel<T, false><<<plan.num_blocks, kThreads, 0, stream>>>(table, s);
      }
      ++*launches;
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchAdamStep(cudaStream_t stream, int dtype, int64_t n, void* const* params,
                           void* const* grads, void* const* exp_avgs, void* const* exp_avg_sqs,
                           void* const* max_exp_avg_sqs, const int64_t* numels,
                           const AdamScalars& s, int* launches) {
  void* const* const lists[5] = {params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs};
  return VisitStepDtype(dtype, [&]<typename T>() {
    return PlanMultiTensorLaunches(n, numels, [&](const LaunchPlan& plan) {
      const TensorTable<5> table = TableOf<5>(plan, lists, numels);
      if (s.amsgrad) {
        AdamKernel<T, true><<<plan.num_blocks, kThreads, 0, stream>>>(table, s);
      } else {
        AdamKernel<T, false><<<plan.num_blocks, kThreads, 0, stream>>>(table, s);
      }
      ++*launches;
      return cudaGetLastError();
    });
  });
}

}  // namespace ember::nn::cuda::kernels
