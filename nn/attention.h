// Scaled dot-product attention, as torch.nn.functional.scaled_dot_product_attention,
// with a fused CPU kernel and its backward.
//
//   ```cpp
//   #include "nn/attention.h"
//   #include "tensor/factories.h"
//   ember::Tensor q = ember::randn({4, 8, 128, 64}).requires_grad_();  // [N, H, L, E]
//   ember::Tensor k = ember::randn({4, 8, 96, 64}).requires_grad_();   // [N, H, S, E]
//   ember::Tensor v = ember::randn({4, 8, 96, 32}).requires_grad_();   // [N, H, S, Ev]
//   ember::Tensor out = ember::nn::functional::scaled_dot_product_attention(
//       q, k, v, {.is_causal = true});                                  // [N, H, L, Ev]
//   out.sum().backward();
//   // Grouped-query attention: 8 query heads share 2 key/value heads.
//   ember::Tensor kv = ember::randn({4, 2, 96, 64});
//   ember::Tensor g = ember::nn::functional::scaled_dot_product_attention(
//       q.detach(), kv, kv, {.enable_gqa = true});
//   ```
//
// softmax(q k^T * scale + mask) v over the last two dims; the dims before
// them broadcast as matmul's do. Options, with torch's defaults:
//   attn_mask  bool (true = take part in attention, false = masked out) or
//              float of the query's dtype (added to the scores), broadcast to
//              [..., L, S];
//   dropout_p  the probability of dropping an attention weight (applied
//              whenever > 0, as torch's functional form does: pass 0 in eval);
//   is_causal  a lower-triangular mask aligned at the upper left (query i
//              attends keys j <= i, torch's tril(ones(L, S))); refused together
//              with attn_mask, as torch does;
//   scale      default 1 / sqrt(E);
//   enable_gqa the key/value heads (dim -3) may divide the query heads: each
//              key/value head serves Hq / Hk consecutive query heads;
//   generator  dropout's random source (the default generator of the
//              tensors' device when null).
// A query row whose keys are all masked out gives zeros (and zero
// gradients), as PyTorch 2.15 does (its math and CPU flash paths both
// return 0 there, not NaN).
//
// Note [Fused attention on the CPU]
// On CPU tensors of float32 and float64 without dropout, the forward is one
// kernel blocked over keys with an online softmax (FlashAttention-2's
// algorithm): for each (batch, head, block of kQueryBlock query rows) it
// walks blocks of kKeyBlock keys, keeping the running row maximum m, the
// running sum l of exp(s - m) and the unnormalised output, rescaling both by
// exp(m_old - m_new) as the maximum grows. So no [L, S] matrix is
// materialised per head, only a block of scores per worker; what is kept for
// the backward is the output and the per-row logsumexp m + log(l). The
// backward recomputes the probabilities block by block from that logsumexp,
// with D = rowsum(dO * O) computed once per row. When there are at least as
// many (batch, key/value head) pairs as threads it is one pass per pair:
// each block of probabilities is recomputed once and serves dV, dK and dQ
// (the pair owns its dK and dV rows and its query heads' dQ rows, so no two
// tasks write the same rows). With fewer pairs it is two passes that split
// the work finer: one over (batch, key/value head, key block) accumulates dK
// and dV, a second over (batch, head, query block) dQ. Both sum in the same
// order, so results do not depend on the thread count. Every block product
// is single-threaded BLAS on plain row-major operands (each worker keeps its
// key/value head transposed a block at a time, so q k^T and dO v^T need no
// transposed operand); the tasks run on Ember's intra-op pool
// (tensor/thread_pool.h). A block's row maximum and exponentials use
// glibc's vector expf (libmvec) on AVX-512 or AVX2 for float32, scalar
// std::exp otherwise. Masks are read in place through their (broadcast)
// strides.
// float16 and bfloat16 CPU inputs compute in float32 and are rounded back.
// Under create_graph the backward is written in recorded tensor ops (the
// composed probabilities), so second derivatives work.
//
// Each device's kernels sit in the slots of nn/attention_kernels.h and may
// decline a call (Note [Attention kernels decline]): the CPU's fused kernel
// takes every float call it is given; on CUDA, cuDNN's fused attention
// (Note [cuDNN fused attention] in nn/cuda/attention.cc) takes float16 and
// bfloat16 without a mask (causal or not) and head sizes that are multiples
// of 8 up to 256. The composed path, matmul + masked softmax + dropout +
// matmul recorded by autograd, is taken for dropout_p > 0, for a float mask
// that requires grad (its gradient is the scores'), and for whatever a
// device's kernel declines (on CUDA: float32, float64, masks), on the
// device's tensor ops.
//
// Errors throw ember::Error with torch's messages where it has them: fewer
// than 2 dims, dtype mismatches, E of query and key or S of key and value
// differing, batch dims that don't broadcast, head counts that don't divide
// under enable_gqa, a mask of another dtype or a shape that doesn't
// broadcast to [..., L, S], dropout_p outside [0, 1], attn_mask with
// is_causal. Thread-safety: a pure function of its inputs (the generator is
// locked); may be called from several threads.
#ifndef EMBER_NN_ATTENTION_H_
#define EMBER_NN_ATTENTION_H_

#include <cstdint>
#include <optional>

#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn::functional {

struct ScaledDotProductAttentionOptions {
  Tensor attn_mask;
  double dropout_p = 0.0;
  bool is_causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
  Generator* generator = nullptr;
};

// query [..., L, E], key [..., S, E], value [..., S, Ev] -> [..., L, Ev].
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const ScaledDotProductAttentionOptions& options = {});

}  // namespace ember::nn::functional

namespace ember::nn::internal {

// The fused kernel's block sizes (Note [Fused attention on the CPU]); tests
// pick sizes that don't divide them.
inline constexpr int64_t kQueryBlock = 64;
inline constexpr int64_t kKeyBlock = 64;

// The widest vectors the float kernel's softmax may use, in bits: 512
// (AVX-512, the default where the CPU has it), 256 (AVX2) or 0 (scalar);
// the CPU's own limit still applies. For tests of each path.
void set_max_vector_bits(int bits);

}  // namespace ember::nn::internal

#endif  // EMBER_NN_ATTENTION_H_
