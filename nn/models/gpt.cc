#include "nn/models/gpt.h"

#include "nn/attention.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"

namespace ember::nn::models {

SelfAttention::SelfAttention(int64_t dim, int64_t head_dim, bool causal)
    : dim_(dim), head_dim_(head_dim), causal_(causal) {
  EMBER_CHECK(dim > 0 && head_dim > 0 && dim % head_dim == 0, "SelfAttention: dim (", dim,
              ") must be a positive multiple of head_dim (", head_dim, ")");
  reset();
}

void SelfAttention::reset() {
  q = register_module("q", std::make_shared<Linear>(dim_, dim_));
  k = register_module("k", std::make_shared<Linear>(dim_, dim_));
  v = register_module("v", std::make_shared<Linear>(dim_, dim_));
  o = register_module("o", std::make_shared<Linear>(dim_, dim_));
}

Tensor SelfAttention::forward(const Tensor& x) {
  EMBER_CHECK(x.dim() == 3, "SelfAttention: the input must be [batch, tokens, dim], got ",
              ShapeToString(x.sizes()));
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  auto heads = [&](const Tensor& y) {  // [B, T, H*hd] -> [B, H, T, hd]
    return y.reshape({b, t, y.size(2) / head_dim_, head_dim_}).transpose(1, 2);
  };
  Tensor qh = heads((*q)(x));
  Tensor a = functional::scaled_dot_product_attention(qh, heads((*k)(x)), heads((*v)(x)),
                                                      {.is_causal = causal_});
  return (*o)(a.transpose(1, 2).reshape({b, t, qh.size(1) * head_dim_}));
}

TransformerBlock::TransformerBlock(int64_t dim, int64_t head_dim, int64_t hidden, bool causal)
    : dim_(dim), head_dim_(head_dim), hidden_(hidden), causal_(causal) {
  EMBER_CHECK(hidden > 0, "TransformerBlock: hidden must be positive, got ", hidden);
  reset();
}

void TransformerBlock::reset() {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(SizeVector{dim_}));
  attn = register_module("attn", std::make_shared<SelfAttention>(dim_, head_dim_, causal_));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(SizeVector{dim_}));
  fc1 = register_module("fc1", std::make_shared<Linear>(dim_, hidden_));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden_, dim_));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = x + (*attn)((*ln1)(x));
  return h + (*fc2)((*fc1)((*ln2)(h)).gelu());
}

TokenAndPositionEmbedding::TokenAndPositionEmbedding(int64_t vocab_size, int64_t block_size,
                                                     int64_t dim)
    : vocab_size_(vocab_size), block_size_(block_size), dim_(dim) {
  EMBER_CHECK(vocab_size > 0 && block_size > 0 && dim > 0,
              "TokenAndPositionEmbedding: vocab_size, block_size and dim must be positive, got ",
              vocab_size, ", ", block_size, ", ", dim);
  reset();
}

void TokenAndPositionEmbedding::reset() {
  wte = register_module("wte", std::make_shared<Embedding>(vocab_size_, dim_));
  wpe = register_module("wpe", std::make_shared<Embedding>(block_size_, dim_));
}

Tensor TokenAndPositionEmbedding::forward(const Tensor& ids) {
  EMBER_CHECK(ids.dtype() == kInt64 && ids.dim() == 2,
              "TokenAndPositionEmbedding: ids must be int64 [batch, tokens], got ",
              dtype_name(ids.dtype()), " ", ShapeToString(ids.sizes()));
  EMBER_CHECK(ids.size(1) <= block_size_, "TokenAndPositionEmbedding: ", ids.size(1),
              " tokens, more than block_size (", block_size_, ")");
  return (*wte)(ids) + (*wpe)(arange(ids.size(1), TensorOptions().dtype(kInt64)));
}

std::shared_ptr<Sequential> make_gpt(const GPTConfig& c) {
  EMBER_CHECK(c.n_layer > 0, "GPTConfig: n_layer must be positive, got ", c.n_layer);
  EMBER_CHECK(c.n_embd > 0 && c.head_dim > 0 && c.n_embd % c.head_dim == 0, "GPTConfig: n_embd (",
              c.n_embd, ") must be a positive multiple of head_dim (", c.head_dim, ")");
  auto gpt = std::make_shared<Sequential>();
  gpt->push_back(std::make_shared<TokenAndPositionEmbedding>(c.vocab_size, c.block_size, c.n_embd));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    gpt->push_back(std::make_shared<TransformerBlock>(c.n_embd, c.head_dim, c.hidden, c.causal));
  }
  gpt->push_back(std::make_shared<LayerNorm>(SizeVector{c.n_embd}));
  gpt->push_back(std::make_shared<Linear>(c.n_embd, c.vocab_size));
  return gpt;
}

}  // namespace ember::nn::models
