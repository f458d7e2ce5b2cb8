#include "nn/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/error.h"

namespace ember::nn::init {
namespace {

double Fan(const Tensor& tensor, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return static_cast<double>(mode == FanMode::kFanIn ? fan_in : fan_out);
}

double KaimingStd(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                  const char* fn) {
  const double fan = Fan(tensor, mode);
  EMBER_CHECK(fan > 0, fn, ": cannot initialise a tensor of shape ", ShapeToString(tensor.sizes()),
              " because its fan is 0");
  return calculate_gain(nonlinearity, a) / std::sqrt(fan);
}

double XavierStd(const Tensor& tensor, double gain, const char* fn) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  EMBER_CHECK(fan_in + fan_out > 0, fn, ": cannot initialise a tensor of shape ",
              ShapeToString(tensor.sizes()), " because fan_in + fan_out is 0");
  return gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kConv1d:
    case Nonlinearity::kConv2d:
    case Nonlinearity::kConv3d:
    case Nonlinearity::kSigmoid:
      return 1.0;
    case Nonlinearity::kTanh:
      return 5.0 / 3.0;
    case Nonlinearity::kReLU:
      return std::sqrt(2.0);
    case Nonlinearity::kLeakyReLU: {
      const double slope = param.value_or(0.01);
      return std::sqrt(2.0 / (1.0 + slope * slope));
    }
    case Nonlinearity::kSELU:
      return 3.0 / 4.0;
  }
  EMBER_FAIL("calculate_gain: unknown nonlinearity ", static_cast<int>(nonlinearity));
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  EMBER_CHECK(tensor.dim() >= 2,
              "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions "
              "(got shape ",
              ShapeToString(tensor.sizes()), ")");
  int64_t receptive = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive *= tensor.size(d);
  return {tensor.size(1) * receptive, tensor.size(0) * receptive};
}

Tensor uniform_(const Tensor& tensor, double a, double b, Generator* gen) {
  autograd::NoGradGuard no_grad;
  return ember::uniform_(tensor, a, b, gen);
}

Tensor normal_(const Tensor& tensor, double mean, double std, Generator* gen) {
  autograd::NoGradGuard no_grad;
  return ember::normal_(tensor, mean, std, gen);
}

Tensor constant_(const Tensor& tensor, double value) {
  autograd::NoGradGuard no_grad;
  return tensor.fill_(value);
}

Tensor zeros_(const Tensor& tensor) { return constant_(tensor, 0.0); }
Tensor ones_(const Tensor& tensor) { return constant_(tensor, 1.0); }

Tensor xavier_uniform_(const Tensor& tensor, double gain, Generator* gen) {
  const double bound = std::sqrt(3.0) * XavierStd(tensor, gain, "xavier_uniform_");
  return init::uniform_(tensor, -bound, bound, gen);
}

Tensor xavier_normal_(const Tensor& tensor, double gain, Generator* gen) {
  return init::normal_(tensor, 0.0, XavierStd(tensor, gain, "xavier_normal_"), gen);
}

Tensor kaiming_uniform_(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                        Generator* gen) {
  if (tensor.numel() == 0) return tensor;  // As PyTorch: a no-op.
  const double bound =
      std::sqrt(3.0) * KaimingStd(tensor, a, mode, nonlinearity, "kaiming_uniform_");
  return init::uniform_(tensor, -bound, bound, gen);
}

Tensor kaiming_normal_(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                       Generator* gen) {
  if (tensor.numel() == 0) return tensor;
  return init::normal_(tensor, 0.0, KaimingStd(tensor, a, mode, nonlinearity, "kaiming_normal_"),
                       gen);
}

}  // namespace ember::nn::init
