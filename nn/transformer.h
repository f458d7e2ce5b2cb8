// Attention layers: MultiheadAttention, TransformerEncoderLayer,
// TransformerDecoderLayer and TransformerEncoder, as torch.nn's.
//
//   ```cpp
//   #include "nn/transformer.h"
//   #include "tensor/factories.h"
//   auto mha = std::make_shared<ember::nn::MultiheadAttention>(
//       ember::nn::MultiheadAttentionOptions{.embed_dim = 64, .num_heads = 8,
//                                            .batch_first = true});
//   ember::Tensor x = ember::randn({2, 10, 64});                   // [N, L, E]
//   ember::nn::MultiheadAttentionOutput r = mha->forward(x, x, x);  // weights [N, L, L]
//   ember::Tensor y = (*mha)(x);  // self-attention, output only
//
//   auto layer = std::make_shared<ember::nn::TransformerEncoderLayer>(
//       ember::nn::TransformerEncoderLayerOptions{.d_model = 64, .nhead = 8,
//                                                 .dim_feedforward = 256,
//                                                 .batch_first = true});
//   auto encoder = std::make_shared<ember::nn::TransformerEncoder>(
//       layer, /*num_layers=*/2, std::make_shared<ember::nn::LayerNorm>(ember::SizeVector{64}));
//   ember::Tensor causal = ember::nn::generate_square_subsequent_mask(10);
//   ember::Tensor z = encoder->forward(x, {.mask = causal});         // [2, 10, 64]
//   ```
//
// Parameter names, shapes, registration order (so state_dict keys and
// order) and initialisation are torch's: MultiheadAttention holds
// in_proj_weight [3E, E] (or q_proj_weight / k_proj_weight / v_proj_weight
// when kdim or vdim differ from E), in_proj_bias [3E] and out_proj (a Linear:
// out_proj.weight, out_proj.bias); the layers hold self_attn (and
// multihead_attn), linear1, linear2, norm1, norm2 (norm3), with their
// dropouts as parameterless children; TransformerEncoder holds layers.0...
// and norm. A state dict written by torch loads into these (and back).
//
// MultiheadAttention::forward(query, key, value, options) follows
// F.multi_head_attention_forward: inputs [L, N, E] ([N, L, E] with
// batch_first, [L, E] unbatched); key_padding_mask [N, S] and attn_mask
// [L, S] or [N * num_heads, L, S], where bool true means "do not attend"
// (the opposite of scaled_dot_product_attention's bool masks) and float
// masks are added; is_causal is a hint that needs attn_mask, as in torch.
// With need_weights the weights are computed in tensor ops (softmax,
// dropout, and averaged over heads unless average_attn_weights is false), so
// a row with every key masked gives NaN there, as torch's does; without it
// the attention runs through functional::scaled_dot_product_attention
// (nn/attention.h; fused on the CPU), which gives 0 there. The
// one-tensor forward(x) (what operator() and hooks see) is self-attention
// without weights. torch's MHA fast path (inference-only, same values) is not
// reproduced; add_bias_kv and add_zero_attn are refused.
//
// The layers' multi-input forward methods are their own calls, without the
// Module hooks; the one-tensor forward(src) of the encoder layer and the
// encoder is forward(src, {}), and the decoder layer's (which needs memory)
// throws. TransformerEncoder's layers are copies of the given layer (its
// values included), as torch's deepcopy; its is_causal, when unset, is
// detected from the mask as torch's _detect_is_causal_mask does.
//
// Errors: impossible options (embed_dim not divisible by num_heads, an
// unknown activation, add_bias_kv) throw ember::Error at construction;
// shape, mask dtype and mask shape mistakes throw ember::Error with torch's
// messages. Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_TRANSFORMER_H_
#define EMBER_NN_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "tensor/tensor.h"

namespace ember::nn {

// [sz, sz] float32 (or `dtype`): -inf above the diagonal, 0 elsewhere, as
// torch.nn.Transformer.generate_square_subsequent_mask.
Tensor generate_square_subsequent_mask(int64_t sz, Dtype dtype = kFloat32, Device device = kCPU);

struct MultiheadAttentionOptions {
  int64_t embed_dim = 0;
  int64_t num_heads = 0;
  double dropout = 0.0;
  bool bias = true;
  bool add_bias_kv = false;     // Only false is supported.
  bool add_zero_attn = false;   // Only false is supported.
  std::optional<int64_t> kdim;  // Default embed_dim.
  std::optional<int64_t> vdim;  // Default embed_dim.
  bool batch_first = false;
};

struct MultiheadAttentionForwardOptions {
  Tensor key_padding_mask;
  bool need_weights = true;
  Tensor attn_mask;
  bool average_attn_weights = true;
  bool is_causal = false;
};

struct MultiheadAttentionOutput {
  Tensor output;
  Tensor weights;  // Undefined unless need_weights.
};

class MultiheadAttention : public Cloneable<MultiheadAttention> {
 public:
  explicit MultiheadAttention(MultiheadAttentionOptions options);
  MultiheadAttention(int64_t embed_dim, int64_t num_heads)
      : MultiheadAttention(
            MultiheadAttentionOptions{.embed_dim = embed_dim, .num_heads = num_heads}) {}

  void reset() override;
  // xavier_uniform_ on the input projections, zero biases (torch's).
  void reset_parameters();
  // Self-attention of `input` without weights: forward(input, input, input,
  // {.need_weights = false}).output.
  Tensor forward(const Tensor& input) override;
  MultiheadAttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const MultiheadAttentionForwardOptions& options = {});

  const MultiheadAttentionOptions& options() const { return options_; }
  // Undefined when kdim or vdim differ from embed_dim (then the three below).
  const Tensor& in_proj_weight() const { return parameter("in_proj_weight"); }
  const Tensor& q_proj_weight() const { return parameter("q_proj_weight"); }
  const Tensor& k_proj_weight() const { return parameter("k_proj_weight"); }
  const Tensor& v_proj_weight() const { return parameter("v_proj_weight"); }
  // Undefined with bias = false.
  const Tensor& in_proj_bias() const { return parameter("in_proj_bias"); }

  std::shared_ptr<Linear> out_proj;

 protected:
  std::string extra_repr() const override;

 private:
  bool same_embed_dim() const;
  MultiheadAttentionOptions options_;
};

struct TransformerEncoderLayerOptions {
  int64_t d_model = 0;
  int64_t nhead = 0;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;
};
using TransformerDecoderLayerOptions = TransformerEncoderLayerOptions;

struct TransformerEncoderLayerForwardOptions {
  Tensor src_mask;
  Tensor src_key_padding_mask;
  bool is_causal = false;
};

struct TransformerDecoderLayerForwardOptions {
  Tensor tgt_mask;
  Tensor memory_mask;
  Tensor tgt_key_padding_mask;
  Tensor memory_key_padding_mask;
  bool tgt_is_causal = false;
  bool memory_is_causal = false;
};

class TransformerEncoderLayer : public Cloneable<TransformerEncoderLayer> {
 public:
  explicit TransformerEncoderLayer(TransformerEncoderLayerOptions options);

  void reset() override;
  Tensor forward(const Tensor& src) override { return forward(src, {}); }
  Tensor forward(const Tensor& src, const TransformerEncoderLayerForwardOptions& options);

  const TransformerEncoderLayerOptions& options() const { return options_; }

  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Linear> linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout1, dropout2;

 private:
  TransformerEncoderLayerOptions options_;
};

class TransformerDecoderLayer : public Cloneable<TransformerDecoderLayer> {
 public:
  explicit TransformerDecoderLayer(TransformerDecoderLayerOptions options);

  void reset() override;
  // Throws: a decoder layer needs memory.
  Tensor forward(const Tensor& tgt) override;
  Tensor forward(const Tensor& tgt, const Tensor& memory,
                 const TransformerDecoderLayerForwardOptions& options = {});

  const TransformerDecoderLayerOptions& options() const { return options_; }

  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Linear> linear2;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
  std::shared_ptr<Dropout> dropout1, dropout2, dropout3;

 private:
  TransformerDecoderLayerOptions options_;
};

struct TransformerEncoderForwardOptions {
  Tensor mask;
  Tensor src_key_padding_mask;
  // Unset: detected from `mask` (true when it equals
  // generate_square_subsequent_mask of the sequence length).
  std::optional<bool> is_causal;
};

class TransformerEncoder : public Cloneable<TransformerEncoder> {
 public:
  // num_layers copies of `encoder_layer` (values included) under
  // "layers.<i>", then `norm` (may be null) under "norm".
  TransformerEncoder(std::shared_ptr<TransformerEncoderLayer> encoder_layer, int64_t num_layers,
                     std::shared_ptr<LayerNorm> norm = nullptr);

  void reset() override;
  Tensor forward(const Tensor& src) override { return forward(src, {}); }
  Tensor forward(const Tensor& src, const TransformerEncoderForwardOptions& options);

  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;

 private:
  std::shared_ptr<TransformerEncoderLayer> prototype_;
  std::shared_ptr<LayerNorm> norm_prototype_;
  int64_t num_layers_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_TRANSFORMER_H_
