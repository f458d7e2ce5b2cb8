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
// The product runs as one GEMM with the bias added (cuBLASLt's bias
// epilogue on CUDA); its backward is explicit: grad_input = grad W, and
// grad_weight = grad^T x with grad_bias = the column sums of grad in one
// call (cuBLASLt's bias-gradient epilogue on CUDA), each computed only when
// needed.
//
// Note [Linear and its activation]
// functional::linear_activation(x, w, b, act) is relu(linear(x, w, b)) or
// gelu(linear(x, w, b), "tanh") as one op, gemm_bias_act_out: on CUDA one
// cuBLASLt GEMM whose epilogue adds the bias and applies the activation
// (RELU_BIAS; GELU_AUX_BIAS, which also keeps the pre-activation for the
// backward), so the activation costs no kernel and no pass over the output
// of its own; elsewhere the GEMM and the activation as before. A
// Sequential calls it for a Linear with a bias followed by a ReLU or a
// GELU("tanh"), where fuses_linear_activation(device) says the device has
// the fused kernel and neither module has hooks (container.h); the values
// are the separate calls' up to the GEMM's rounding. GELU's exact (erf)
// form has no cuBLASLt epilogue and is never fused.
//
// Errors: shape, dtype and device mismatches throw ember::Error. Thread-safety:
// as Module (nn/module.h).
#ifndef EMBER_NN_LINEAR_H_
#define EMBER_NN_LINEAR_H_

#include <cstdint>
#include <string>

#include "nn/module.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace ember::nn {

namespace functional {
// input [*, in], weight [out, in], bias [out] or undefined -> [*, out].
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

// The activations linear_activation applies: ReLU, and GELU's tanh form
// (torch's gelu(approximate="tanh")).
enum class LinearActivation { kReLU, kGeluTanh };

// activation(linear(input, weight, bias)) as one op (Note [Linear and its
// activation]); bias must be defined.
Tensor linear_activation(const Tensor& input, const Tensor& weight, const Tensor& bias,
                         LinearActivation activation);

// Whether `device`'s kernels fuse linear_activation (CUDA's do), so that
// calling it beats the two calls.
bool fuses_linear_activation(Device device);
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
