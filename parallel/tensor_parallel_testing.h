// The models tensor parallelism's tests (and its benchmark) share
// (testonly): a Linear -> GELU -> Linear MLP and a one-layer
// pre-LayerNorm transformer block (nn/models/gpt.h) whose attention reads
// its head count from the projections' local width, so that column-sharded
// q/k/v give each rank its heads. The same models are written in
// parallel/testdata/torch_tp.py.
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
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/models/gpt.h"
#include "nn/module.h"

namespace ember::parallel::testing {

// Sequential(Linear(dim, hidden), GELU(), Linear(hidden, dim)): "0", "1", "2".
inline std::shared_ptr<nn::Sequential> MakeMlp(int64_t dim, int64_t hidden) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(dim, hidden), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(hidden, dim)});
}

// Multi-head self-attention over [B, S, dim] with q, k, v, o projections,
// and the pre-LayerNorm block around it (nn/models/gpt.h's; not causal
// unless asked).
using Attention = nn::models::SelfAttention;
using Block = nn::models::TransformerBlock;

}  // namespace ember::parallel::testing

#endif  // EMBER_PARALLEL_TENSOR_PARALLEL_TESTING_H_
