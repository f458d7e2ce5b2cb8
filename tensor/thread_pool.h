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
// The pool size defaults to OMP_NUM_THREADS when set (as PyTorch's intra-op
// pool does), else to the number of cores; set_num_threads changes it, as
// torch.set_num_threads. The same call bounds the BLAS library's own threads
// (OpenBLAS keeps a pool of its own for matmul), so that set_num_threads(1)
// means one thread for every op, as the Hogwild and DDP recipes expect. Work
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
// Sets the number of threads used by parallel_for and by BLAS (>= 1).
void set_num_threads(int n);
// True inside a parallel_for body.
bool in_parallel_region();

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& body);

}  // namespace ember

#endif  // EMBER_TENSOR_THREAD_POOL_H_
