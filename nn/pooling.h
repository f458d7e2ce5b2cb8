// Pooling over [N, C, H, W] (or [C, H, W]) inputs: MaxPool2d, AvgPool2d and
// AdaptiveAvgPool2d, as torch.nn's, and their functional forms.
//
//   ```cpp
//   #include "nn/pooling.h"
//   #include "tensor/factories.h"
//   auto pool = std::make_shared<ember::nn::MaxPool2d>(
//       ember::nn::MaxPool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2},
//                                   .padding = {1, 1}});
//   auto gap = std::make_shared<ember::nn::AdaptiveAvgPool2d>(ember::nn::Int2{1, 1});
//   ember::Tensor x = ember::randn({2, 8, 16, 16});
//   ember::Tensor y = (*gap)((*pool)(x));  // [2, 8, 16, 16] -> [2, 8, 8, 8] -> [2, 8, 1, 1]
//   ```
//
// Output sizes follow PyTorch, including ceil_mode (a last window that starts
// inside the padded input is kept) and the rule that padding is at most half
// the kernel. A stride of {0, 0} means "the kernel size", PyTorch's default.
// Max pooling propagates NaN and its gradient goes to the first maximum of each
// window; average pooling counts padding in the divisor unless
// count_include_pad is false; adaptive pooling averages the windows
// [floor(i * in / out), ceil((i + 1) * in / out)). The backward passes are
// explicit kernels, recorded under create_graph as functions whose own
// backward is known, so higher-order gradients work.
//
// Errors: bad options and shapes throw ember::Error. CPU, float32 and
// float64. Thread-safety: as Module (nn/module.h).
#ifndef EMBER_NN_POOLING_H_
#define EMBER_NN_POOLING_H_

#include <string>

#include "nn/conv.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace ember::nn {

struct MaxPool2dOptions {
  Int2 kernel_size = {1, 1};
  Int2 stride = {0, 0};  // {0, 0}: kernel_size
  Int2 padding = {0, 0};
  Int2 dilation = {1, 1};
  bool ceil_mode = false;
};

struct AvgPool2dOptions {
  Int2 kernel_size = {1, 1};
  Int2 stride = {0, 0};  // {0, 0}: kernel_size
  Int2 padding = {0, 0};
  bool ceil_mode = false;
  bool count_include_pad = true;
};

namespace functional {
Tensor max_pool2d(const Tensor& input, const MaxPool2dOptions& options);
Tensor avg_pool2d(const Tensor& input, const AvgPool2dOptions& options);
Tensor adaptive_avg_pool2d(const Tensor& input, Int2 output_size);
}  // namespace functional

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(MaxPool2dOptions options) : options_(options) {}
  // Square kernel; stride defaults to the kernel size.
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0)
      : options_{.kernel_size = {kernel_size, kernel_size},
                 .stride = {stride, stride},
                 .padding = {padding, padding}} {}
  void reset() override {}
  Tensor forward(const Tensor& input) override { return functional::max_pool2d(input, options_); }

 protected:
  std::string extra_repr() const override;

 private:
  MaxPool2dOptions options_;
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(AvgPool2dOptions options) : options_(options) {}
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0)
      : options_{.kernel_size = {kernel_size, kernel_size},
                 .stride = {stride, stride},
                 .padding = {padding, padding}} {}
  void reset() override {}
  Tensor forward(const Tensor& input) override { return functional::avg_pool2d(input, options_); }

 protected:
  std::string extra_repr() const override;

 private:
  AvgPool2dOptions options_;
};

class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(Int2 output_size) : output_size_(output_size) {}
  void reset() override {}
  Tensor forward(const Tensor& input) override {
    return functional::adaptive_avg_pool2d(input, output_size_);
  }

 protected:
  std::string extra_repr() const override;

 private:
  Int2 output_size_;
};

}  // namespace ember::nn

#endif  // EMBER_NN_POOLING_H_
