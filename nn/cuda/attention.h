// scaled_dot_product_attention's CUDA kernels: cuDNN's fused attention
// through its graph API (Note [cuDNN fused attention] in attention.cc),
// filling nn's attention slots (nn/attention_kernels.h). What is declared
// here is for tests and diagnostics.
//
// Thread-safety: thread-safe.
#ifndef EMBER_NN_CUDA_ATTENTION_H_
#define EMBER_NN_CUDA_ATTENTION_H_

#include <cstdint>
#include <string>

#include "nn/cuda/cudnn_graph.h"
#include "tensor/dtype.h"

namespace ember::nn::cudnn::internal {

// Why the fused kernels decline a call before any plan is tried, or "" when
// they try one: `dtype` (float16 and bfloat16 only), a mask (`masked`), head
// sizes `head_dim` (E) and `value_dim` (Ev) (multiples of 8, at most 256),
// an empty call (`empty`), or a data pointer not 16-byte aligned
// (`aligned` false).
std::string FusedAttentionRefusal(Dtype dtype, bool masked, int64_t head_dim, int64_t value_dim,
                                  bool empty, bool aligned);

// What the forward's and the backward's plan caches hold (shapes with a
// plan; shapes left to the composed path, and why the last was).
GraphPlanStats AttentionForwardStats();
GraphPlanStats AttentionBackwardStats();

}  // namespace ember::nn::cudnn::internal

#endif  // EMBER_NN_CUDA_ATTENTION_H_
