// Activation modules: ReLU, GELU, Tanh, Sigmoid, as torch.nn's.
//
//   ```cpp
//   #include "nn/activation.h"
//   #include "tensor/factories.h"
//   ember::Tensor x = ember::randn({2, 3});
//   auto act = std::make_shared<ember::nn::ReLU>();
//   ember::Tensor y = (*act)(x);          // same as x.relu()
//   ```
//
// GELU, Tanh and Sigmoid wrap the tensor ops of the same name, whose
// derivatives the autograd layer provides. ReLU runs functional::relu: on
// contiguous float32/float64 CPU tensors a custom Function with one-pass
// forward and backward kernels (the backward masks the gradient where the
// output is positive, PyTorch's threshold_backward), elsewhere Tensor::relu.
// They have no parameters. Errors: as the tensor ops (throw ember::Error).
// Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_ACTIVATION_H_
#define EMBER_NN_ACTIVATION_H_

#include <string>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

namespace functional {
Tensor relu(const Tensor& input);
// torch.nn.functional.gelu: approximate "none" (the erf form) or "tanh"
// (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), GPT-2's "gelu_new").
// Anything else throws ember::Error naming it, as torch's ValueError.
Tensor gelu(const Tensor& input, const std::string& approximate = "none");
}  // namespace functional

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() = default;
  void reset() override {}
  Tensor forward(const Tensor& input) override { return functional::relu(input); }
};

// torch.nn.GELU(approximate): the exact (erf) form by default, or "tanh".
class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(std::string approximate = "none");
  void reset() override {}
  Tensor forward(const Tensor& input) override {
    return functional::gelu(input, approximate_);
  }
  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_;
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tanh() = default;
  void reset() override {}
  Tensor forward(const Tensor& input) override { return input.tanh(); }
};

class Sigmoid : public Cloneable<Sigmoid> {
 public:
  Sigmoid() = default;
  void reset() override {}
  Tensor forward(const Tensor& input) override { return input.sigmoid(); }
};

}  // namespace ember::nn

#endif  // EMBER_NN_ACTIVATION_H_
