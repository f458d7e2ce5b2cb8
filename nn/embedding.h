// Embedding: a lookup table of num_embeddings vectors of size embedding_dim,
// as torch.nn.Embedding, and its functional form.
//
//   ```cpp
//   #include "nn/embedding.h"
//   #include "tensor/factories.h"
//   auto emb = std::make_shared<ember::nn::Embedding>(1000, 64);
//   ember::Tensor ids = ember::tensor({3, 1, 4}).view({1, 3});   // int64
//   ember::Tensor v = (*emb)(ids);                               // [1, 3, 64]
//   ```
//
// The weight starts as N(0, 1) (with row padding_idx zeroed) as PyTorch does.
// The gradient of a row is the sum of the output gradients of every lookup of
// it (dense); the padding_idx row gets none. Indices must be int64 (or
// int32) in [0, num_embeddings); others throw ember::Error ("index out of
// range in self", naming the index). float32 and float64 tables, on the
// CPU or a CUDA device (whose kernels nn/cuda registers; //:ember links it).
// Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_EMBEDDING_H_
#define EMBER_NN_EMBEDDING_H_

#include <optional>
#include <string>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

namespace functional {
// indices [*] -> [*, embedding_dim].
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);
}  // namespace functional

class Embedding : public Cloneable<Embedding> {
 public:
  // A negative padding_idx counts from the end, as in PyTorch.
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);

  void reset() override;
  void reset_parameters();
  Tensor forward(const Tensor& indices) override;

  const Tensor& weight() const { return parameter("weight"); }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
  std::optional<int64_t> padding_idx_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_EMBEDDING_H_
