// A decoder-only transformer language model laid out for model parallelism:
// separate q, k, v and output projections whose head count the attention
// reads from the projections' width (so ColwiseParallel on q, k, v gives each
// rank its heads), a Linear MLP, and every part a child of one Sequential
// (so pipeline stages are slices of it). The layout of PyTorch's tensor- and
// pipeline-parallel tutorials, with GPT's LayerNorm and GELU.
//
//   ```cpp compile-only
//   #include "nn/models/gpt.h"
//   #include "tensor/factories.h"
//   namespace models = ember::nn::models;
//   auto gpt = models::make_gpt({.vocab_size = 256, .block_size = 64, .n_embd = 128,
//                                .head_dim = 32, .hidden = 512, .n_layer = 4});
//   ember::Tensor ids = ember::randint(0, 256, {8, 64});   // [batch, tokens]
//   ember::Tensor logits = (*gpt)(ids);                    // [8, 64, 256]
//   ```
//
// make_gpt's children: "0" TokenAndPositionEmbedding (wte, wpe), "1" ..
// "n_layer" TransformerBlock (ln1, attn.{q, k, v, o}, ln2, fc1, fc2), then
// LayerNorm and the vocabulary head, Linear(n_embd, vocab_size). A block is
// pre-norm: h = x + attn(ln1(x)), then h + fc2(gelu(fc1(ln2(h)))); attention
// is nn::functional::scaled_dot_product_attention, causal when the config
// says so. No dropout and no weight tying, so that sharded copies need no
// shared state.
//
// Errors: a config with a non-positive size or an n_embd that head_dim does
// not divide, and a forward with ids that are not int64 [B, T] or longer than
// block_size, throw ember::Error naming the value. Thread-safety: as Module.
#ifndef EMBER_NN_MODELS_GPT_H_
#define EMBER_NN_MODELS_GPT_H_

#include <cstdint>
#include <memory>

#include "nn/container.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "tensor/tensor.h"

namespace ember::nn::models {

struct GPTConfig {
  int64_t vocab_size = 50304;
  int64_t block_size = 1024;  // the most tokens a sequence may have
  int64_t n_embd = 768;
  int64_t head_dim = 64;  // n_embd / head_dim heads
  int64_t hidden = 3072;  // the MLP's width
  int64_t n_layer = 12;
  bool causal = true;
};

// Multi-head self-attention over [B, T, dim] with projections q, k, v, o
// (Linear(dim, dim)); heads = q's output width / head_dim, so a column shard
// of q, k and v runs its share of the heads.
class SelfAttention : public Cloneable<SelfAttention> {
 public:
  SelfAttention(int64_t dim, int64_t head_dim, bool causal = false);
  void reset() override;
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> q, k, v, o;

 private:
  int64_t dim_;
  int64_t head_dim_;
  bool causal_;
};

// x + attn(ln1(x)), then h + fc2(gelu(fc1(ln2(h)))).
class TransformerBlock : public Cloneable<TransformerBlock> {
 public:
  TransformerBlock(int64_t dim, int64_t head_dim, int64_t hidden, bool causal = false);
  void reset() override;
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<Linear> fc1, fc2;

 private:
  int64_t dim_;
  int64_t head_dim_;
  int64_t hidden_;
  bool causal_;
};

// wte(ids) + wpe(0 .. T-1): token embedding [vocab, dim], position
// embedding [block_size, dim]; ids int64 [B, T], T <= block_size.
class TokenAndPositionEmbedding : public Cloneable<TokenAndPositionEmbedding> {
 public:
  TokenAndPositionEmbedding(int64_t vocab_size, int64_t block_size, int64_t dim);
  void reset() override;
  Tensor forward(const Tensor& ids) override;
  std::shared_ptr<Embedding> wte, wpe;

 private:
  int64_t vocab_size_;
  int64_t block_size_;
  int64_t dim_;
};

// The model (see above), freshly initialised from the default generator.
std::shared_ptr<Sequential> make_gpt(const GPTConfig& config);

}  // namespace ember::nn::models

#endif  // EMBER_NN_MODELS_GPT_H_
