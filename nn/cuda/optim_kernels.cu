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

#include <cstdint>

#include "cuda/loops.cuh"
#include "nn/cuda/optim_kernels.h"

namespace ember::nn::cuda::kernels {
namespace {

constexpr int kThreads = 512;

// The tensors a table of N pointers a tensor holds: SGD's three, Adam's five.
template <int N>
inline constexpr int kTableTensors = N <= 3 ? kMaxSgdTensors : kMaxTensors;

// A launch's table: N pointers a tensor (parameter, gradient, states).
template <int N>
struct TensorTable {
  void* ptrs[N][kTableTensors<N>];
  int64_t numels[kTableTensors<N>];
  uint8_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
};
static_assert(sizeof(TensorTable<5>) + sizeof(AdamScalars) <= 4000,
              "a launch's arguments must stay within 4 KiB");
static_assert(sizeof(TensorTable<3>) + sizeof(SgdScalars) <= 4000,
              "a launch's arguments must stay within 4 KiB");

// The arithmetic type of an element type (float for the 16-bit floats).
using ::ember::cuda::kernels::Math;

// Operand k's element of x in the arithmetic type.
template <typename T, int N>
__device__ __forceinline__ Math<T> Load(const T (&x)[N], int k) {
  return static_cast<Math<T>>(x[k]);
}
// Sets operand k's element to v rounded to T (the value computed with stays
// unrounded).
template <typename T, int N>
__device__ __forceinline__ void Store(T (&x)[N], int k, Math<T> v) {
  x[k] = static_cast<T>(v);
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

// Note [Vectorized optimizer steps]
// An update is memory bound, and what bounds it is the bytes each thread has
// in flight: one element of each operand a round trip (2 bytes for the
// 16-bit dtypes) left an H200 at a third of its bandwidth. So a block streams
// its chunk in 16-byte vectors: each thread loads one vector of every operand
// (the parameter, the gradient, the states), runs op(x) on each of its
// elements in turn (x[k] holding operand k's element, updated in place in
// registers), and stores back the vectors of the operands in `written`.
// Vectors need every operand's chunk to start 16-byte aligned: parameters
// from the caching allocator do, at every chunk (kChunkSize is a multiple of
// 16 / sizeof(T)); a view at another offset may not, and its chunks go one
// element at a time, as do the last (end - begin) % (16 / sizeof(T))
// elements of a chunk. op is the same per-element function on both paths, so
// an element's result does not depend on the path.
template <typename T>
inline constexpr int kVec = ::ember::cuda::kernels::VecOf<T>();  // 16 bytes of T
static_assert(kChunkSize % 16 == 0, "chunks of every dtype start 16-byte aligned");

// One 16-byte vector of T (loops.cuh's chunk of kVec<T> elements).
template <typename T>
using Vec = ::ember::cuda::kernels::Chunk<T, kVec<T>>;

// Steps elements [begin, end) of operands ptrs[0..used-1]; those whose bit is
// set in `written` are stored back (Note [Vectorized optimizer steps]).
template <typename T, int N, typename Op>
__device__ __forceinline__ void StepChunk(T* const* ptrs, int used, unsigned written, int64_t begin,
                                          int64_t end, const Op& op) {
  bool aligned = true;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < used) aligned &= reinterpret_cast<uintptr_t>(ptrs[k] + begin) % 16 == 0;
  }
  int64_t scalar_begin = begin;
  if (aligned) {
    const int64_t vectors = (end - begin) / kVec<T>;
    for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
      Vec<T> x[N];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (k < used) x[k] = reinterpret_cast<const Vec<T>*>(ptrs[k] + begin)[v];
      }
#pragma unroll
      for (int e = 0; e < kVec<T>; ++e) {
        T element[N];
#pragma unroll
        for (int k = 0; k < N; ++k) element[k] = x[k].v[e];
        op(element);
#pragma unroll
        for (int k = 0; k < N; ++k) x[k].v[e] = element[k];
      }
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (k < used && (written >> k & 1u)) reinterpret_cast<Vec<T>*>(ptrs[k] + begin)[v] = x[k];
      }
    }
    scalar_begin = begin + vectors * kVec<T>;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) {
    T element[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (k < used) element[k] = ptrs[k][i];
    }
    op(element);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (k < used && (written >> k & 1u)) ptrs[k][i] = element[k];
    }
  }
}

// Operands: parameter, gradient, momentum buffer (when kMomentum).
template <typename T, bool kMomentum>
struct SgdOp {
  using M = Math<T>;
  M lr, wd, momentum, keep, sign;
  bool first_step, nesterov;
  explicit __device__ SgdOp(const SgdScalars& s)
      : lr(static_cast<M>(s.lr_ptr != nullptr ? static_cast<double>(*s.lr_ptr) : s.lr)),
        wd(static_cast<M>(s.weight_decay)),
        momentum(static_cast<M>(s.momentum)),
        keep(static_cast<M>(1.0 - s.dampening)),
        sign(s.maximize ? M(-1) : M(1)),
        first_step(s.first_step),
        nesterov(s.nesterov) {}
  __device__ __forceinline__ void operator()(T (&x)[3]) const {
    const M pi = Load(x, 0);
    M d = sign * Load(x, 1);
    if (wd != M(0)) d += wd * pi;
    if constexpr (kMomentum) {
      const M b = first_step ? d : momentum * Load(x, 2) + keep * d;
      Store(x, 2, b);
      d = nesterov ? d + momentum * b : b;
    }
    Store(x, 0, pi - lr * d);
  }
};

template <typename T, bool kMomentum>
__global__ void __launch_bounds__(kThreads) SgdKernel(TensorTable<3> table, SgdScalars s) {
  int64_t begin, end;
  const int t = BlockRange(table, begin, end);
  T* const ptrs[3] = {static_cast<T*>(table.ptrs[0][t]), static_cast<T*>(table.ptrs[1][t]),
                      static_cast<T*>(table.ptrs[2][t])};
  const SgdOp<T, kMomentum> op(s);
  StepChunk<T, 3>(ptrs, kMomentum ? 3 : 2, kMomentum ? 0b101u : 0b001u, begin, end, op);
}

// Operands: parameter, gradient, first and second moments, and the maximum
// of the second moments (when kAmsgrad).
template <typename T, bool kAmsgrad>
struct AdamOp {
  using M = Math<T>;
  M beta1, beta2, one_minus_beta1, one_minus_beta2, wd, decay, eps, step_size, bc2_sqrt;
  bool maximize, decoupled;
  explicit __device__ AdamOp(const AdamScalars& s)
      : beta1(static_cast<M>(s.beta1)),
        beta2(static_cast<M>(s.beta2)),
        one_minus_beta1(static_cast<M>(1.0 - s.beta1)),
        one_minus_beta2(static_cast<M>(1.0 - s.beta2)),
        wd(static_cast<M>(s.weight_decay)),
        decay(static_cast<M>(1.0 - s.lr * s.weight_decay)),
        eps(static_cast<M>(s.eps)),
        step_size(static_cast<M>(s.step_size)),
        bc2_sqrt(static_cast<M>(s.bias_correction2_sqrt)),
        maximize(s.maximize),
        decoupled(s.decoupled) {
    if (s.step_ptr != nullptr) {  // Note [Capturable steps]: lr_ptr is set too
      const double lr = static_cast<double>(*s.lr_ptr);
      const double t = static_cast<double>(*s.step_ptr);
      decay = static_cast<M>(1.0 - lr * s.weight_decay);
      step_size = static_cast<M>(lr / (1.0 - pow(s.beta1, t)));
      bc2_sqrt = static_cast<M>(sqrt(1.0 - pow(s.beta2, t)));
    }
  }
  __device__ __forceinline__ void operator()(T (&x)[5]) const {
    M pi = Load(x, 0);
    M gi = Load(x, 1);
    if (maximize) gi = -gi;
    if (wd != M(0)) {
      if (decoupled) {
        pi *= decay;
      } else {
        gi += wd * pi;
      }
    }
    const M mi = beta1 * Load(x, 2) + one_minus_beta1 * gi;
    Store(x, 2, mi);
    M second = beta2 * Load(x, 3) + one_minus_beta2 * (gi * gi);
    Store(x, 3, second);
    if constexpr (kAmsgrad) {
      const M previous = Load(x, 4);
      second = previous > second ? previous : second;
      Store(x, 4, second);
    }
    const M denom = Sqrt(second) / bc2_sqrt + eps;
    Store(x, 0, pi - step_size * (mi / denom));
  }
};

template <typename T, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads) AdamKernel(TensorTable<5> table, AdamScalars s) {
  int64_t begin, end;
  const int t = BlockRange(table, begin, end);
  T* ptrs[5];
#pragma unroll
  for (int k = 0; k < 5; ++k) ptrs[k] = static_cast<T*>(table.ptrs[k][t]);
  const AdamOp<T, kAmsgrad> op(s);
  StepChunk<T, 5>(ptrs, kAmsgrad ? 5 : 4, kAmsgrad ? 0b11101u : 0b01101u, begin, end, op);
}

// GradScaler's unscale of one chunk of one gradient: the check reads the
// value before the multiply, as torch's _amp_foreach_non_finite_check_and_
// unscale_ does; a block with a non-finite value sets the flag (any thread
// may, all write the same 1).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    AmpUnscaleKernel(TensorTable<1> table, float* found_inf, const float* inv_scale) {
  int64_t begin, end;
  const int t = BlockRange(table, begin, end);
  T* const ptrs[1] = {static_cast<T*>(table.ptrs[0][t])};
  const Math<T> inv = static_cast<Math<T>>(*inv_scale);
  bool bad = false;
  StepChunk<T, 1>(ptrs, 1, 0b1u, begin, end, [&](T (&x)[1]) {
    const Math<T> v = Load(x, 0);
    bad |= !isfinite(v);
    Store(x, 0, v * inv);
  });
  if (bad) *found_inf = 1.0f;
}

__global__ void AmpUpdateScaleKernel(float* scale, int32_t* growth_tracker, const float* found_inf,
                                     double growth_factor, double backoff_factor,
                                     int64_t growth_interval) {
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(*scale * backoff_factor);
    *growth_tracker = 0;
    return;
  }
  const int32_t successful = *growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(*scale * growth_factor);
    if (isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  } else {
    *growth_tracker = successful;
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
    return PlanMultiTensorLaunches(
        n, numels,
        [&](const LaunchPlan& plan) {
          const TensorTable<3> table = TableOf<3>(plan, lists, numels);
          if (momentum) {
            SgdKernel<T, true><<<plan.num_blocks, kThreads, 0, stream>>>(table, s);
          } else {
            SgdKernel<T, false><<<plan.num_blocks, kThreads, 0, stream>>>(table, s);
          }
          ++*launches;
          return cudaGetLastError();
        },
        kTableTensors<3>);
  });
}

cudaError_t LaunchAdamStep(cudaStream_t stream, int dtype, int64_t n, void* const* params,
                           void* const* grads, void* const* exp_avgs, void* const* exp_avg_sqs,
                           void* const* max_exp_avg_sqs, const int64_t* numels,
                           const AdamScalars& s, int* launches) {
  void* const* const lists[5] = {params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs};
  return VisitStepDtype(dtype, [&]<typename T>() {
    return PlanMultiTensorLaunches(n, numels, [&](const LaunchPlan& plan) {
      static_assert(kTableTensors<5> == kMaxTensors, "the plan's default");
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

cudaError_t LaunchAmpUnscale(cudaStream_t stream, int dtype, int64_t n, void* const* grads,
                             const int64_t* numels, float* found_inf, const float* inv_scale,
                             int* launches) {
  void* const* const lists[1] = {grads};
  return VisitStepDtype(dtype, [&]<typename T>() {
    return PlanMultiTensorLaunches(
        n, numels,
        [&](const LaunchPlan& plan) {
          const TensorTable<1> table = TableOf<1>(plan, lists, numels);
          AmpUnscaleKernel<T><<<plan.num_blocks, kThreads, 0, stream>>>(table, found_inf,
                                                                         inv_scale);
          ++*launches;
          return cudaGetLastError();
        },
        kTableTensors<1>);
  });
}

cudaError_t LaunchAmpUpdateScale(cudaStream_t stream, float* scale, int32_t* growth_tracker,
                                 const float* found_inf, double growth_factor,
                                 double backoff_factor, int64_t growth_interval) {
  AmpUpdateScaleKernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf, growth_factor,
                                            backoff_factor, growth_interval);
  return cudaGetLastError();
}

}  // namespace ember::nn::cuda::kernels
