// Parameter initialisation, as torch.nn.init: fills a tensor in place (without
// recording a graph) and returns it.
//
//   ```cpp
//   #include "nn/init.h"
//   #include "tensor/factories.h"
//   ember::Tensor w = ember::empty({128, 64});
//   ember::nn::init::kaiming_normal_(w, 0, ember::nn::init::FanMode::kFanOut,
//                                    ember::nn::init::Nonlinearity::kReLU);
//   ember::Tensor bias = ember::empty({128});
//   ember::nn::init::zeros_(bias);
//   ```
//
// Formulas and defaults are PyTorch's: xavier_* use
// std = gain * sqrt(2 / (fan_in + fan_out)); kaiming_* use
// std = gain / sqrt(fan) with gain = calculate_gain(nonlinearity, a); the
// uniform variants draw from [-sqrt(3) * std, sqrt(3) * std]. Linear and
// Conv2d reset their parameters with kaiming_uniform_(weight, sqrt(5)) and a
// bias uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)], as PyTorch does. Numbers
// come from `gen` or the default generator (ember::manual_seed), so they are
// reproducible but differ from PyTorch's.
//
// Errors: a tensor with fewer than 2 dims has no fan in/out; those functions
// throw ember::Error, as PyTorch raises. Thread-safe (the default generator is
// locked).
#ifndef EMBER_NN_INIT_H_
#define EMBER_NN_INIT_H_

#include <optional>
#include <utility>

#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn::init {

enum class Nonlinearity {
  kLinear,
  kConv1d,
  kConv2d,
  kConv3d,
  kSigmoid,
  kTanh,
  kReLU,
  kLeakyReLU,
  kSELU,
};
enum class FanMode { kFanIn, kFanOut };

// torch.nn.init.calculate_gain: 1 for linear/conv/sigmoid, 5/3 for tanh,
// sqrt(2) for relu, sqrt(2 / (1 + slope^2)) for leaky_relu (slope = `param`,
// default 0.01), 3/4 for selu.
double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param = std::nullopt);

// {fan_in, fan_out}: size(1) and size(0) times the receptive field (the
// product of the remaining dims). Throws for tensors with fewer than 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

Tensor uniform_(const Tensor& tensor, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
Tensor normal_(const Tensor& tensor, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor constant_(const Tensor& tensor, double value);
Tensor zeros_(const Tensor& tensor);
Tensor ones_(const Tensor& tensor);

Tensor xavier_uniform_(const Tensor& tensor, double gain = 1.0, Generator* gen = nullptr);
Tensor xavier_normal_(const Tensor& tensor, double gain = 1.0, Generator* gen = nullptr);
Tensor kaiming_uniform_(const Tensor& tensor, double a = 0.0, FanMode mode = FanMode::kFanIn,
                        Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU,
                        Generator* gen = nullptr);
Tensor kaiming_normal_(const Tensor& tensor, double a = 0.0, FanMode mode = FanMode::kFanIn,
                       Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU,
                       Generator* gen = nullptr);

}  // namespace ember::nn::init

#endif  // EMBER_NN_INIT_H_
