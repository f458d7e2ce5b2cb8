// GPT-2 (Radford et al., 2019) with Hugging Face's GPT2LMHeadModel layout and
// parameter names (wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn, h.<i>.attn.c_proj,
// h.<i>.ln_2, h.<i>.mlp.c_fc, h.<i>.mlp.c_proj, ln_f; the LM head tied to
// wte), so the published GPT-2 safetensors load into it.
//
//   ```cpp compile-only
//   #include "nn/models/gpt2.h"
//   #include "tensor/factories.h"
//   namespace models = ember::nn::models;
//   // The published 124M model (a local copy of openai-community/gpt2's
//   // model.safetensors):
//   EMBER_ASSIGN_OR_RETURN(auto gpt2, models::GPT2::from_safetensors("model.safetensors"));
//   gpt2->eval();
//   ember::Tensor ids = ember::tensor({int64_t{464}, int64_t{2068}, int64_t{7586}});
//   ember::Tensor logits = (*gpt2)(ids.unsqueeze(0));               // [1, 3, 50257]
//   ```
//
// Each block is pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x)); attention
// is causal, through nn::functional::scaled_dot_product_attention (its fused
// CPU kernel); the MLP's activation is GELU's tanh form ("gelu_new"). Conv1D
// is Hugging Face's: a linear layer whose weight is stored [in, out]. Dropout
// (0.1 on embeddings, attention and residuals, as GPT-2's config) acts in
// training mode only.
//
// Checkpoints: load_hf_state_dict takes GPT2LMHeadModel's or GPT2Model's
// keys (with or without the "transformer." prefix), ignores the attention
// mask buffers older checkpoints carry (attn.bias, attn.masked_bias), and
// accepts lm_head.weight only when it equals wte (the head is tied). The
// module's own state_dict() has the keys without a prefix.
//
// Errors: construction with a bad config, and a forward with ids that are
// not int64 [B, T] / [T], longer than n_positions or outside the vocabulary,
// throw ember::Error naming the value; from_safetensors and
// load_hf_state_dict return absl::Status (a missing or misshapen key named).
// Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_MODELS_GPT2_H_
#define EMBER_NN_MODELS_GPT2_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nn/module.h"
#include "serialization/state_dict.h"

namespace ember::nn::models {

// Hugging Face's GPT2Config fields that shape the model (defaults: GPT-2
// small, 124M parameters).
struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double layer_norm_epsilon = 1e-5;
  double dropout = 0.1;  // resid_pdrop, embd_pdrop and attn_pdrop
};

// Hugging Face's Conv1D: y = x W + b with W [in_features, out_features].
class Conv1D : public Cloneable<Conv1D> {
 public:
  Conv1D(int64_t out_features, int64_t in_features);
  void reset() override;
  Tensor forward(const Tensor& input) override;

 private:
  int64_t out_features_, in_features_;
};

// Causal self-attention: c_attn makes q, k and v, c_proj mixes the heads.
// [B, T, n_embd] -> [B, T, n_embd].
class GPT2Attention : public Cloneable<GPT2Attention> {
 public:
  explicit GPT2Attention(GPT2Config config);
  void reset() override;
  Tensor forward(const Tensor& x) override;

 private:
  GPT2Config config_;
};

// c_fc -> GELU (tanh) -> c_proj.
class GPT2MLP : public Cloneable<GPT2MLP> {
 public:
  explicit GPT2MLP(GPT2Config config);
  void reset() override;
  Tensor forward(const Tensor& x) override;

 private:
  GPT2Config config_;
};

class GPT2Block : public Cloneable<GPT2Block> {
 public:
  explicit GPT2Block(GPT2Config config);
  void reset() override;
  Tensor forward(const Tensor& x) override;

 private:
  GPT2Config config_;
};

class GPT2 : public Cloneable<GPT2> {
 public:
  explicit GPT2(GPT2Config config = {});
  void reset() override;
  // Token ids int64 [B, T] (or [T]) -> logits [B, T, vocab_size] (or [T, V]).
  Tensor forward(const Tensor& input_ids) override;
  std::string name() const override { return "GPT2"; }

  const GPT2Config& config() const { return config_; }

  // Loads Hugging Face's keys (see above). InvalidArgument naming a key
  // that is missing, misshapen or unexpected.
  absl::Status load_hf_state_dict(const StateDict& state);
  // A model of `config` with the weights of a safetensors file in Hugging
  // Face's layout.
  static absl::StatusOr<std::shared_ptr<GPT2>> from_safetensors(const std::string& path,
                                                                GPT2Config config = {});

 private:
  GPT2Config config_;
};

}  // namespace ember::nn::models

#endif  // EMBER_NN_MODELS_GPT2_H_
