// How LaunchReduce partitions a reduction among threads and blocks (Note
// [CUDA reduction strategy] in reduce_kernels.cu): host logic shared by the
// launcher and the CPU tests. Kernel-internal.
#ifndef EMBER_CUDA_REDUCE_PLAN_H_
#define EMBER_CUDA_REDUCE_PLAN_H_

#include <cstdint>

#include "cuda/loops.cuh"

namespace ember::cuda::kernels {

enum class ReducePath {
  kCub,              // cub::DeviceReduce::Sum (a full float32/float64 sum or mean)
  kThreadPerOutput,  // one thread per output walks every reduced element
  kColumns,          // one thread per output and row range; ranges folded in order
  kBlocks,           // one block per output (or per output and range)
};

struct ReducePlan {
  ReducePath path = ReducePath::kBlocks;
  // kColumns and kBlocks: how many ranges the reduced elements are cut into
  // (1: none, and no workspace), each of `chunk` consecutive elements (the
  // last may be shorter; none is empty).
  int64_t splits = 1;
  int64_t chunk = 0;
};

// Threads of a reduction block (loops.cuh's kThreads, which the device code
// checks).
inline constexpr int64_t kReduceBlockThreads = 256;
// kColumns: threads aimed at per SM (4 blocks: the column kernel uses at
// most 64 registers a thread, so all of them are resident at once), the
// fewest reduced elements a thread folds, and the most ranges an output has.
inline constexpr int64_t kColumnThreadsPerSm = 1024;
inline constexpr int64_t kColumnMinRows = 16;
inline constexpr int64_t kColumnMaxSplits = 1024;

inline ReducePlan PlanReduce(const ReduceArgs& a) {
  ReducePlan plan;
  const int64_t n = a.reduced.numel;
  if (a.kept.numel == 1 && (a.op == kSum || a.op == kMean) &&
      (a.dtype == kF32 || a.dtype == kF64) && a.reduced.contiguous) {
    plan.path = ReducePath::kCub;
    plan.chunk = n;
    return plan;
  }
  const int64_t es = ElementSize(a.dtype);
  const int64_t sms = a.sm_count > 0 ? a.sm_count : 1;
  const bool reduced_contiguous = a.reduced.ndim >= 1 && a.reduced.strides[0][0] == es;
  const bool kept_contiguous = a.kept.ndim >= 1 && a.kept.strides[1][0] == es;
  if (!reduced_contiguous && kept_contiguous) {
    // Outer reductions: the reduced dims are strided and the innermost kept
    // dim is contiguous in the input, so threads on adjacent outputs read
    // adjacent elements.
    if (a.kept.numel >= sms * kReduceBlockThreads) {
      plan.path = ReducePath::kThreadPerOutput;
      plan.chunk = n;
      return plan;
    }
    if (a.kept.sizes[0] >= 32) {
      // Too few outputs to fill the device (but a warp's worth of adjacent
      // ones): each output's rows are cut into ranges, one thread each.
      plan.path = ReducePath::kColumns;
      const int64_t target = sms * kColumnThreadsPerSm;
      int64_t s = (target + a.kept.numel - 1) / a.kept.numel;
      if (s > n / kColumnMinRows) s = n / kColumnMinRows;
      if (s > kColumnMaxSplits) s = kColumnMaxSplits;
      if (s < 1) s = 1;
      plan.chunk = (n + s - 1) / s;
      plan.splits = (n + plan.chunk - 1) / plan.chunk;  // no empty range
      return plan;
    }
  }
  // One block per output; when there are too few outputs to fill the device,
  // several blocks per output, each folding >= 16 elements a thread.
  plan.path = ReducePath::kBlocks;
  const int64_t target = sms * 4;
  int64_t s = 1;
  if (a.kept.numel < target) {
    const int64_t by_blocks = (target + a.kept.numel - 1) / a.kept.numel;
    const int64_t by_work = n / (kReduceBlockThreads * 16);
    s = by_blocks < by_work ? by_blocks : by_work;
    if (s < 1) s = 1;
  }
  plan.splits = s;
  plan.chunk = (n + s - 1) / s;
  return plan;
}

}  // namespace ember::cuda::kernels

#endif  // EMBER_CUDA_REDUCE_PLAN_H_
