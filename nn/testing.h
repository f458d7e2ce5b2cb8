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
//
// ExpectSecondDerivativesMatch is the same check one order up (PyTorch's
// gradgradcheck): the first derivatives, recorded with create_graph=true for
// a fixed random output gradient v, are themselves checked against finite
// differences with respect to the inputs and v. Since a recorded backward may
// take another path than the plain one, the recorded first derivatives must
// also equal the plain ones, which are checked against finite differences of
// fn. A first derivative that is not recorded (detached from the graph) is a
// failure, not a skipped check.
#ifndef EMBER_NN_TESTING_H_
#define EMBER_NN_TESTING_H_

#include <cmath>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
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

// Checks every input's gradient of fn (inputs must be float64).
inline void ExpectGradientsMatch(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                 std::vector<Tensor> inputs) {
  for (Tensor& t : inputs) {
    t = t.detach().clone();
    t.requires_grad_(true);
  }
  absl::Status s = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }, inputs);
  EXPECT_TRUE(s.ok()) << "gradient check failed: " << s;
}

// Checks the first and second derivatives of fn (inputs must be float64): the
// plain gradients against finite differences of fn, the recorded gradients
// (weighted by a random v) against the plain ones, and the gradients of the
// recorded gradients against their finite differences (every input and v).
inline void ExpectSecondDerivativesMatch(
    const std::function<Tensor(const std::vector<Tensor>&)>& fn, std::vector<Tensor> inputs) {
  for (Tensor& t : inputs) {
    t = t.detach().clone();
    t.requires_grad_(true);
  }
  const size_t n = inputs.size();
  {
    autograd::NoGradGuard no_grad;
    Tensor v = randn(fn(inputs).sizes(), TensorOptions(kFloat64));
    v.requires_grad_(true);
    inputs.push_back(v);
  }
  bool detached = false;
  auto first_order = [&](const std::vector<Tensor>& in) {
    // The checker evaluates without grad; the first derivatives need a graph.
    autograd::EnableGradGuard enable_grad;
    std::vector<Tensor> wrt(in.begin(), in.begin() + n);
    std::vector<Tensor> grads = autograd::grad({fn(wrt)}, wrt, {in[n]}, /*retain_graph=*/true,
                                               /*create_graph=*/true, /*allow_unused=*/true);
    for (Tensor& g : grads) {
      if (!g.defined()) continue;
      if (!g.requires_grad()) detached = true;
    }
    return grads;
  };
  const std::vector<Tensor> wrt(inputs.begin(), inputs.begin() + n);
  absl::Status first = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }, wrt);
  EXPECT_TRUE(first.ok()) << "gradient check failed: " << first;
  const std::vector<Tensor> plain = autograd::grad({fn(wrt)}, wrt, {inputs[n]}, std::nullopt,
                                                   /*create_graph=*/false, /*allow_unused=*/true);
  const std::vector<Tensor> recorded = first_order(inputs);
  for (size_t i = 0; i < n; ++i) {
    if (!plain[i].defined() || !recorded[i].defined()) {
      EXPECT_EQ(plain[i].defined(), recorded[i].defined())
          << "the recorded and plain gradients of input " << i << " differ in being defined";
      continue;
    }
    const std::vector<double> a = Values(plain[i]), b = Values(recorded[i]);
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) {
      EXPECT_NEAR(a[j], b[j], 1e-9 * (1 + std::abs(a[j])))
          << "the recorded gradient of input " << i << " element " << j
          << " differs from the plain one";
    }
  }
  // A detached first derivative has no second derivative to compare (the
  // checker would only report its zero Jacobian again): say what is wrong.
  if (detached) {
    ADD_FAILURE() << "a first derivative was not recorded with create_graph=true";
    return;
  }
  absl::Status s = autograd::gradcheck(first_order, inputs);
  EXPECT_TRUE(s.ok()) << "second-derivative check failed: " << s;
}

}  // namespace ember::nn::testing

#endif  // EMBER_NN_TESTING_H_
