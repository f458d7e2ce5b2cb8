#include "nn/transformer.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/grad_mode.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/init.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// torch's _canonical_mask: a bool mask (true = masked out) becomes a float
// mask of `dtype` with -inf where true; a float mask is kept.
Tensor CanonicalMask(const Tensor& mask, const char* name, Dtype dtype) {
  if (!mask.defined()) return mask;
  EMBER_CHECK(mask.dtype() == kBool || mask.is_floating_point(), "only bool and floating types of ",
              name, " are supported, got ", dtype_name(mask.dtype()));
  if (mask.is_floating_point()) return mask;
  return zeros(mask.sizes(), TensorOptions(dtype).device(mask.device())).masked_fill(mask, kNegInf);
}

std::string Shape(const Tensor& t) { return ShapeToString(t.sizes()); }

Tensor Activate(const std::string& activation, const Tensor& x) {
  return activation == "gelu" ? x.gelu() : functional::relu(x);
}

void CheckLayerOptions(const TransformerEncoderLayerOptions& o, const char* layer) {
  EMBER_CHECK(o.activation == "relu" || o.activation == "gelu",
              "activation should be relu/gelu, not ", o.activation, " (", layer, ")");
  EMBER_CHECK(o.dim_feedforward > 0, layer, ": dim_feedforward must be positive, got ",
              o.dim_feedforward);
}

MultiheadAttentionOptions AttentionOptions(const TransformerEncoderLayerOptions& o) {
  return MultiheadAttentionOptions{
      .embed_dim = o.d_model,
      .num_heads = o.nhead,
      .dropout = o.dropout,
      .bias = o.bias,
      .batch_first = o.batch_first,
  };
}

// torch's _detect_is_causal_mask.
bool DetectCausal(const Tensor& mask, std::optional<bool> is_causal, int64_t size) {
  if (is_causal.has_value()) return *is_causal;
  if (!mask.defined() || mask.dim() != 2 || mask.size(0) != size || mask.size(1) != size) {
    return false;
  }
  Tensor causal = generate_square_subsequent_mask(size, mask.dtype(), mask.device());
  return mask.detach().eq(causal).logical_not().sum().item<int64_t>() == 0;
}

}  // namespace

Tensor generate_square_subsequent_mask(int64_t sz, Dtype dtype, Device device) {
  const TensorOptions index = TensorOptions(kInt64).device(device);
  Tensor above = arange(sz, index).unsqueeze(0).gt(arange(sz, index).unsqueeze(1));
  return zeros({sz, sz}, TensorOptions(dtype).device(device)).masked_fill(above, kNegInf);
}

// --- MultiheadAttention ------------------------------------------------------------

MultiheadAttention::MultiheadAttention(MultiheadAttentionOptions options) : options_(options) {
  EMBER_CHECK(options_.embed_dim > 0 && options_.num_heads > 0,
              "embed_dim and num_heads must be greater than 0, got embed_dim=", options_.embed_dim,
              " and num_heads=", options_.num_heads, " instead");
  EMBER_CHECK(options_.embed_dim % options_.num_heads == 0,
              "embed_dim must be divisible by num_heads, got embed_dim=", options_.embed_dim,
              " and num_heads=", options_.num_heads);
  EMBER_CHECK(!options_.add_bias_kv,
              "MultiheadAttention: add_bias_kv=true is not supported; build it with "
              "add_bias_kv=false");
  EMBER_CHECK(!options_.add_zero_attn,
              "MultiheadAttention: add_zero_attn=true is not supported; build it with "
              "add_zero_attn=false");
  EMBER_CHECK(options_.dropout >= 0.0 && options_.dropout <= 1.0,
              "dropout probability has to be between 0 and 1, but got ", options_.dropout);
  EMBER_CHECK(options_.kdim.value_or(1) > 0 && options_.vdim.value_or(1) > 0,
              "MultiheadAttention: kdim and vdim must be positive, got ",
              options_.kdim.value_or(options_.embed_dim), " and ",
              options_.vdim.value_or(options_.embed_dim));
  reset();
}

bool MultiheadAttention::same_embed_dim() const {
  return options_.kdim.value_or(options_.embed_dim) == options_.embed_dim &&
         options_.vdim.value_or(options_.embed_dim) == options_.embed_dim;
}

void MultiheadAttention::reset() {
  const int64_t e = options_.embed_dim;
  if (same_embed_dim()) {
    register_parameter("in_proj_weight", empty({3 * e, e}));
  } else {
    register_parameter("q_proj_weight", empty({e, e}));
    register_parameter("k_proj_weight", empty({e, options_.kdim.value_or(e)}));
    register_parameter("v_proj_weight", empty({e, options_.vdim.value_or(e)}));
  }
  register_parameter("in_proj_bias", options_.bias ? empty({3 * e}) : Tensor());
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, options_.bias));
  if (!InClone()) reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  if (same_embed_dim()) {
    init::xavier_uniform_(in_proj_weight());
  } else {
    init::xavier_uniform_(q_proj_weight());
    init::xavier_uniform_(k_proj_weight());
    init::xavier_uniform_(v_proj_weight());
  }
  if (in_proj_bias().defined()) {
    init::constant_(in_proj_bias(), 0.0);
    init::constant_(out_proj->bias(), 0.0);
  }
}

Tensor MultiheadAttention::forward(const Tensor& input) {
  return forward(input, input, input, {.need_weights = false}).output;
}

MultiheadAttentionOutput MultiheadAttention::forward(const Tensor& query_in, const Tensor& key_in,
                                                     const Tensor& value_in,
                                                     const MultiheadAttentionForwardOptions& o) {
  EMBER_CHECK(query_in.defined() && key_in.defined() && value_in.defined(),
              "MultiheadAttention: query, key and value must be defined tensors");
  const int64_t num_heads = options_.num_heads;
  // torch's _mha_shape_check.
  const bool batched = query_in.dim() == 3;
  if (batched) {
    EMBER_CHECK(key_in.dim() == 3 && value_in.dim() == 3,
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D but found ",
                key_in.dim(), "-D and ", value_in.dim(), "-D tensors respectively");
    EMBER_CHECK(!o.key_padding_mask.defined() || o.key_padding_mask.dim() == 2,
                "For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D but "
                "found ",
                o.key_padding_mask.defined() ? o.key_padding_mask.dim() : 0, "-D tensor instead");
    EMBER_CHECK(!o.attn_mask.defined() || o.attn_mask.dim() == 2 || o.attn_mask.dim() == 3,
                "For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but "
                "found ",
                o.attn_mask.defined() ? o.attn_mask.dim() : 0, "-D tensor instead");
  } else {
    EMBER_CHECK(query_in.dim() == 2,
                "query should be unbatched 2D or batched 3D tensor but received ", query_in.dim(),
                "-D query tensor");
    EMBER_CHECK(key_in.dim() == 2 && value_in.dim() == 2,
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found ",
                key_in.dim(), "-D and ", value_in.dim(), "-D tensors respectively");
    EMBER_CHECK(!o.key_padding_mask.defined() || o.key_padding_mask.dim() == 1,
                "For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D but "
                "found ",
                o.key_padding_mask.defined() ? o.key_padding_mask.dim() : 0, "-D tensor instead");
    if (o.attn_mask.defined()) {
      EMBER_CHECK(o.attn_mask.dim() == 2 || o.attn_mask.dim() == 3,
                  "For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D "
                  "but found ",
                  o.attn_mask.dim(), "-D tensor instead");
      if (o.attn_mask.dim() == 3) {
        const SizeVector want = {num_heads, query_in.size(0), key_in.size(0)};
        EMBER_CHECK(o.attn_mask.sizes() == IntArrayRef(want), "Expected `attn_mask` shape to be ",
                    ShapeToString(want), " but got ", Shape(o.attn_mask));
      }
    }
  }

  Tensor query = query_in, key = key_in, value = value_in;
  if (options_.batch_first && batched) {
    query = query.transpose(0, 1);
    key = key.transpose(0, 1);
    value = value.transpose(0, 1);
  }
  Tensor key_padding_mask = o.key_padding_mask;
  if (!batched) {
    query = query.unsqueeze(1);
    key = key.unsqueeze(1);
    value = value.unsqueeze(1);
    if (key_padding_mask.defined()) key_padding_mask = key_padding_mask.unsqueeze(0);
  }
  const int64_t tgt_len = query.size(0), bsz = query.size(1), embed_dim = query.size(2);
  int64_t src_len = key.size(0);
  key_padding_mask = CanonicalMask(key_padding_mask, "key_padding_mask", query.dtype());

  bool is_causal = o.is_causal;
  EMBER_CHECK(!is_causal || o.attn_mask.defined(),
              "Need attn_mask if specifying the is_causal hint. You may use "
              "ember::nn::generate_square_subsequent_mask to create this mask.");
  Tensor attn_mask;
  if (is_causal && !key_padding_mask.defined() && !o.need_weights) {
    // The hint alone: scaled_dot_product_attention's is_causal.
  } else {
    attn_mask = CanonicalMask(o.attn_mask, "attn_mask", query.dtype());
    if (key_padding_mask.defined()) is_causal = false;
  }
  EMBER_CHECK(embed_dim == options_.embed_dim, "was expecting embedding dimension of ",
              options_.embed_dim, ", but got ", embed_dim);
  const int64_t head_dim = embed_dim / num_heads;
  if (!same_embed_dim()) {
    EMBER_CHECK(key.size(0) == value.size(0) && key.size(1) == value.size(1),
                "key's sequence and batch dims [", key.size(0), ", ", key.size(1),
                "] do not match value's [", value.size(0), ", ", value.size(1), "]");
  } else {
    EMBER_CHECK(key.sizes() == value.sizes(), "key shape ", Shape(key),
                " does not match value shape ", Shape(value));
  }

  // In-projection.
  const Tensor& b = in_proj_bias();
  auto bias_part = [&](int64_t i) {
    return b.defined() ? b.narrow(0, i * embed_dim, embed_dim) : b;
  };
  Tensor q, k, v;
  if (same_embed_dim()) {
    const Tensor& w = in_proj_weight();
    q = functional::linear(query, w.narrow(0, 0, embed_dim), bias_part(0));
    k = functional::linear(key, w.narrow(0, embed_dim, embed_dim), bias_part(1));
    v = functional::linear(value, w.narrow(0, 2 * embed_dim, embed_dim), bias_part(2));
  } else {
    q = functional::linear(query, q_proj_weight(), bias_part(0));
    k = functional::linear(key, k_proj_weight(), bias_part(1));
    v = functional::linear(value, v_proj_weight(), bias_part(2));
  }

  if (attn_mask.defined()) {
    if (attn_mask.dim() == 2) {
      EMBER_CHECK(attn_mask.size(0) == tgt_len && attn_mask.size(1) == src_len,
                  "The shape of the 2D attn_mask is ", Shape(attn_mask), ", but should be [",
                  tgt_len, ", ", src_len, "].");
      attn_mask = attn_mask.unsqueeze(0);
    } else {
      EMBER_CHECK(attn_mask.size(0) == bsz * num_heads && attn_mask.size(1) == tgt_len &&
                      attn_mask.size(2) == src_len,
                  "The shape of the 3D attn_mask is ", Shape(attn_mask), ", but should be [",
                  bsz * num_heads, ", ", tgt_len, ", ", src_len, "].");
    }
  }
  // [len, N, E] -> [N * H, len, head_dim].
  q = q.reshape({tgt_len, bsz * num_heads, head_dim}).transpose(0, 1);
  k = k.reshape({k.size(0), bsz * num_heads, head_dim}).transpose(0, 1);
  v = v.reshape({v.size(0), bsz * num_heads, head_dim}).transpose(0, 1);
  src_len = k.size(1);

  if (key_padding_mask.defined()) {
    EMBER_CHECK(key_padding_mask.size(0) == bsz, "Expected key_padded_mask.shape[0] to be ", bsz,
                ", but got ", key_padding_mask.size(0));
    EMBER_CHECK(key_padding_mask.size(1) == src_len, "Expected key_padded_mask.shape[1] to be ",
                src_len, ", but got ", key_padding_mask.size(1));
    Tensor kpm = key_padding_mask.reshape({bsz, 1, 1, src_len})
                     .expand({bsz, num_heads, 1, src_len})
                     .reshape({bsz * num_heads, 1, src_len});
    attn_mask = attn_mask.defined() ? attn_mask + kpm : kpm;
  }
  const double dropout_p = is_training() ? options_.dropout : 0.0;

  MultiheadAttentionOutput result;
  Tensor attn_output;
  if (o.need_weights) {
    Tensor q_scaled = q * std::sqrt(1.0 / static_cast<double>(head_dim));
    Tensor weights = q_scaled.bmm(k.transpose(-2, -1));
    if (attn_mask.defined()) weights = weights + attn_mask;
    weights = weights.softmax(-1);
    if (dropout_p > 0.0) weights = functional::dropout(weights, dropout_p, true);
    attn_output = weights.bmm(v).transpose(0, 1).reshape({tgt_len * bsz, embed_dim});
    weights = weights.reshape({bsz, num_heads, tgt_len, src_len});
    if (o.average_attn_weights) weights = weights.mean({1});
    if (!batched) weights = weights.squeeze(0);
    result.weights = weights;
  } else {
    if (attn_mask.defined()) {
      attn_mask = attn_mask.size(0) == 1 ? attn_mask.unsqueeze(0)
                                         : attn_mask.reshape({bsz, num_heads, -1, src_len});
    }
    Tensor q4 = q.reshape({bsz, num_heads, tgt_len, head_dim});
    Tensor k4 = k.reshape({bsz, num_heads, src_len, head_dim});
    Tensor v4 = v.reshape({bsz, num_heads, src_len, head_dim});
    Tensor out = functional::scaled_dot_product_attention(
        q4, k4, v4, {.attn_mask = attn_mask, .dropout_p = dropout_p, .is_causal = is_causal});
    attn_output = out.permute({2, 0, 1, 3}).reshape({bsz * tgt_len, embed_dim});
  }
  attn_output = (*out_proj)(attn_output).reshape({tgt_len, bsz, embed_dim});
  if (!batched) {
    attn_output = attn_output.squeeze(1);
  } else if (options_.batch_first) {
    attn_output = attn_output.transpose(0, 1);
  }
  result.output = attn_output;
  return result;
}

std::string MultiheadAttention::extra_repr() const {
  return absl::StrCat("embed_dim=", options_.embed_dim, ", num_heads=", options_.num_heads,
                      ", dropout=", options_.dropout,
                      ", batch_first=", options_.batch_first ? "True" : "False");
}

// --- TransformerEncoderLayer --------------------------------------------------------

TransformerEncoderLayer::TransformerEncoderLayer(TransformerEncoderLayerOptions options)
    : options_(std::move(options)) {
  CheckLayerOptions(options_, "TransformerEncoderLayer");
  reset();
}

void TransformerEncoderLayer::reset() {
  const TransformerEncoderLayerOptions& o = options_;
  self_attn =
      register_module("self_attn", std::make_shared<MultiheadAttention>(AttentionOptions(o)));
  linear1 =
      register_module("linear1", std::make_shared<Linear>(o.d_model, o.dim_feedforward, o.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  linear2 =
      register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, o.d_model, o.bias));
  norm1 = register_module(
      "norm1", std::make_shared<LayerNorm>(SizeVector{o.d_model}, o.layer_norm_eps, true, o.bias));
  norm2 = register_module(
      "norm2", std::make_shared<LayerNorm>(SizeVector{o.d_model}, o.layer_norm_eps, true, o.bias));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src,
                                        const TransformerEncoderLayerForwardOptions& o) {
  EMBER_CHECK(src.defined(), "TransformerEncoderLayer: src is an undefined tensor");
  Tensor padding = CanonicalMask(o.src_key_padding_mask, "src_key_padding_mask", src.dtype());
  Tensor mask = CanonicalMask(o.src_mask, "src_mask", src.dtype());
  auto sa_block = [&](const Tensor& x) {
    return (*dropout1)(self_attn
                           ->forward(x, x, x,
                                     {.key_padding_mask = padding,
                                      .need_weights = false,
                                      .attn_mask = mask,
                                      .is_causal = o.is_causal})
                           .output);
  };
  auto ff_block = [&](const Tensor& x) {
    return (*dropout2)((*linear2)((*dropout)(Activate(options_.activation, (*linear1)(x)))));
  };
  Tensor x = src;
  if (options_.norm_first) {
    x = x + sa_block((*norm1)(x));
    x = x + ff_block((*norm2)(x));
  } else {
    x = (*norm1)(x + sa_block(x));
    x = (*norm2)(x + ff_block(x));
  }
  return x;
}

// --- TransformerDecoderLayer --------------------------------------------------------

TransformerDecoderLayer::TransformerDecoderLayer(TransformerDecoderLayerOptions options)
    : options_(std::move(options)) {
  CheckLayerOptions(options_, "TransformerDecoderLayer");
  reset();
}

void TransformerDecoderLayer::reset() {
  const TransformerDecoderLayerOptions& o = options_;
  self_attn =
      register_module("self_attn", std::make_shared<MultiheadAttention>(AttentionOptions(o)));
  multihead_attn =
      register_module("multihead_attn", std::make_shared<MultiheadAttention>(AttentionOptions(o)));
  linear1 =
      register_module("linear1", std::make_shared<Linear>(o.d_model, o.dim_feedforward, o.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  linear2 =
      register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, o.d_model, o.bias));
  for (auto* slot : {&norm1, &norm2, &norm3}) {
    const char* name = slot == &norm1 ? "norm1" : slot == &norm2 ? "norm2" : "norm3";
    *slot = register_module(
        name, std::make_shared<LayerNorm>(SizeVector{o.d_model}, o.layer_norm_eps, true, o.bias));
  }
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerDecoderLayer::forward(const Tensor&) {
  EMBER_FAIL(
      "TransformerDecoderLayer needs the encoder's memory: call forward(tgt, memory, options)");
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const TransformerDecoderLayerForwardOptions& o) {
  EMBER_CHECK(tgt.defined() && memory.defined(),
              "TransformerDecoderLayer: tgt and memory must be defined tensors");
  auto sa_block = [&](const Tensor& x) {
    return (*dropout1)(self_attn
                           ->forward(x, x, x,
                                     {.key_padding_mask = o.tgt_key_padding_mask,
                                      .need_weights = false,
                                      .attn_mask = o.tgt_mask,
                                      .is_causal = o.tgt_is_causal})
                           .output);
  };
  auto mha_block = [&](const Tensor& x) {
    return (*dropout2)(multihead_attn
                           ->forward(x, memory, memory,
                                     {.key_padding_mask = o.memory_key_padding_mask,
                                      .need_weights = false,
                                      .attn_mask = o.memory_mask,
                                      .is_causal = o.memory_is_causal})
                           .output);
  };
  auto ff_block = [&](const Tensor& x) {
    return (*dropout3)((*linear2)((*dropout)(Activate(options_.activation, (*linear1)(x)))));
  };
  Tensor x = tgt;
  if (options_.norm_first) {
    x = x + sa_block((*norm1)(x));
    x = x + mha_block((*norm2)(x));
    x = x + ff_block((*norm3)(x));
  } else {
    x = (*norm1)(x + sa_block(x));
    x = (*norm2)(x + mha_block(x));
    x = (*norm3)(x + ff_block(x));
  }
  return x;
}

// --- TransformerEncoder -----------------------------------------------------------------

TransformerEncoder::TransformerEncoder(std::shared_ptr<TransformerEncoderLayer> encoder_layer,
                                       int64_t num_layers, std::shared_ptr<LayerNorm> norm)
    : prototype_(std::move(encoder_layer)),
      norm_prototype_(std::move(norm)),
      num_layers_(num_layers) {
  EMBER_CHECK(prototype_ != nullptr, "TransformerEncoder: encoder_layer is null");
  EMBER_CHECK(num_layers >= 1, "TransformerEncoder: num_layers must be at least 1, got ",
              num_layers);
  reset();
}

void TransformerEncoder::reset() {
  auto list = std::make_shared<Sequential>();
  layers.clear();
  for (int64_t i = 0; i < num_layers_; ++i) {
    // Inside clone() a fresh layer (its values are copied afterwards): a
    // nested clone of the one prototype would be memoised into one module
    // (Note [Sharing in clones]).
    auto layer = InClone()
                     ? std::make_shared<TransformerEncoderLayer>(prototype_->options())
                     : std::dynamic_pointer_cast<TransformerEncoderLayer>(prototype_->clone());
    EMBER_INTERNAL_ASSERT(layer != nullptr, "a TransformerEncoderLayer's clone has another type");
    list->push_back(layer);
    layers.push_back(layer);
  }
  register_module("layers", list);
  norm = nullptr;
  if (norm_prototype_ != nullptr) {
    norm = std::dynamic_pointer_cast<LayerNorm>(norm_prototype_->clone());
    EMBER_INTERNAL_ASSERT(norm != nullptr, "a LayerNorm's clone has another type");
    register_module("norm", norm);
  }
}

Tensor TransformerEncoder::forward(const Tensor& src, const TransformerEncoderForwardOptions& o) {
  EMBER_CHECK(src.defined(), "TransformerEncoder: src is an undefined tensor");
  Tensor padding = CanonicalMask(o.src_key_padding_mask, "src_key_padding_mask", src.dtype());
  Tensor mask = CanonicalMask(o.mask, "mask", src.dtype());
  const bool batch_first = layers.front()->options().batch_first;
  const int64_t seq_len = src.dim() == 2 ? src.size(0) : src.size(batch_first ? 1 : 0);
  const bool is_causal = DetectCausal(mask, o.is_causal, seq_len);
  Tensor output = src;
  for (const auto& layer : layers) {
    output = layer->forward(
        output, {.src_mask = mask, .src_key_padding_mask = padding, .is_causal = is_causal});
  }
  if (norm != nullptr) output = (*norm)(output);
  return output;
}

}  // namespace ember::nn
