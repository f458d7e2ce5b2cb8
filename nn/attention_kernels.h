// The per-device kernels of scaled_dot_product_attention (Note [nn device
// kernels] in nn/device_kernels.h): nn/attention.cc defines the slots and
// registers the CPU's fused kernel (Note [Fused attention on the CPU]); a
// device's library registers its own (nn/cuda/: cuDNN's fused attention,
// Note [cuDNN fused attention] in nn/cuda/attention.cc).
//
// Note [Attention kernels decline]
// Unlike the other layers' kernels, an attention kernel may decline a call
// it has no fused form for (a mask, a dtype, a head size, a shape its
// library builds no plan for) by returning false, having written nothing;
// the layer then runs the composed path (matmul + masked softmax + matmul,
// recorded by autograd), which every device's tensor ops provide. So a
// device's kernel takes only what it does well, and the layer needs no
// knowledge of which calls those are. The forward kernel's `stats` are its
// own business (the CPU's per-row logsumexp in the input's dtype, cuDNN's in
// float32): the layer keeps them with the output and hands both back to the
// same device's backward kernel, which may decline too (the layer then
// differentiates the composed probabilities). A kernel that accepted a call
// and then fails throws.
//
// Arguments are detached (plain tensors: the layer's Function records the
// graph), contiguous, on one device, of one floating dtype. Kernel-internal.
#ifndef EMBER_NN_ATTENTION_KERNELS_H_
#define EMBER_NN_ATTENTION_KERNELS_H_

#include <array>
#include <cstdint>

#include "nn/device_kernels.h"
#include "tensor/tensor.h"

namespace ember::nn::internal {

// One attention call: q [B, H, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev] with
// Hk dividing H (each key/value head serves H / Hk consecutive query heads);
// mask undefined or broadcast to [B, H, L, S] (any strides), bool or q's
// dtype, never together with causal; scale multiplies the scores.
struct AttentionCall {
  Tensor q, k, v, mask;
  bool causal = false;
  double scale = 1.0;
};

// out [B, H, L, Ev] and the kernel's stats; false: declined.
using AttentionForwardFn = bool(const AttentionCall& call, Tensor* out, Tensor* stats);

// The gradients of q, k and v from `grad` (the output's, [B, H, L, Ev]),
// given the forward's `out` and `stats`; `needs` says which of dq, dk and dv
// are wanted (the others may be left undefined). false: declined.
struct AttentionGrads {
  Tensor dq, dk, dv;
};
using AttentionBackwardFn = bool(const AttentionCall& call, const Tensor& out,
                                 const Tensor& stats, const Tensor& grad,
                                 const std::array<bool, 3>& needs, AttentionGrads* grads);

extern constinit DeviceKernel<AttentionForwardFn> attention_forward;
extern constinit DeviceKernel<AttentionBackwardFn> attention_backward;

// k [B, Hk, S, X] -> [B, H, S, X], each key/value head repeated for its
// group of query heads (torch's repeat_interleave on dim -3); k itself when
// Hk == H.
Tensor RepeatHeads(const Tensor& k, int64_t heads);

// RepeatHeads's adjoint: [B, H, S, X] -> [B, Hk, S, X], summing each group.
Tensor SumHeadGroups(const Tensor& g, int64_t kv_heads);

}  // namespace ember::nn::internal

#endif  // EMBER_NN_ATTENTION_KERNELS_H_
