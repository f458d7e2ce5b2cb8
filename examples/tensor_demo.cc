// Ember's flagship example (for now): fits a linear model y = X w + b to noisy
// synthetic data with plain tensor math, showing factories with a fixed seed,
// broadcasting, matmul, reductions and printing.
//
//   bazel run //examples:tensor_demo
#include <iostream>

#include "tensor/factories.h"
#include "tensor/tensor.h"

int main() {
  using ember::Tensor;
  ember::manual_seed(0);

  // 256 samples of 3 features; the true model is w = [2, -1, 0.5], b = 3.
  const int64_t n = 256;
  Tensor true_w = ember::tensor({2.0f, -1.0f, 0.5f}).view({3, 1});
  Tensor x = ember::randn({n, 3});
  Tensor y = x.matmul(true_w) + 3.0f + ember::randn({n, 1}) * 0.1f;

  // Gradient descent on the mean squared error, gradients written out by hand.
  Tensor w = ember::zeros({3, 1});
  Tensor b = ember::zeros({1});
  const float lr = 0.1f;
  for (int step = 0; step <= 100; ++step) {
    Tensor err = x.matmul(w) + b - y;  // [n, 1], b broadcast over rows.
    Tensor loss = err.square().mean();
    if (step % 20 == 0) {
      std::cout << "step " << step << "  loss " << loss.item<float>() << "\n";
    }
    Tensor grad_w = x.t().matmul(err) * (2.0f / n);
    Tensor grad_b = err.sum() * (2.0f / n);
    w.sub_(grad_w * lr);
    b.sub_(grad_b * lr);
  }
  std::cout << "learned w = " << w.view({3}) << "\n";
  std::cout << "learned b = " << b << "\n";
  bool ok = w.allclose(true_w, 0.0, 0.05) && std::abs(b.item<float>() - 3.0f) < 0.05f;
  std::cout << (ok ? "recovered the true model" : "did NOT recover the true model") << "\n";
  return ok ? 0 : 1;
}
