// scaled_dot_product_attention on cuda:0 through cuDNN's fused graphs (Note
// [cuDNN fused attention] in nn/cuda/attention.cc): float16 and bfloat16,
// causal and not, grouped-query heads, L != S, against the CPU in float32
// from the same rounded inputs, forward and backward, with the plan caches
// showing the fused path ran. float32 declines to the composed path. Without
// a device the GPU cases skip, saying why; the refusal rules, the
// registration and cuDNN's acceptance of every descriptor of both graphs
// (short of the operation graph, which needs a device) run everywhere.
#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/attention.h"
#include "nn/attention_kernels.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/layer_testing.h"
#include "tensor/factories.h"
#include "third_party/cuda/device_check.h"

namespace ember::nn {
namespace {

using cudnn::internal::AttentionBackwardStats;
using cudnn::internal::AttentionForwardStats;
using cudnn::internal::FusedAttentionRefusal;
using ::testing::HasSubstr;
using testing::kGpu;

TEST(AttentionCudaKernelTest, KernelsAreRegisteredForCpuAndCuda) {
  EXPECT_TRUE(internal::attention_forward.has(DeviceType::kCPU));
  EXPECT_TRUE(internal::attention_backward.has(DeviceType::kCPU));
  EXPECT_TRUE(internal::attention_forward.has(DeviceType::kCUDA));
  EXPECT_TRUE(internal::attention_backward.has(DeviceType::kCUDA));
}

TEST(AttentionCudaKernelTest, RefusalsNameWhatTheFusedGraphsDoNotTake) {
  EXPECT_EQ(FusedAttentionRefusal(kFloat16, false, 64, 64, false, true), "");
  EXPECT_EQ(FusedAttentionRefusal(kBFloat16, false, 128, 8, false, true), "");
  EXPECT_EQ(FusedAttentionRefusal(kBFloat16, false, 256, 256, false, true), "");
  EXPECT_THAT(FusedAttentionRefusal(kFloat32, false, 64, 64, false, true), HasSubstr("float32"));
  EXPECT_THAT(FusedAttentionRefusal(kFloat64, false, 64, 64, false, true), HasSubstr("float64"));
  EXPECT_THAT(FusedAttentionRefusal(kFloat16, true, 64, 64, false, true), HasSubstr("attn_mask"));
  EXPECT_THAT(FusedAttentionRefusal(kFloat16, false, 60, 64, false, true),
              HasSubstr("head size 60"));
  EXPECT_THAT(FusedAttentionRefusal(kFloat16, false, 64, 264, false, true),
              HasSubstr("head size 264"));
  EXPECT_THAT(FusedAttentionRefusal(kFloat16, false, 64, 64, true, true), HasSubstr("empty"));
  EXPECT_THAT(FusedAttentionRefusal(kFloat16, false, 64, 64, false, false),
              HasSubstr("16-byte aligned"));
}

// cuDNN accepts every tensor and operation descriptor of both graphs (only
// the operation graph and its plan need a device).
TEST(AttentionCudaKernelTest, EveryDescriptorOfTheGraphsFinalizesOnTheHost) {
  for (bool backward : {false, true}) {
    for (bool causal : {false, true}) {
      for (Dtype dtype : {kFloat16, kBFloat16}) {
        SCOPED_TRACE(std::string(backward ? "backward " : "forward ") +
                     (causal ? "causal " : "") + std::string(dtype_name(dtype)));
        EXPECT_EQ(cudnn::internal::BuildAttentionOperations(backward, dtype, 2, 4, 128, 96, 64,
                                                            32, causal),
                  "");
      }
    }
  }
  // A descriptor cuDNN refuses (a negative head size) is reported with its words.
  EXPECT_THAT(cudnn::internal::BuildAttentionOperations(false, kFloat16, 2, 4, 128, 96, -8, 32,
                                                        false),
              HasSubstr("CUDNN_STATUS"));
}

// max |a - b| / max |b|, on the host in float64.
double Relative(const Tensor& a, const Tensor& b) {
  Tensor x = a.detach().cpu().to(kFloat64), y = b.detach().cpu().to(kFloat64);
  return (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-300);
}

struct Case {
  Dtype dtype;
  int64_t batch, heads, kv_heads, L, S, E, Ev;
  bool causal;
};

TEST(AttentionCudaKernelTest, FusedGraphsMatchTheCpuForwardAndBackward) {
  EMBER_SKIP_WITHOUT_CUDA();
  const std::vector<Case> cases = {
      {kFloat16, 2, 4, 4, 128, 128, 64, 64, false},
      {kFloat16, 2, 4, 2, 128, 96, 64, 64, true},  // GQA, L > S
      {kBFloat16, 1, 8, 2, 64, 200, 128, 64, true},
      {kBFloat16, 3, 2, 2, 33, 77, 32, 32, false},
  };
  Generator gen(7);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " B" + std::to_string(c.batch) + " H" +
                 std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " L" +
                 std::to_string(c.L) + " S" + std::to_string(c.S) + " E" + std::to_string(c.E) +
                 " Ev" + std::to_string(c.Ev) + (c.causal ? " causal" : ""));
    // Inputs rounded to the dtype once, so both sides start from the same values.
    auto make = [&](std::vector<int64_t> sizes) {
      return randn(sizes, TensorOptions(kFloat32), &gen).to(c.dtype).to(kFloat32);
    };
    Tensor q = make({c.batch, c.heads, c.L, c.E}), k = make({c.batch, c.kv_heads, c.S, c.E}),
           v = make({c.batch, c.kv_heads, c.S, c.Ev}), g = make({c.batch, c.heads, c.L, c.Ev});
    const functional::ScaledDotProductAttentionOptions options{.is_causal = c.causal,
                                                               .enable_gqa = true};
    std::vector<Tensor> cpu = {q.clone().requires_grad_(), k.clone().requires_grad_(),
                               v.clone().requires_grad_()};
    Tensor want = functional::scaled_dot_product_attention(cpu[0], cpu[1], cpu[2], options);
    want.backward(g);

    const auto forward_before = AttentionForwardStats(), backward_before = AttentionBackwardStats();
    std::vector<Tensor> gpu = {q.to(kGpu).to(c.dtype).requires_grad_(),
                               k.to(kGpu).to(c.dtype).requires_grad_(),
                               v.to(kGpu).to(c.dtype).requires_grad_()};
    Tensor got = functional::scaled_dot_product_attention(gpu[0], gpu[1], gpu[2], options);
    got.backward(g.to(kGpu).to(c.dtype));
    const auto forward_after = AttentionForwardStats(), backward_after = AttentionBackwardStats();

    // The fused graphs ran: a plan was built (or found) and nothing fell back.
    EXPECT_EQ(forward_after.fallbacks, forward_before.fallbacks) << forward_after.last_fallback;
    EXPECT_EQ(backward_after.fallbacks, backward_before.fallbacks) << backward_after.last_fallback;
    EXPECT_GE(forward_after.plans, 1);
    EXPECT_GE(backward_after.plans, 1);

    ASSERT_TRUE(got.is_cuda());
    EXPECT_EQ(got.dtype(), c.dtype);
    const double out_tol = c.dtype == kFloat16 ? 4e-3 : 2e-2;
    const double grad_tol = c.dtype == kFloat16 ? 1e-2 : 5e-2;
    EXPECT_LT(Relative(got, want), out_tol);
    const char* names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(names[i]);
      ASSERT_TRUE(gpu[i].grad().defined());
      EXPECT_EQ(gpu[i].grad().sizes(), cpu[i].grad().sizes());
      EXPECT_LT(Relative(gpu[i].grad(), cpu[i].grad()), grad_tol);
    }
  }
}

TEST(AttentionCudaKernelTest, Float32DeclinesToTheComposedPath) {
  EMBER_SKIP_WITHOUT_CUDA();
  Generator gen(3);
  Tensor q = randn({2, 2, 40, 16}, TensorOptions(kFloat32), &gen);
  Tensor k = randn({2, 2, 24, 16}, TensorOptions(kFloat32), &gen);
  const auto before = AttentionForwardStats();
  Tensor got = functional::scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), k.to(kGpu),
                                                        {.is_causal = true});
  Tensor want = functional::scaled_dot_product_attention(q, k, k, {.is_causal = true});
  const auto after = AttentionForwardStats();
  EXPECT_EQ(after.plans, before.plans);  // declined before any plan was tried
  EXPECT_EQ(after.fallbacks, before.fallbacks);
  EXPECT_LT(Relative(got, want), 1e-5);
}

}  // namespace
}  // namespace ember::nn
