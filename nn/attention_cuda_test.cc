// scaled_dot_product_attention and MultiheadAttention on cuda:0 in float64
// (the composed path on the device's tensor ops; cuDNN's fused attention,
// float16 and bfloat16 only, is nn/cuda/attention_test's)
// against the CPU's fused kernel, outputs and gradients. Without a usable
// CUDA device each case skips, saying why.
#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "cuda/device.h"
#include "gtest/gtest.h"
#include "nn/attention.h"
#include "nn/transformer.h"
#include "tensor/device.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

std::string CudaSkipReason() {
  if (device_count(DeviceType::kCUDA) > 0) return "";
  const std::string& why = cuda::unavailable_reason();
  return "no usable CUDA device (" + (why.empty() ? std::string("0 devices") : why) +
         "); attention_test covers the CPU";
}

// max |a - b| / max |b|, on the host.
double Relative(const Tensor& a, const Tensor& b) {
  Tensor x = a.detach().cpu().to(kFloat64), y = b.detach().cpu().to(kFloat64);
  return (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-300);
}

TEST(AttentionCuda, ComposedPathMatchesCpu) {
  const std::string why = CudaSkipReason();
  if (!why.empty()) GTEST_SKIP() << why;
  const Device gpu(DeviceType::kCUDA, 0);
  Generator gen(11);
  const TensorOptions f64(kFloat64);
  Tensor q = randn({2, 4, 37, 16}, f64, &gen), k = randn({2, 2, 45, 16}, f64, &gen),
         v = randn({2, 2, 45, 8}, f64, &gen), g = randn({2, 4, 37, 8}, f64, &gen);
  Tensor mask = rand({37, 45}, f64, &gen).gt(0.2);
  mask.select(0, 2).fill_(false);  // a fully masked row: zeros on both
  struct Options {
    bool causal;
    bool with_mask;
  };
  for (const Options& o : {Options{false, true}, Options{true, false}}) {
    std::vector<Tensor> cpu_in = {q.clone().requires_grad_(), k.clone().requires_grad_(),
                                  v.clone().requires_grad_()};
    std::vector<Tensor> gpu_in = {q.to(gpu).requires_grad_(), k.to(gpu).requires_grad_(),
                                  v.to(gpu).requires_grad_()};
    Tensor want = functional::scaled_dot_product_attention(
        cpu_in[0], cpu_in[1], cpu_in[2],
        {.attn_mask = o.with_mask ? mask : Tensor(), .is_causal = o.causal, .enable_gqa = true});
    Tensor got = functional::scaled_dot_product_attention(
        gpu_in[0], gpu_in[1], gpu_in[2],
        {.attn_mask = o.with_mask ? mask.to(gpu) : Tensor(),
         .is_causal = o.causal,
         .enable_gqa = true});
    ASSERT_TRUE(got.is_cuda());
    EXPECT_LE(Relative(got, want), 1e-10);
    std::vector<Tensor> gw = autograd::grad({want}, cpu_in, {g});
    std::vector<Tensor> gg = autograd::grad({got}, gpu_in, {g.to(gpu)});
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(Relative(gg[i], gw[i]), 1e-10) << "input " << i;
  }
}

TEST(AttentionCuda, MultiheadAttentionMatchesCpu) {
  const std::string why = CudaSkipReason();
  if (!why.empty()) GTEST_SKIP() << why;
  const Device gpu(DeviceType::kCUDA, 0);
  auto cpu = std::make_shared<MultiheadAttention>(
      MultiheadAttentionOptions{.embed_dim = 16, .num_heads = 4, .batch_first = true});
  cpu->to(kFloat64);
  auto dev = std::dynamic_pointer_cast<MultiheadAttention>(cpu->clone(gpu));
  Tensor x = randn({2, 9, 16}, TensorOptions(kFloat64));
  Tensor padding = zeros({2, 9}, TensorOptions(kBool));
  padding.select(1, 8).fill_(true);
  for (bool need_weights : {true, false}) {
    auto want = cpu->forward(x, x, x, {.key_padding_mask = padding, .need_weights = need_weights});
    Tensor xg = x.to(gpu);
    auto got = dev->forward(xg, xg, xg,
                            {.key_padding_mask = padding.to(gpu), .need_weights = need_weights});
    EXPECT_LE(Relative(got.output, want.output), 1e-10);
    if (need_weights) {
      EXPECT_LE(Relative(got.weights, want.weights), 1e-10);
    }
  }
}

}  // namespace
}  // namespace ember::nn
