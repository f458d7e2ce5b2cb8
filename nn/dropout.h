// Dropout: during training, zeroes each element with probability p and
// scales the rest by 1 / (1 - p), as torch.nn.Dropout; the identity in eval
// mode.
//
//   ```cpp
//   #include "nn/dropout.h"
//   #include "tensor/factories.h"
//   auto drop = std::make_shared<ember::nn::Dropout>(0.5);
//   ember::Tensor y = (*drop)(ember::ones({8}));   // training mode: each 0 or 2
//   drop->eval();
//   ember::Tensor same = (*drop)(ember::ones({8}));  // the identity
//   ```
//
// The mask is drawn by bernoulli_ where the input lives, from that device's
// default generator unless one is given (a CUDA input's from the device's
// Philox generator, never on the host), so manual_seed makes it
// reproducible. The gradient flows through the same mask (a product recorded
// by autograd). Errors: p outside [0, 1] throws
// ember::Error. Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_DROPOUT_H_
#define EMBER_NN_DROPOUT_H_

#include <string>

#include "nn/module.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn {

namespace functional {
Tensor dropout(const Tensor& input, double p = 0.5, bool training = true, Generator* gen = nullptr);
}  // namespace functional

class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  void reset() override {}
  Tensor forward(const Tensor& input) override {
    return functional::dropout(input, p_, is_training());
  }

 protected:
  std::string extra_repr() const override;

 private:
  double p_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_DROPOUT_H_
