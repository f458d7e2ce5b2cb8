// Normalisation layers: BatchNorm1d, BatchNorm2d and LayerNorm, as
// torch.nn's, and their functional forms.
//
//   ```cpp
//   #include "nn/normalization.h"
//   #include "tensor/factories.h"
//   auto bn = std::make_shared<ember::nn::BatchNorm2d>(64);
//   ember::Tensor x = ember::randn({8, 64, 4, 4});
//   ember::Tensor y = (*bn)(x);       // x [N, 64, H, W]; updates running stats
//   bn->eval();                       // now normalises with running stats
//   auto ln = std::make_shared<ember::nn::LayerNorm>(ember::SizeVector{512});
//   ember::Tensor z = (*ln)(ember::randn({2, 512}));
//   ```
//
// BatchNorm normalises each channel (dim 1) over the batch and every other
// dim: in training with the batch's biased variance, updating the buffers
// running_mean / running_var (with the unbiased variance) as
// (1 - momentum) * running + momentum * batch and counting
// num_batches_tracked; without momentum the running stats are a cumulative
// average. In eval mode (or with track_running_stats = false never) it uses
// the running stats. Defaults are PyTorch's: eps = 1e-5, momentum = 0.1,
// affine weight = 1 and bias = 0. LayerNorm normalises over the trailing
// `normalized_shape` dims with the biased variance. Backward passes are
// explicit kernels; under create_graph they are written in recorded tensor
// ops instead, so higher-order gradients work.
//
// Errors: shape mismatches and a training batch with one value per channel
// throw ember::Error. CPU, float32 and float64. Thread-safety: as Module
// (nn/module.h); training-mode forward writes the running buffers.
#ifndef EMBER_NN_NORMALIZATION_H_
#define EMBER_NN_NORMALIZATION_H_

#include <optional>
#include <string>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

struct BatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  // Unset: cumulative moving average (1 / num_batches_tracked).
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

namespace functional {
// input [N, C, *]; running_mean / running_var [C] or undefined (then
// `training` must be true); weight / bias [C] or undefined. In training mode
// with running stats given, they are updated in place with `momentum`.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);
// Normalises over the trailing dims given by normalized_shape; weight/bias
// have that shape or are undefined.
Tensor layer_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps = 1e-5);
}  // namespace functional

// Shared by BatchNorm1d and BatchNorm2d, which differ in the input ranks they
// accept ([N, C] or [N, C, L]; [N, C, H, W]).
class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  void reset_running_stats();
  void reset_parameters();

  const Tensor& weight() const { return parameter("weight"); }
  const Tensor& bias() const { return parameter("bias"); }
  const Tensor& running_mean() const { return buffer("running_mean"); }
  const Tensor& running_var() const { return buffer("running_var"); }
  const Tensor& num_batches_tracked() const { return buffer("num_batches_tracked"); }
  const BatchNormOptions& options() const { return options_; }

 protected:
  explicit BatchNormBase(BatchNormOptions options) : options_(options) {}
  BatchNormBase(const BatchNormBase&) = default;
  void RegisterState();
  virtual void CheckInputDim(const Tensor& input) const = 0;
  std::string extra_repr() const override;

 private:
  BatchNormOptions options_;
};

class BatchNorm1d : public Cloneable<BatchNorm1d, BatchNormBase> {
 public:
  explicit BatchNorm1d(BatchNormOptions options);
  explicit BatchNorm1d(int64_t num_features) : BatchNorm1d(BatchNormOptions{num_features}) {}
  void reset() override { RegisterState(); }

 protected:
  void CheckInputDim(const Tensor& input) const override;
};

class BatchNorm2d : public Cloneable<BatchNorm2d, BatchNormBase> {
 public:
  explicit BatchNorm2d(BatchNormOptions options);
  explicit BatchNorm2d(int64_t num_features) : BatchNorm2d(BatchNormOptions{num_features}) {}
  void reset() override { RegisterState(); }

 protected:
  void CheckInputDim(const Tensor& input) const override;
};

// bias = false (torch's LayerNorm(..., bias=False)) keeps the weight and no
// bias.
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(SizeVector normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, bool bias = true);

  void reset() override;
  void reset_parameters();
  Tensor forward(const Tensor& input) override;

  const Tensor& weight() const { return parameter("weight"); }
  const Tensor& bias() const { return parameter("bias"); }

 protected:
  std::string extra_repr() const override;

 private:
  SizeVector normalized_shape_;
  double eps_;
  bool elementwise_affine_;
  bool bias_ = true;
};

}  // namespace ember::nn

#endif  // EMBER_NN_NORMALIZATION_H_
