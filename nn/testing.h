// Test helpers for nn (testonly): a finite-difference check of the
// gradients that backward() computes, and plain readers of tensor values.
//
//   ember::nn::testing::ExpectGradientsMatch(
//       [](const std::vector<ember::Tensor>& in) { return conv2d(in[0], in[1]); },
//       {ember::randn({2, 3, 5, 5}, ember::kFloat64), ember::randn({4, 3, 3, 3},
//       ember::kFloat64)});
//
// The check reduces the function's output to a scalar with fixed random
// weights, runs backward once, and compares every input's gradient with
// central differences (float64, step 1e-6), as torch.autograd.gradcheck
// does for one random direction of the output.
#ifndef EMBER_NN_TESTING_H_
#define EMBER_NN_TESTING_H_

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/grad_mode.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember::nn::testing {

// The elements of a tensor in row-major order, as doubles.
inline std::vector<double> Values(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// Checks d(sum(fn(inputs) * w))/d(input) for every float64 input.
inline void ExpectGradientsMatch(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                 std::vector<Tensor> inputs, double atol = 1e-6,
                                 double rtol = 1e-4) {
  for (Tensor& t : inputs) {
    ASSERT_EQ(t.dtype(), kFloat64) << "gradient checks run in float64";
    t = t.detach().contiguous().clone();
    t.requires_grad_(true);
  }
  Generator gen(1234);
  Tensor out = fn(inputs);
  Tensor weights = randn(out.sizes(), TensorOptions(kFloat64), &gen);
  (out * weights).sum().backward();

  auto objective = [&]() {
    autograd::NoGradGuard no_grad;
    return (fn(inputs) * weights).sum().item<double>();
  };
  const double eps = 1e-6;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor analytic = inputs[i].grad();
    ASSERT_TRUE(analytic.defined()) << "input " << i << " got no gradient";
    std::vector<double> got = Values(analytic);
    double* p = inputs[i].data_ptr<double>();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + eps;
      const double plus = objective();
      p[j] = saved - eps;
      const double minus = objective();
      p[j] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(got[j], numeric, atol + rtol * std::abs(numeric))
          << "input " << i << ", element " << j;
    }
  }
}

}  // namespace ember::nn::testing

#endif  // EMBER_NN_TESTING_H_
