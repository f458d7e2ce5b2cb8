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

// Builds every tensor and operation of the forward's (or, with `backward`,
// the backward's) graph for q [b, h, sq, d], k [b, h, skv, d], v
// [b, h, skv, dv] of `dtype` and returns "" when cuDNN accepted each of
// them, else its refusal. It stops before the operation graph, which needs a
// device's handle, so it runs without a device (a check of the graphs'
// descriptors wherever cuDNN's library loads).
std::string BuildAttentionOperations(bool backward, Dtype dtype, int64_t b, int64_t h, int64_t sq,
                                     int64_t skv, int64_t d, int64_t dv, bool causal);

// What the forward's and the backward's plan caches hold (shapes with a
// plan; shapes left to the composed path, and why the last was).
GraphPlanStats AttentionForwardStats();
GraphPlanStats AttentionBackwardStats();

}  // namespace ember::nn::cudnn::internal

#endif  // EMBER_NN_CUDA_ATTENTION_H_
