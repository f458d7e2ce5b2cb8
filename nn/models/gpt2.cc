#include "nn/models/gpt2.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/attention.h"
#include "nn/init.h"
#include "nn/normalization.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/shape.h"

namespace ember::nn::models {
namespace {

void CheckConfig(const GPT2Config& c) {
  EMBER_CHECK(c.vocab_size > 0 && c.n_positions > 0 && c.n_embd > 0 && c.n_layer > 0 &&
                  c.n_head > 0,
              "GPT2Config: vocab_size, n_positions, n_embd, n_layer and n_head must be positive, "
              "got ",
              c.vocab_size, ", ", c.n_positions, ", ", c.n_embd, ", ", c.n_layer, ", ", c.n_head);
  EMBER_CHECK(c.n_embd % c.n_head == 0, "GPT2Config: n_embd (", c.n_embd,
              ") must be divisible by n_head (", c.n_head, ")");
  EMBER_CHECK(c.dropout >= 0 && c.dropout < 1, "GPT2Config: dropout must be in [0, 1), got ",
              c.dropout);
}

}  // namespace

Conv1D::Conv1D(int64_t out_features, int64_t in_features)
    : out_features_(out_features), in_features_(in_features) {
  reset();
}

void Conv1D::reset() {
  // Hugging Face's initialisation: normal(0, 0.02) weights, zero biases.
  Tensor w = empty({in_features_, out_features_});
  init::normal_(w, 0.0, 0.02);
  register_parameter("weight", w);
  register_parameter("bias", zeros({out_features_}));
}

Tensor Conv1D::forward(const Tensor& input) {
  return input.matmul(parameter("weight")) + parameter("bias");
}

GPT2Attention::GPT2Attention(GPT2Config config) : config_(config) { reset(); }

void GPT2Attention::reset() {
  const int64_t c = config_.n_embd;
  register_module("c_attn", std::make_shared<Conv1D>(3 * c, c));
  register_module("c_proj", std::make_shared<Conv1D>(c, c));
}

Tensor GPT2Attention::forward(const Tensor& x) {
  const int64_t c = config_.n_embd, heads = config_.n_head, head_dim = c / heads;
  const int64_t b = x.size(0), t = x.size(1);
  const double p = is_training() ? config_.dropout : 0.0;
  // [B, T, 3C] -> q, k, v [B, heads, T, head_dim].
  const Tensor qkv = (*child("c_attn"))(x);
  auto heads_of = [&](int64_t i) {
    return qkv.narrow(-1, i * c, c).reshape({b, t, heads, head_dim}).transpose(1, 2);
  };
  const Tensor a = functional::scaled_dot_product_attention(
      heads_of(0), heads_of(1), heads_of(2), {.dropout_p = p, .is_causal = true});
  return (*child("c_proj"))(a.transpose(1, 2).reshape({b, t, c}));
}

GPT2MLP::GPT2MLP(GPT2Config config) : config_(config) { reset(); }

void GPT2MLP::reset() {
  const int64_t c = config_.n_embd;
  register_module("c_fc", std::make_shared<Conv1D>(4 * c, c));
  register_module("c_proj", std::make_shared<Conv1D>(c, 4 * c));
}

Tensor GPT2MLP::forward(const Tensor& x) {
  return (*child("c_proj"))(functional::gelu((*child("c_fc"))(x), "tanh"));
}

GPT2Block::GPT2Block(GPT2Config config) : config_(config) { reset(); }

void GPT2Block::reset() {
  const int64_t c = config_.n_embd;
  register_module("ln_1", std::make_shared<LayerNorm>(SizeVector{c}, config_.layer_norm_epsilon));
  register_module("attn", std::make_shared<GPT2Attention>(config_));
  register_module("ln_2", std::make_shared<LayerNorm>(SizeVector{c}, config_.layer_norm_epsilon));
  register_module("mlp", std::make_shared<GPT2MLP>(config_));
}

Tensor GPT2Block::forward(const Tensor& x) {
  const double p = is_training() ? config_.dropout : 0.0;
  const Tensor h =
      x + functional::dropout((*child("attn"))((*child("ln_1"))(x)), p, is_training());
  return h + functional::dropout((*child("mlp"))((*child("ln_2"))(h)), p, is_training());
}

GPT2::GPT2(GPT2Config config) : config_(config) {
  CheckConfig(config_);
  reset();
}

void GPT2::reset() {
  auto wte = register_module("wte", std::make_shared<Embedding>(config_.vocab_size, config_.n_embd));
  auto wpe =
      register_module("wpe", std::make_shared<Embedding>(config_.n_positions, config_.n_embd));
  init::normal_(wte->weight(), 0.0, 0.02);
  init::normal_(wpe->weight(), 0.0, 0.01);
  auto h = register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < config_.n_layer; ++i) h->push_back(std::make_shared<GPT2Block>(config_));
  register_module("ln_f",
                  std::make_shared<LayerNorm>(SizeVector{config_.n_embd}, config_.layer_norm_epsilon));
}

Tensor GPT2::forward(const Tensor& input_ids) {
  EMBER_CHECK(input_ids.dtype() == kInt64 && (input_ids.dim() == 1 || input_ids.dim() == 2),
              "GPT2: input_ids must be int64 [batch, tokens] or [tokens], got ",
              std::string(dtype_name(input_ids.dtype())), " ", ShapeToString(input_ids.sizes()));
  const bool unbatched = input_ids.dim() == 1;
  const Tensor ids = unbatched ? input_ids.unsqueeze(0) : input_ids;
  const int64_t t = ids.size(1);
  EMBER_CHECK(t <= config_.n_positions, "GPT2: ", t, " tokens, more than n_positions (",
              config_.n_positions, ")");
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    EMBER_CHECK(lo >= 0 && hi < config_.vocab_size, "GPT2: token id ", lo < 0 ? lo : hi,
                " is outside the vocabulary [0, ", config_.vocab_size, ")");
  }
  const double p = is_training() ? config_.dropout : 0.0;
  const Tensor positions = arange(t, kInt64).to(ids.device());
  Tensor x = (*child("wte"))(ids) + (*child("wpe"))(positions);
  x = functional::dropout(x, p, is_training());
  x = (*child("h"))(x);
  x = (*child("ln_f"))(x);
  // The LM head is tied to the token embedding.
  Tensor logits = x.matmul(child("wte")->parameter("weight").t());
  return unbatched ? logits.squeeze(0) : logits;
}

absl::Status GPT2::load_hf_state_dict(const StateDict& state) {
  StateDict mine;
  Tensor lm_head;
  for (const auto& [key, t] : state) {
    std::string k = key;
    if (k.rfind("transformer.", 0) == 0) k = k.substr(12);
    if (k == "lm_head.weight") {
      lm_head = t;
      continue;
    }
    // The causal-mask buffers of older checkpoints: the mask is implied here.
    if (absl::EndsWith(k, ".attn.bias") || absl::EndsWith(k, ".attn.masked_bias")) continue;
    mine.push_back({k, t});
  }
  absl::Status loaded = load_state_dict(mine);
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT2: the checkpoint does not fit the config (n_layer ", config_.n_layer,
                     ", n_embd ", config_.n_embd, ", vocab_size ", config_.vocab_size,
                     "): ", loaded.message()));
  }
  if (lm_head.defined() && !lm_head.to(kFloat32).equal(
                               child("wte")->parameter("weight").detach().to(kFloat32))) {
    return absl::InvalidArgumentError(
        "GPT2: lm_head.weight differs from wte.weight, but GPT-2's head is tied to the token "
        "embedding; this is not a GPT-2 checkpoint");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GPT2>> GPT2::from_safetensors(const std::string& path,
                                                             GPT2Config config) {
  absl::StatusOr<StateDict> state = ember::load(path);
  if (!state.ok()) return state.status();
  auto model = std::make_shared<GPT2>(config);
  absl::Status loaded = model->load_hf_state_dict(*state);
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat(path, ": ", loaded.message()));
  }
  return model;
}

}  // namespace ember::nn::models
