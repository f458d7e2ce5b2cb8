// Linear: y = x W^T + b, as torch.nn.Linear, and its functional form.
//
//   ```cpp
//   #include "nn/linear.h"
//   #include "tensor/factories.h"
//   auto fc = std::make_shared<ember::nn::Linear>(512, 10);
//   ember::Tensor x = ember::randn({4, 512});
//   ember::Tensor y = (*fc)(x);                 // x [*, 512] -> y [*, 10]
//   ember::Tensor z = ember::nn::functional::linear(x, fc->weight(), fc->bias());  // == y
//   ```
//
// weight is [out_features, in_features] and bias [out_features] (absent with
// bias = false). Both are initialised as PyTorch does:
// kaiming_uniform_(weight, a = sqrt(5)) and bias uniform in
// [-1/sqrt(in_features), 1/sqrt(in_features)].
//
// The product runs as one GEMM (bias broadcast into the output first); its
// backward is explicit: grad_input = grad W, grad_weight = grad^T x and
// grad_bias = the column sums of grad, each computed only when needed.
//
// Errors: shape, dtype and device mismatches throw ember::Error. Thread-safety:
// as Module (nn/module.h).
#ifndef EMBER_NN_LINEAR_H_
#define EMBER_NN_LINEAR_H_

#include <cstdint>
#include <string>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

namespace functional {
// input [*, in], weight [out, in], bias [out] or undefined -> [*, out].
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());
}  // namespace functional

class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);

  void reset() override;
  // Draws new weights and bias (PyTorch's default initialisation).
  void reset_parameters();
  Tensor forward(const Tensor& input) override;

  const Tensor& weight() const { return parameter("weight"); }
  // Undefined when built with bias = false.
  const Tensor& bias() const { return parameter("bias"); }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t in_features_;
  int64_t out_features_;
  bool has_bias_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_LINEAR_H_
