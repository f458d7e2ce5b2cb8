// Test helpers for nn (testonly): the gradient check of the layer tests, and
// a plain reader of tensor values.
//
//   ember::nn::testing::ExpectGradientsMatch(
//       [](const std::vector<ember::Tensor>& in) { return conv2d(in[0], in[1]); },
//       {ember::randn({2, 3, 5, 5}, ember::kFloat64), ember::randn({4, 3, 3, 3},
//       ember::kFloat64)});
//
// ExpectGradientsMatch runs autograd's gradient checker (autograd/gradcheck.h:
// the full Jacobian against central finite differences in float64) on fresh
// leaf copies of the inputs and records a test failure naming the mismatch.
#ifndef EMBER_NN_TESTING_H_
#define EMBER_NN_TESTING_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "autograd/gradcheck.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace ember::nn::testing {

// The elements of a tensor in row-major order, as doubles.
inline std::vector<double> Values(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// Checks every input's gradient of fn (inputs must be float64).
inline void ExpectGradientsMatch(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                 std::vector<Tensor> inputs) {
  for (Tensor& t : inputs) {
    t = t.detach().clone();
    t.requires_grad_(true);
  }
  absl::Status s = autograd::Gradcheck(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }, inputs);
  EXPECT_TRUE(s.ok()) << "gradient check failed: " << s;
}

}  // namespace ember::nn::testing

#endif  // EMBER_NN_TESTING_H_
