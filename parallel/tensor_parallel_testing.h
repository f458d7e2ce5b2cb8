// The models tensor parallelism's tests (and its benchmark) share
// (testonly): a Linear -> GELU -> Linear MLP and a one-layer
// pre-LayerNorm transformer block whose attention reads its head count from
// the projections' local width, so that column-sharded q/k/v give each rank
// its heads. The same models are written in parallel/testdata/torch_tp.py.
//
//   auto block = std::make_shared<ember::parallel::testing::Block>(8, 2, 16);
//   ember::Tensor y = (*block)(ember::randn({2, 4, 8}));  // [batch, sequence, dim]
//
// Thread-safety: as nn::Module.
#ifndef EMBER_PARALLEL_TENSOR_PARALLEL_TESTING_H_
#define EMBER_PARALLEL_TENSOR_PARALLEL_TESTING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "tensor/tensor.h"

namespace ember::parallel::testing {

// Sequential(Linear(dim, hidden), GELU(), Linear(hidden, dim)): "0", "1", "2".
inline std::shared_ptr<nn::Sequential> MakeMlp(int64_t dim, int64_t hidden) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(dim, hidden), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(hidden, dim)});
}

// Multi-head self-attention over [B, S, dim]: q, k, v, o projections.
class Attention : public nn::Cloneable<Attention> {
 public:
  Attention(int64_t dim, int64_t head_dim) : dim_(dim), head_dim_(head_dim) { reset(); }
  void reset() override {
    q = register_module("q", std::make_shared<nn::Linear>(dim_, dim_));
    k = register_module("k", std::make_shared<nn::Linear>(dim_, dim_));
    v = register_module("v", std::make_shared<nn::Linear>(dim_, dim_));
    o = register_module("o", std::make_shared<nn::Linear>(dim_, dim_));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.size(0);
    const int64_t s = x.size(1);
    auto heads = [&](const Tensor& t) {  // [B, S, H*hd] -> [B, H, S, hd]
      return t.reshape({b, s, t.size(2) / head_dim_, head_dim_}).transpose(1, 2);
    };
    Tensor qh = heads((*q)(x));
    Tensor kh = heads((*k)(x));
    Tensor vh = heads((*v)(x));
    Tensor a = nn::functional::scaled_dot_product_attention(qh, kh, vh);
    return (*o)(a.transpose(1, 2).reshape({b, s, qh.size(1) * head_dim_}));
  }
  std::shared_ptr<nn::Linear> q, k, v, o;

 private:
  int64_t dim_;
  int64_t head_dim_;
};

// x + attn(ln1(x)), then h + fc2(gelu(fc1(ln2(h)))).
class Block : public nn::Cloneable<Block> {
 public:
  Block(int64_t dim, int64_t head_dim, int64_t hidden)
      : dim_(dim), head_dim_(head_dim), hidden_(hidden) {
    reset();
  }
  void reset() override {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(SizeVector{dim_}));
    attn = register_module("attn", std::make_shared<Attention>(dim_, head_dim_));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(SizeVector{dim_}));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(dim_, hidden_));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden_, dim_));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + (*attn)((*ln1)(x));
    return h + (*fc2)((*fc1)((*ln2)(h)).gelu());
  }
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<nn::Linear> fc1, fc2;

 private:
  int64_t dim_;
  int64_t head_dim_;
  int64_t hidden_;
};

}  // namespace ember::parallel::testing

#endif  // EMBER_PARALLEL_TENSOR_PARALLEL_TESTING_H_
