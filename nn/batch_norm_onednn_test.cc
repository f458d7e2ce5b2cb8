// batch_norm in float32 through oneDNN (Note [oneDNN kernels]) against the
// same computation in float64 on nn's own kernels (which layers_test checks
// against naive loops and finite differences): outputs, running statistics
// and the three gradients, in training and eval mode, with and without the
// affine parameters, for [N, C], [N, C, L] and [N, C, H, W] inputs.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/normalization.h"
#include "nn/onednn.h"
#include "nn/testing.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

using ::ember::nn::testing::Values;

void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const std::vector<double> g = Values(got), w = Values(want);
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], w[i], 1e-4 * (1 + std::abs(w[i]))) << what << " at " << i;
  }
}

struct Result {
  Tensor y, gx, gw, gb, running_mean, running_var;
};

Result RunBatchNorm(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& gy0, Dtype dtype,
           bool training, bool affine) {
  Tensor x = x0.to(dtype).clone().requires_grad_();
  Tensor w = affine ? w0.to(dtype).clone().requires_grad_() : Tensor();
  Tensor b = affine ? b0.to(dtype).clone().requires_grad_() : Tensor();
  const int64_t c = x0.size(1);
  Tensor rm = (arange(c, TensorOptions(kFloat32)) * 0.1).to(dtype);
  Tensor rv = (arange(c, TensorOptions(kFloat32)) * 0.2 + 0.5).to(dtype);
  Tensor y = functional::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
  y.backward(gy0.to(dtype));
  return {y, x.grad(), affine ? w.grad() : Tensor(), affine ? b.grad() : Tensor(), rm, rv};
}

TEST(BatchNormOneDnnTest, MatchesOwnKernelsInFloat64) {
  manual_seed(3);
  for (SizeVector sizes : {SizeVector{6, 5}, SizeVector{4, 3, 7}, SizeVector{3, 16, 5, 6},
                           SizeVector{2, 64, 8, 8}}) {
    const int64_t c = sizes[1];
    Tensor x = randn(sizes) * 2 + 0.5, gy = randn(sizes);
    Tensor w = randn({c}), b = randn({c});
    for (bool training : {true, false}) {
      for (bool affine : {true, false}) {
        const std::string what = ShapeToString(sizes) + (training ? " training" : " eval") +
                                 (affine ? " affine" : " plain");
        internal::onednn::SetEnabled(true);
        const Result got = RunBatchNorm(x, w, b, gy, kFloat32, training, affine);
        const Result want = RunBatchNorm(x, w, b, gy, kFloat64, training, affine);
        ExpectClose(got.y, want.y, what + " output");
        ExpectClose(got.gx, want.gx, what + " grad_input");
        if (affine) {
          ExpectClose(got.gw, want.gw, what + " grad_weight");
          ExpectClose(got.gb, want.gb, what + " grad_bias");
        }
        ExpectClose(got.running_mean, want.running_mean, what + " running_mean");
        ExpectClose(got.running_var, want.running_var, what + " running_var");
        // And float32 on nn's own kernels agrees too.
        internal::onednn::SetEnabled(false);
        const Result own = RunBatchNorm(x, w, b, gy, kFloat32, training, affine);
        internal::onednn::SetEnabled(true);
        ExpectClose(got.y, own.y, what + " output vs own float32");
        ExpectClose(got.gx, own.gx, what + " grad_input vs own float32");
      }
    }
  }
}

}  // namespace
}  // namespace ember::nn
