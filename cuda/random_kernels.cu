// Device side of uniform_out, normal_out, random_out and bernoulli_out:
// cuRAND's Philox4x32-10 device API, one Philox block per element group
// (Note [Philox element groups] in random_kernels.h).
#include <curand_kernel.h>

#include "cuda/loops.cuh"
#include "cuda/random_kernels.h"

namespace ember::cuda::kernels {
namespace {

__device__ __forceinline__ uint64_t Join(unsigned hi, unsigned lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Writes v (computed in M) to out[i] as T. A uniform value that rounds to the
// upper bound in T becomes the lower one, keeping [from, to) half-open (as
// PyTorch's uniform_ does for reduced precision).
template <typename T, typename M>
__device__ __forceinline__ void StoreUniform(T* out, int64_t i, M v, const RandomParams& p) {
  const T t = Cast<T>(v);
  out[i] = static_cast<double>(static_cast<Math<T>>(t)) == p.b ? Cast<T>(p.a) : t;
}

// Maps cuRAND's (0, 1] to [0, 1).
template <typename M>
__device__ __forceinline__ M HalfOpen(M u) {
  return u == M(1) ? M(0) : u;
}

template <typename T>
__global__ void RandomKernel(T* out, int64_t n, uint64_t seed, uint64_t offset, RandomParams p,
                             int per_group, const uint64_t* captured_state) {
  using M = Math<T>;
  if (captured_state != nullptr) {  // Note [Random numbers under capture]
    seed = captured_state[0];
    offset += captured_state[1];
  }
  const int64_t groups = (n + per_group - 1) / per_group;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += step) {
    curandStatePhilox4_32_10_t state;
    curand_init(seed, static_cast<unsigned long long>(g), offset, &state);
    const int64_t base = g * per_group;
    const int count = n - base < per_group ? static_cast<int>(n - base) : per_group;
    switch (p.distribution) {
      case kUniformDistribution: {
        if constexpr (std::is_same_v<M, double>) {
          const double2 u = curand_uniform2_double(&state);
          const double r = p.b - p.a;
          const double v[2] = {p.a + r * HalfOpen(u.x), p.a + r * HalfOpen(u.y)};
          for (int k = 0; k < count; ++k) StoreUniform(out, base + k, v[k], p);
        } else if constexpr (kIsFloat<T>) {
          const float4 u = curand_uniform4(&state);
          const float a = static_cast<float>(p.a), r = static_cast<float>(p.b - p.a);
          const float v[4] = {a + r * HalfOpen(u.x), a + r * HalfOpen(u.y), a + r * HalfOpen(u.z),
                              a + r * HalfOpen(u.w)};
          for (int k = 0; k < count; ++k) StoreUniform(out, base + k, v[k], p);
        }
        break;
      }
      case kNormalDistribution: {
        if constexpr (std::is_same_v<M, double>) {
          const double2 z = curand_normal2_double(&state);
          const double v[2] = {p.a + p.b * z.x, p.a + p.b * z.y};
          for (int k = 0; k < count; ++k) out[base + k] = v[k];
        } else if constexpr (kIsFloat<T>) {
          const float4 z = curand_normal4(&state);
          const float a = static_cast<float>(p.a), b = static_cast<float>(p.b);
          const float v[4] = {a + b * z.x, a + b * z.y, a + b * z.z, a + b * z.w};
          for (int k = 0; k < count; ++k) out[base + k] = Cast<T>(v[k]);
        }
        break;
      }
      case kIntegerDistribution: {
        const uint4 r = curand4(&state);
        if (per_group == 4) {
          const unsigned x[4] = {r.x, r.y, r.z, r.w};
          for (int k = 0; k < count; ++k) {
            out[base + k] = Cast<T>(p.low + static_cast<int64_t>(x[k] % p.range));
          }
        } else {
          const uint64_t x[2] = {Join(r.x, r.y), Join(r.z, r.w)};
          for (int k = 0; k < count; ++k) {
            out[base + k] = Cast<T>(p.low + static_cast<int64_t>(x[k] % p.range));
          }
        }
        break;
      }
      default: {  // kBernoulliDistribution
        const uint4 r = curand4(&state);
        const unsigned x[4] = {r.x, r.y, r.z, r.w};
        for (int k = 0; k < count; ++k) {
          // u = (x + 1/2) / 2^32 exactly, in (0, 1): p = 0 never, p = 1 always.
          const double u = (static_cast<double>(x[k]) + 0.5) * (1.0 / 4294967296.0);
          out[base + k] = Cast<T>(u < p.a ? 1 : 0);
        }
        break;
      }
    }
  }
}

}  // namespace

int ElementsPerGroup(int dtype, const RandomParams& p) {
  switch (p.distribution) {
    case kUniformDistribution:
    case kNormalDistribution:
      return dtype == kF64 ? 2 : 4;
    case kIntegerDistribution:
      return p.range > (uint64_t{1} << 32) ? 2 : 4;
    default:
      return 4;
  }
}

cudaError_t LaunchRandom(cudaStream_t stream, char* out, int dtype, int64_t n, uint64_t seed,
                         uint64_t offset, const RandomParams& p, const uint64_t* captured_state) {
  if (n == 0) return cudaSuccess;
  const int per_group = ElementsPerGroup(dtype, p);
  const int64_t groups = (n + per_group - 1) / per_group;
  VisitCode(dtype, [&]<typename T>() {
    RandomKernel<T><<<GridFor(groups), kThreads, 0, stream>>>(
        reinterpret_cast<T*>(out), n, seed, offset, p, per_group, captured_state);
  });
  return cudaGetLastError();
}

}  // namespace ember::cuda::kernels
