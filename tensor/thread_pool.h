// The intra-op thread pool: splits one op's work over the machine's cores.
//
//   ```cpp
//   #include <vector>
//   #include "tensor/thread_pool.h"
//   std::vector<float> a(100000, 1.0f), b(100000, 2.0f), out(100000);
//   int64_t n = static_cast<int64_t>(out.size());
//   ember::parallel_for(0, n, /*grain=*/32768, [&](int64_t begin, int64_t end) {
//     for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
//   });
//   ```
//
// The chunks run on the OpenMP runtime's team, the same threads oneDNN's
// primitives run on (Note [One team for every op] in thread_pool.cc). The
// pool size defaults to OMP_NUM_THREADS when set (as PyTorch's intra-op
// pool does), else to the number of cores; set_num_threads changes it, as
// torch.set_num_threads. BLAS runs on the calling thread (the pool sets
// OpenBLAS to one thread when it starts) and large products are split over
// this pool (Note [BLAS on the team] in tensor/cpu/linalg_kernels.cc), so
// that set_num_threads(1) means one thread for every op, as the Hogwild and
// DDP recipes expect. Work
// smaller than `grain` elements, and calls made from inside a parallel_for
// body, run inline on the calling thread. An exception thrown by a body is
// rethrown on the calling thread after all chunks finish. parallel_for blocks
// until every chunk is done; it may be called from several threads at once.
#ifndef EMBER_TENSOR_THREAD_POOL_H_
#define EMBER_TENSOR_THREAD_POOL_H_

#include <cstdint>
#include <functional>

namespace ember {

// Elements below which splitting a loop costs more than it gains.
inline constexpr int64_t kDefaultGrainSize = 32768;

int get_num_threads();
// Sets the number of threads parallel_for uses (>= 1), BLAS's included.
void set_num_threads(int n);
// True inside a parallel_for body.
bool in_parallel_region();

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& body);

namespace internal {

// The threads an OpenMP parallel region started on this thread may use now:
// get_num_threads(), or 1 inside a parallel_for body and in a child forked
// after this process's OpenMP team started (Note [One team for every op]).
// Libraries that run on OpenMP themselves (oneDNN) ask before each call.
int openmp_threads();

}  // namespace internal

}  // namespace ember

#endif  // EMBER_TENSOR_THREAD_POOL_H_
