// Conv2d: 2-D convolution (cross-correlation) over [N, C, H, W] inputs, as
// torch.nn.Conv2d, and its functional form.
//
//   ```cpp
//   #include "nn/conv.h"
//   #include "tensor/factories.h"
//   auto conv = std::make_shared<ember::nn::Conv2d>(ember::nn::Conv2dOptions{
//       .in_channels = 3, .out_channels = 64, .kernel_size = {7, 7},
//       .stride = {2, 2}, .padding = {3, 3}, .bias = false});
//   ember::Tensor x = ember::randn({1, 3, 32, 32});
//   ember::Tensor y = (*conv)(x);     // [N, 3, 32, 32] -> [N, 64, 16, 16]
//   ```
//
// Output size per spatial dim: (in + 2 * padding - dilation * (kernel - 1) - 1)
// / stride + 1, as PyTorch. Groups divide channels into independent blocks
// (in_channels and out_channels must both be divisible by groups). The weight
// is [out_channels, in_channels / groups, kh, kw]; weight and bias are
// initialised as PyTorch does (kaiming_uniform_(weight, a = sqrt(5)), bias
// uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)]).
//
// Note [Convolution as GEMM]
// float32 convolutions run on oneDNN's primitives (Note [oneDNN kernels] in
// nn/onednn.h); float64 ones, and float32 ones with EMBER_ONEDNN=0, run
// nn's own kernels below. Each sample is unfolded (im2col) into a [C/groups * kh * kw, OH * OW] matrix
// per group, and the output is one GEMM with the weight matrix through the
// tensor core's gemm_out (OpenBLAS for float32/float64); the bias is written
// into the output first and the GEMM accumulates on it. Backward recomputes
// the unfolding rather than keeping it: grad_weight accumulates
// grad_out @ cols^T over the batch, grad_input folds W^T @ grad_out back
// (col2im), grad_bias sums grad_out over batch and space. Only one sample's
// unfolding is alive at a time, so memory stays at one [C*kh*kw, OH*OW]
// matrix. Under create_graph the backward is recorded as convolutions, so
// higher-order gradients work (Note [Convolution double backward]).
//
// Errors: bad options and shape/dtype/device mismatches throw ember::Error.
// CPU, float32 and float64. Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_CONV_H_
#define EMBER_NN_CONV_H_

#include <array>
#include <cstdint>
#include <string>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

using Int2 = std::array<int64_t, 2>;

struct Conv2dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Int2 kernel_size = {1, 1};
  Int2 stride = {1, 1};
  Int2 padding = {0, 0};
  Int2 dilation = {1, 1};
  int64_t groups = 1;
  bool bias = true;
};

namespace functional {
// input [N, C, H, W] (or [C, H, W]), weight [O, C / groups, kh, kw], bias [O]
// or undefined.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              Int2 stride = {1, 1}, Int2 padding = {0, 0}, Int2 dilation = {1, 1},
              int64_t groups = 1);
}  // namespace functional

// The two backward convolutions on their own, as torch.nn.grad's:
// conv2d_input is the gradient of conv2d with respect to an input of shape
// `input_size`, conv2d_weight with respect to a weight of shape
// `weight_size`, given grad_output. Recorded, so they differentiate again.
namespace grad {
Tensor conv2d_input(IntArrayRef input_size, const Tensor& weight, const Tensor& grad_output,
                    Int2 stride = {1, 1}, Int2 padding = {0, 0}, Int2 dilation = {1, 1},
                    int64_t groups = 1);
Tensor conv2d_weight(const Tensor& input, IntArrayRef weight_size, const Tensor& grad_output,
                     Int2 stride = {1, 1}, Int2 padding = {0, 0}, Int2 dilation = {1, 1},
                     int64_t groups = 1);
}  // namespace grad

class Conv2d : public Cloneable<Conv2d> {
 public:
  explicit Conv2d(Conv2dOptions options);
  // Square kernel, stride and padding.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0);

  void reset() override;
  void reset_parameters();
  Tensor forward(const Tensor& input) override;

  const Tensor& weight() const { return parameter("weight"); }
  const Tensor& bias() const { return parameter("bias"); }
  const Conv2dOptions& options() const { return options_; }

 protected:
  std::string extra_repr() const override;

 private:
  Conv2dOptions options_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_CONV_H_
