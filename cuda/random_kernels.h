// The interface between the random-number kernels (random_kernels.cu, built
// by nvcc) and their host side (random_kernels.cc, which registers them as
// the kCUDA kernels of uniform_out, normal_out, random_out and
// bernoulli_out). Kernel-internal.
//
// Note [Philox element groups]
// Each kernel fills a contiguous buffer of n elements in groups: group g is
// Philox4x32-10 subsequence g of the generator's seed, started at the
// generator's offset (curand_init(seed, g, offset)), and draws exactly one
// Philox block, four 32-bit values (curand4 / curand_uniform4 /
// curand_normal4 / curand_uniform2_double / curand_normal2_double). A group
// holds kElementsPerGroup elements (4), or 2 where each element needs 64
// random bits (float64, integer ranges above 2^32). So every launch moves
// the generator's offset on by 4 (kOffsetIncrement), whatever n is, and an
// element's value depends only on the seed, the offset and its index, not
// on the grid.
#ifndef EMBER_CUDA_RANDOM_KERNELS_H_
#define EMBER_CUDA_RANDOM_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::cuda::kernels {

// What a kernel launch consumes of the generator's Philox offset.
inline constexpr uint64_t kOffsetIncrement = 4;

enum RandomDistribution : int {
  kUniformDistribution,    // a + (b - a) * u, u uniform in [0, 1)
  kNormalDistribution,     // a + b * z, z standard normal
  kIntegerDistribution,    // low + x mod range, x 32 or 64 random bits
  kBernoulliDistribution,  // 1 when u < a, else 0
};

struct RandomParams {
  int distribution = kUniformDistribution;
  double a = 0;
  double b = 1;
  int64_t low = 0;     // kIntegerDistribution
  uint64_t range = 1;  // kIntegerDistribution: high - low, >= 1
};

// Elements per Philox group (Note [Philox element groups]) for dtype code
// `dtype` (loops.cuh DtypeCode) and `p`.
int ElementsPerGroup(int dtype, const RandomParams& p);

// Note [Random numbers under capture]
// A kernel captured into a CUDA graph must not bake its seed and offset in:
// every replay would draw the same numbers. So while a capture is underway
// the kernel reads them from `captured_state`, two uint64s in device memory
// (the seed, and the offset the graph starts from) that each replay writes
// before it launches, and adds `offset`, its place within the graph
// (cuda/graphs.h's CapturedDraw). Otherwise captured_state is null and
// (seed, offset) are the generator's.

// Fills the n contiguous elements of dtype code `dtype` at `out` from
// Philox (seed, offset) on `stream` (the current device's).
cudaError_t LaunchRandom(cudaStream_t stream, char* out, int dtype, int64_t n, uint64_t seed,
                         uint64_t offset, const RandomParams& p,
                         const uint64_t* captured_state = nullptr);

}  // namespace ember::cuda::kernels

#endif  // EMBER_CUDA_RANDOM_KERNELS_H_
