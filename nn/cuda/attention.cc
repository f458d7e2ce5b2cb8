// Note [cuDNN fused attention]
// What: scaled_dot_product_attention on CUDA float16 and bfloat16 without a
// mask (causal or not, any scale, grouped-query heads) runs as two fused
// cuDNN graphs, one forward and one backward, each an execution plan built
// once per shape and cached (Note [cuDNN graph building] in cudnn_graph.h).
// cuDNN's runtime-fusion engines recognise the graphs below as flash
// attention: no [L, S] matrix reaches memory, only the output, the per-row
// logsumexp (the stats) and, in the backward, the gradients with two float32
// scratch tensors. Other calls decline (Note [Attention kernels decline] in
// nn/attention_kernels.h) and run the composed path: float32 and float64
// (torch's flash and cuDNN backends take only the half types too), a mask,
// head sizes E or Ev that are not multiples of 8 or exceed 256, pointers not
// 16-byte aligned, and any shape for which cuDNN offers no plan (cached as
// such, with the reason, in the stats of attention.h).
//
// The graphs, on tensors [B, H, L, X] (batch, query heads, rows, features),
// every intermediate virtual and float32, every pointwise op computed in
// float32; K^T and V^T are K and V seen with their last two dims swapped:
//   forward   S = (Q K^T) * scale; causal: S = (row >= col) ? S : -inf;
//             M = rowmax(S); E = exp(S - M); Z = rowsum(E);
//             stats = M + log(Z) (float32 [B, H, L, 1]);
//             P = E / Z (in the data's type); O = P V.
//   backward  D = rowsum(dO * O) (float32 scratch [B, H, L, 1]);
//             P = exp((Q K^T) * scale - stats), causally masked as above;
//             dV = P^T dO; dS = P * (dO V^T - D) * scale;
//             dK = dS^T Q; dQ = dS K, accumulated in a float32 scratch
//             [B, H, L, E] and converted to the data's type.
// The scale and -inf enter as float scalars passed by value, so one plan
// serves every scale. GQA's key/value heads are repeated for their query
// heads before the graph and dK and dV summed over each group after
// (RepeatHeads / SumHeadGroups), as the composed path does. The plan cache's
// key: device, handle, direction, dtype, B, H, L, S, E, Ev and causal.
// torch's is_causal is aligned at the upper left (query i attends keys
// j <= i, also for L != S), as the row >= col comparison here.
#include "nn/cuda/attention.h"

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "nn/attention_kernels.h"
#include "nn/cuda/cudnn.h"
#include "nn/cuda/cudnn_graph.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::cudnn::internal {
namespace {

using ::ember::nn::internal::AttentionCall;
using ::ember::nn::internal::AttentionGrads;
using IntVector = std::vector<int64_t>;
using Desc = cudnnBackendDescriptor_t;

// The uids of the graphs' non-virtual tensors and by-value scalars.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kGradO,
  kGradQ,
  kGradK,
  kGradV,
  kRowDot,    // D = rowsum(dO * O)
  kGradQSum,  // dQ's float32 accumulator
};

// One plan's problem: q [b, h, sq, d], k [b, h, skv, d], v [b, h, skv, dv].
struct Shape {
  cudnnDataType_t type;
  int64_t b, h, sq, skv, d, dv;
  bool causal;

  IntVector Dims(int64_t rows, int64_t cols) const { return {b, h, rows, cols}; }
  // [b, h, rows, cols] seen transposed from a packed [b, h, cols, rows].
  IntVector Transposed(int64_t rows, int64_t cols) const {
    return {h * rows * cols, rows * cols, 1, rows};
  }
};

Desc Input(GraphBuilder& g, int64_t uid, cudnnDataType_t type, IntVector dims,
           IntVector strides = {}) {
  return g.Tensor(uid, TensorSpec{.type = type, .dims = std::move(dims), .strides = std::move(strides)});
}

Desc Float(GraphBuilder& g, IntVector dims, IntVector strides = {}) {
  return g.Virtual(CUDNN_DATA_FLOAT, std::move(dims), std::move(strides));
}

// y = mode(x, b) into a new float32 intermediate shaped like `dims`.
Desc Binary(GraphBuilder& g, cudnnPointwiseMode_t mode, Desc x, Desc b, const IntVector& dims) {
  Desc y = Float(g, dims);
  g.Pointwise(mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  return y;
}

Desc Unary(GraphBuilder& g, cudnnPointwiseMode_t mode, Desc x, const IntVector& dims) {
  Desc y = Float(g, dims);
  g.Pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  return y;
}

// `scores` [b, h, sq, skv] with the entries above the diagonal (col > row)
// set to `neg_inf`.
Desc CausalMask(GraphBuilder& g, const Shape& s, Desc scores, Desc neg_inf) {
  const IntVector dims = s.Dims(s.sq, s.skv);
  Desc row = g.Virtual(CUDNN_DATA_INT32, dims);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, nullptr, nullptr, row, 2);
  Desc col = g.Virtual(CUDNN_DATA_INT32, dims);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, nullptr, nullptr, col, 3);
  Desc keep = g.Virtual(CUDNN_DATA_BOOLEAN, dims);
  g.Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  Desc masked = Float(g, dims);
  g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, neg_inf, keep, masked);
  return masked;
}

// (Q K^T) * scale: the scaled scores [b, h, sq, skv].
Desc ScaledScores(GraphBuilder& g, const Shape& s, Desc q, Desc kt, Desc scale) {
  const IntVector dims = s.Dims(s.sq, s.skv);
  Desc scores = Float(g, dims);
  g.Matmul(q, kt, scores, CUDNN_DATA_FLOAT);
  return Binary(g, CUDNN_POINTWISE_MUL, scores, scale, dims);
}

Desc RowVector(GraphBuilder& g, const Shape& s) { return Float(g, s.Dims(s.sq, 1)); }

void BuildForward(GraphBuilder& g, const Shape& s) {
  const IntVector scores_dims = s.Dims(s.sq, s.skv);
  Desc q = Input(g, kQ, s.type, s.Dims(s.sq, s.d));
  Desc kt = Input(g, kK, s.type, s.Dims(s.d, s.skv), s.Transposed(s.d, s.skv));
  Desc v = Input(g, kV, s.type, s.Dims(s.skv, s.dv));
  Desc scale = g.Scalar(kScale);
  Desc scores = ScaledScores(g, s, q, kt, scale);
  if (s.causal) scores = CausalMask(g, s, scores, g.Scalar(kNegInf));
  Desc max = RowVector(g, s);
  g.Reduction(CUDNN_REDUCE_TENSOR_MAX, scores, max);
  Desc exp = Unary(g, CUDNN_POINTWISE_EXP, Binary(g, CUDNN_POINTWISE_SUB, scores, max, scores_dims),
                   scores_dims);
  Desc sum = RowVector(g, s);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, exp, sum);
  Desc log_sum = Unary(g, CUDNN_POINTWISE_LOG, sum, s.Dims(s.sq, 1));
  Desc stats = Input(g, kStats, CUDNN_DATA_FLOAT, s.Dims(s.sq, 1));
  g.Pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, nullptr, stats);
  Desc p = g.Virtual(s.type, scores_dims);
  g.Pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, exp, sum, nullptr, p);
  Desc o = Input(g, kO, s.type, s.Dims(s.sq, s.dv));
  g.Matmul(p, v, o, CUDNN_DATA_FLOAT);
}

void BuildBackward(GraphBuilder& g, const Shape& s) {
  const IntVector scores_dims = s.Dims(s.sq, s.skv);
  Desc q = Input(g, kQ, s.type, s.Dims(s.sq, s.d));
  Desc kt = Input(g, kK, s.type, s.Dims(s.d, s.skv), s.Transposed(s.d, s.skv));
  Desc vt = Input(g, kV, s.type, s.Dims(s.dv, s.skv), s.Transposed(s.dv, s.skv));
  Desc o = Input(g, kO, s.type, s.Dims(s.sq, s.dv));
  Desc go = Input(g, kGradO, s.type, s.Dims(s.sq, s.dv));
  Desc stats = Input(g, kStats, CUDNN_DATA_FLOAT, s.Dims(s.sq, 1));
  Desc scale = g.Scalar(kScale);

  // D = rowsum(dO * O), kept in memory: every key block of a row reads it.
  Desc row_dot = RowVector(g, s);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, Binary(g, CUDNN_POINTWISE_MUL, go, o, s.Dims(s.sq, s.dv)),
              row_dot);
  Desc d = Input(g, kRowDot, CUDNN_DATA_FLOAT, s.Dims(s.sq, 1));
  g.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, row_dot, g.Scalar(kOne), nullptr, d);

  // P = exp(S - stats), recomputed.
  Desc scores = Binary(g, CUDNN_POINTWISE_SUB, ScaledScores(g, s, q, kt, scale), stats, scores_dims);
  if (s.causal) scores = CausalMask(g, s, scores, g.Scalar(kNegInf));
  Desc p = Unary(g, CUDNN_POINTWISE_EXP, scores, scores_dims);

  // dV = P^T dO.
  Desc pt = g.Virtual(s.type, s.Dims(s.skv, s.sq), s.Transposed(s.skv, s.sq));
  g.Reshape(p, pt);
  g.Matmul(pt, go, Input(g, kGradV, s.type, s.Dims(s.skv, s.dv)), CUDNN_DATA_FLOAT);

  // dS = P * (dO V^T - D) * scale.
  Desc dp = Float(g, scores_dims);
  g.Matmul(go, vt, dp, CUDNN_DATA_FLOAT);
  Desc ds = Binary(g, CUDNN_POINTWISE_MUL,
                   Binary(g, CUDNN_POINTWISE_MUL, Binary(g, CUDNN_POINTWISE_SUB, dp, d, scores_dims),
                          p, scores_dims),
                   scale, scores_dims);

  // dK = dS^T Q.
  Desc dst = g.Virtual(s.type, s.Dims(s.skv, s.sq), s.Transposed(s.skv, s.sq));
  g.Reshape(ds, dst);
  g.Matmul(dst, q, Input(g, kGradK, s.type, s.Dims(s.skv, s.d)), CUDNN_DATA_FLOAT);

  // dQ = dS K, through a float32 accumulator.
  Desc k = g.Virtual(s.type, s.Dims(s.skv, s.d));
  g.Reshape(kt, k);
  Desc dq_sum = Input(g, kGradQSum, CUDNN_DATA_FLOAT, s.Dims(s.sq, s.d));
  g.Matmul(ds, k, dq_sum, CUDNN_DATA_FLOAT);
  g.Pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_sum, nullptr, nullptr,
              Input(g, kGradQ, s.type, s.Dims(s.sq, s.d)));
}

enum class Direction { kForward = 0, kBackward = 1 };

PlanCache& Plans(Direction direction) {
  static PlanCache* forward = new PlanCache();
  static PlanCache* backward = new PlanCache();
  return direction == Direction::kForward ? *forward : *backward;
}

// The cached plan of `s` in `direction` on `handle`, or null: none.
const Plan* FindPlan(Direction direction, cudnnHandle_t handle, Device device, Dtype dtype,
                     const Shape& s) {
  const IntVector key = {device.index(), static_cast<int64_t>(reinterpret_cast<uintptr_t>(handle)),
                         static_cast<int64_t>(direction), static_cast<int64_t>(dtype), s.b, s.h,
                         s.sq, s.skv, s.d, s.dv, s.causal ? 1 : 0};
  return Plans(direction).Find(key, [&](Plan* plan, std::string* why) {
    GraphBuilder g(plan->owned);
    if (direction == Direction::kForward) {
      BuildForward(g, s);
    } else {
      BuildBackward(g, s);
    }
    Desc graph = g.Finalize(handle);
    if (graph == nullptr) {
      *why = g.why();
      return false;
    }
    return ChoosePlan(graph, handle, device, EngineFilter(), plan, why);
  });
}

bool Aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// The shape of `c` with k and v repeated to q's heads; "" when the fused
// kernels try it, else why not.
std::string Refusal(const AttentionCall& c) {
  const bool empty = c.q.numel() == 0 || c.k.numel() == 0 || c.v.numel() == 0;
  const bool aligned = empty || (Aligned(c.q) && Aligned(c.k) && Aligned(c.v));
  return FusedAttentionRefusal(c.q.dtype(), c.mask.defined(), c.q.size(3), c.v.size(3), empty,
                               aligned);
}

Shape ShapeOf(const AttentionCall& c) {
  return Shape{.type = DataType(c.q.dtype(), "scaled_dot_product_attention"),
               .b = c.q.size(0),
               .h = c.q.size(1),
               .sq = c.q.size(2),
               .skv = c.k.size(2),
               .d = c.q.size(3),
               .dv = c.v.size(3),
               .causal = c.causal};
}

// -inf for the causal mask's select; cuDNN before 9.10 wants the lowest
// float instead.
float NegativeInfinity() {
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                   : -std::numeric_limits<float>::infinity();
}

// One call's plan and operands, on the call's device (current: the caller
// holds a DeviceGuard): k and v with their heads repeated to q's.
struct Launch {
  Device device;
  Shape s;
  cudnnHandle_t handle;
  const Plan* plan;
  Tensor k, v;
};

// The launch of `c` in `direction`, or nullopt when there is no plan.
std::optional<Launch> Prepare(Direction direction, const AttentionCall& c) {
  Launch l{.device = c.q.device(), .s = ShapeOf(c)};
  l.handle = Handle(l.device);
  l.plan = FindPlan(direction, l.handle, l.device, c.q.dtype(), l.s);
  if (l.plan == nullptr) return std::nullopt;
  l.k = ::ember::nn::internal::RepeatHeads(c.k, l.s.h).contiguous();
  l.v = ::ember::nn::internal::RepeatHeads(c.v, l.s.h).contiguous();
  return l;
}

bool ForwardCuda(const AttentionCall& c, Tensor* out, Tensor* stats) {
  if (!Refusal(c).empty()) return false;
  DeviceGuard guard(c.q.device());
  std::optional<Launch> l = Prepare(Direction::kForward, c);
  if (!l.has_value()) return false;
  const Shape& s = l->s;
  *out = empty({s.b, s.h, s.sq, s.dv}, c.q.options());
  *stats = empty({s.b, s.h, s.sq}, c.q.options().dtype(kFloat32));
  float scale = static_cast<float>(c.scale), neg_inf = NegativeInfinity();
  const int64_t uids[] = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  void* const pointers[] = {c.q.raw_data(),    l->k.raw_data(), l->v.raw_data(), out->raw_data(),
                            stats->raw_data(), &scale,          &neg_inf};
  // The causal mask's -inf is no tensor of the graph without causal.
  Execute(l->handle, l->device, *l->plan, std::span(uids, s.causal ? 7 : 6),
          std::span(pointers, s.causal ? 7 : 6));
  return true;
}

bool BackwardCuda(const AttentionCall& c, const Tensor& out, const Tensor& stats,
                  const Tensor& grad, const std::array<bool, 3>& needs, AttentionGrads* grads) {
  (void)needs;  // The graph computes all three.
  // The stats must be this kernel's (float32), the gradient of the output's
  // dtype (the graph reads both as such).
  if (!Refusal(c).empty() || stats.dtype() != kFloat32 || grad.dtype() != c.q.dtype() ||
      out.dtype() != c.q.dtype() || !Aligned(out) || !Aligned(grad)) {
    return false;
  }
  DeviceGuard guard(c.q.device());
  std::optional<Launch> l = Prepare(Direction::kBackward, c);
  if (!l.has_value()) return false;
  const Shape& s = l->s;
  const int64_t kv_heads = c.k.size(1);
  Tensor dq = empty_like(c.q);
  Tensor dk = empty({s.b, s.h, s.skv, s.d}, c.q.options());
  Tensor dv = empty({s.b, s.h, s.skv, s.dv}, c.q.options());
  Tensor row_dot = empty({s.b, s.h, s.sq}, c.q.options().dtype(kFloat32));
  Tensor dq_sum = zeros({s.b, s.h, s.sq, s.d}, c.q.options().dtype(kFloat32));
  float scale = static_cast<float>(c.scale), one = 1.0f, neg_inf = NegativeInfinity();
  const int64_t uids[] = {kQ,     kK,     kV,     kO,      kGradO,    kStats,  kScale,
                          kOne,   kGradQ, kGradK, kGradV,  kRowDot,   kGradQSum, kNegInf};
  void* const pointers[] = {c.q.raw_data(),     l->k.raw_data(),  l->v.raw_data(),
                            out.raw_data(),     grad.raw_data(),  stats.raw_data(),
                            &scale,             &one,             dq.raw_data(),
                            dk.raw_data(),      dv.raw_data(),    row_dot.raw_data(),
                            dq_sum.raw_data(),  &neg_inf};
  const size_t n = s.causal ? 14 : 13;
  Execute(l->handle, l->device, *l->plan, std::span(uids, n), std::span(pointers, n));
  grads->dq = dq;
  grads->dk = ::ember::nn::internal::SumHeadGroups(dk, kv_heads);
  grads->dv = ::ember::nn::internal::SumHeadGroups(dv, kv_heads);
  return true;
}

}  // namespace

std::string FusedAttentionRefusal(Dtype dtype, bool masked, int64_t head_dim, int64_t value_dim,
                                  bool empty, bool aligned) {
  if (dtype != kFloat16 && dtype != kBFloat16) {
    return "dtype " + std::string(dtype_name(dtype)) + " (float16 and bfloat16 only)";
  }
  if (masked) return "an attn_mask (only is_causal or no mask)";
  for (int64_t dim : {head_dim, value_dim}) {
    if (dim % 8 != 0 || dim > 256) {
      return "head size " + std::to_string(dim) + " (multiples of 8 up to 256 only)";
    }
  }
  if (empty) return "an empty query, key or value";
  if (!aligned) return "a data pointer not 16-byte aligned";
  return "";
}

std::string BuildAttentionOperations(bool backward, Dtype dtype, int64_t b, int64_t h, int64_t sq,
                                     int64_t skv, int64_t d, int64_t dv, bool causal) {
  const Shape s{.type = DataType(dtype, "scaled_dot_product_attention"),
                .b = b, .h = h, .sq = sq, .skv = skv, .d = d, .dv = dv, .causal = causal};
  Descriptors owned;
  GraphBuilder g(owned);
  if (backward) {
    BuildBackward(g, s);
  } else {
    BuildForward(g, s);
  }
  return g.why();
}

GraphPlanStats AttentionForwardStats() { return Plans(Direction::kForward).Stats(); }
GraphPlanStats AttentionBackwardStats() { return Plans(Direction::kBackward).Stats(); }

EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::attention_forward, DeviceType::kCUDA,
                         &ForwardCuda);
EMBER_REGISTER_NN_KERNEL(::ember::nn::internal::attention_backward, DeviceType::kCUDA,
                         &BackwardCuda);

}  // namespace ember::nn::cudnn::internal
