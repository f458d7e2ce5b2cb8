// Autocast against PyTorch 2.x's (testdata/torch_autocast.py on the peer
// tools/install_peers.sh installs; skips, saying so, without it):
// - every op of the probe list returns, under a CPU autocast region, the
//   dtype torch.autocast("cpu") gives it, from float32 and from bfloat16
//   inputs, and has a CUDA policy exactly where PyTorch registers an
//   AutocastCUDA kernel (Note [Autocast] in tensor/autocast.h);
// - a two-layer MLP step under CPU autocast gives PyTorch's loss and
//   gradients (both round the same products to bfloat16; they may differ by
//   the last bfloat16 place where float32 sums were added in another order).
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/testing/peers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/attention.h"
#include "nn/conv.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/normalization.h"
#include "tensor/autocast.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::nn {
namespace {

constexpr int kSeed = 5;

struct TorchOutput {
  // name -> {dtype from float32, dtype from bfloat16, "K" or "-"}.
  std::map<std::string, std::vector<std::string>> policies;
  std::map<std::string, std::vector<double>> step;
};

TorchOutput Parse(const std::string& out) {
  TorchOutput parsed;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words[0] == "policy" && words.size() == 5) {
      parsed.policies[words[1]] = {words[2], words[3], words[4]};
    } else if (words[0] == "step") {
      std::string name = words[1].substr(0, words[1].size() - 1);  // drop ':'
      std::vector<double>& values = parsed.step[name];
      for (size_t i = 2; i < words.size(); ++i) {
        values.push_back(std::strtod(words[i].c_str(), nullptr));  // float.hex
      }
    }
  }
  return parsed;
}

// The script's probe arguments: a [4,4], b [4,4], c [4], d [2,4,4],
// x [1,3,5,5], w [2,3,3,3], uniforms in [0.5, 1.5).
std::vector<Tensor> ProbeArgs(Dtype dtype) {
  std::vector<Tensor> args;
  const std::vector<std::vector<int64_t>> shapes = {{4, 4},       {4, 4},         {4},
                                                     {2, 4, 4},    {1, 3, 5, 5},   {2, 3, 3, 3}};
  for (const std::vector<int64_t>& shape : shapes) {
    args.push_back((rand(shape, kFloat64) + 0.5).to(dtype));
  }
  return args;
}

using Probe = std::function<Tensor(const std::vector<Tensor>&)>;

// The script's OPS, in Ember.
const std::map<std::string, Probe>& Probes() {
  static const auto* probes = new std::map<std::string, Probe>{
      {"mm", [](auto& a) { return a[0].mm(a[1]); }},
      {"bmm", [](auto& a) { return a[3].bmm(a[3]); }},
      {"addmm", [](auto& a) { return addmm(a[2], a[0], a[1]); }},
      {"dot", [](auto& a) { return a[2].dot(a[2]); }},
      {"linear", [](auto& a) { return functional::linear(a[0], a[1], a[2]); }},
      {"conv2d", [](auto& a) { return functional::conv2d(a[4], a[5]); }},
      {"scaled_dot_product_attention",
       [](auto& a) { return functional::scaled_dot_product_attention(a[3], a[3], a[3]); }},
      {"softmax", [](auto& a) { return a[0].softmax(-1); }},
      {"log_softmax", [](auto& a) { return a[0].log_softmax(-1); }},
      {"sum", [](auto& a) { return a[0].sum(); }},
      {"prod", [](auto& a) { return a[0].prod(); }},
      {"mean", [](auto& a) { return a[0].mean(); }},
      {"exp", [](auto& a) { return a[0].exp(); }},
      {"expm1", [](auto& a) { return a[0].expm1(); }},
      {"log", [](auto& a) { return a[0].log(); }},
      {"log1p", [](auto& a) { return a[0].log1p(); }},
      {"log2", [](auto& a) { return a[0].log2(); }},
      {"rsqrt", [](auto& a) { return a[0].rsqrt(); }},
      {"tan", [](auto& a) { return a[0].tan(); }},
      {"reciprocal", [](auto& a) { return a[0].reciprocal(); }},
      {"sqrt", [](auto& a) { return a[0].sqrt(); }},
      {"tanh", [](auto& a) { return a[0].tanh(); }},
      {"sigmoid", [](auto& a) { return a[0].sigmoid(); }},
      {"pow", [](auto& a) { return a[0].pow(2.0); }},
      {"norm", [](auto& a) { return a[0].norm(); }},
      {"layer_norm", [](auto& a) { return functional::layer_norm(a[0], {4}, Tensor(), Tensor()); }},
      {"batch_norm",
       [](auto& a) {
         return functional::batch_norm(a[4], zeros({3}), ones({3}), Tensor(), Tensor(),
                                       /*training=*/false);
       }},
      {"cross_entropy_loss",
       [](auto& a) {
         return functional::cross_entropy(a[0], arange(4, TensorOptions().dtype(kInt64)));
       }},
      {"nll_loss",
       [](auto& a) {
         return functional::nll_loss(a[0], arange(4, TensorOptions().dtype(kInt64)));
       }},
      {"mse_loss", [](auto& a) { return functional::mse_loss(a[0], a[1]); }},
      {"l1_loss", [](auto& a) { return functional::l1_loss(a[0], a[1]); }},
      {"binary_cross_entropy_with_logits",
       [](auto& a) { return functional::binary_cross_entropy_with_logits(a[0], a[1] / 2); }},
      {"cat", [](auto& a) { return cat({a[0], a[1]}); }},
      {"add", [](auto& a) { return a[0] + a[1]; }},
      {"embedding",
       [](auto& a) {
         return functional::embedding(arange(2, TensorOptions().dtype(kInt64)), a[0]);
       }},
      {"gelu", [](auto& a) { return a[0].gelu(); }},
      {"relu", [](auto& a) { return a[0].relu(); }},
  };
  return *probes;
}

class AutocastTorchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = new absl::StatusOr<std::string>(
        ::ember::testing::run_torch2("nn/testdata/torch_autocast.py", {std::to_string(kSeed)}));
  }
  void SetUp() override {
    if (absl::IsNotFound(out_->status())) GTEST_SKIP() << out_->status().message();
    ASSERT_TRUE(out_->ok()) << out_->status();
    torch_ = Parse(**out_);
    ASSERT_EQ(torch_.policies.size(), Probes().size()) << **out_;
  }
  static absl::StatusOr<std::string>* out_;
  TorchOutput torch_;
};

absl::StatusOr<std::string>* AutocastTorchTest::out_ = nullptr;

TEST_F(AutocastTorchTest, EveryProbedOpReturnsTorchsDtypeOnTheCpu) {
  for (const auto& [name, probe] : Probes()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(torch_.policies.count(name));
    const std::vector<std::string>& want = torch_.policies.at(name);
    int i = 0;
    for (Dtype input : {kFloat32, kBFloat16}) {
      std::vector<Tensor> args = ProbeArgs(input);
      autocast ac(DeviceType::kCPU);
      try {
        EXPECT_EQ(dtype_name(probe(args).dtype()), want[i]) << "from " << dtype_name(input);
      } catch (const Error& e) {
        ADD_FAILURE() << "from " << dtype_name(input) << ": " << e.what();
      }
      ++i;
    }
  }
}

TEST_F(AutocastTorchTest, OpsHaveACudaPolicyExactlyWherePyTorchHasAnAutocastCudaKernel) {
  // PyTorch's cross_entropy_loss has no CUDA kernel of its own: it is
  // log_softmax then nll_loss, both float32 on CUDA, so it runs in float32 as
  // Ember's row says.
  const std::map<std::string, std::string> by_decomposition = {
      {"cross_entropy_loss", "log_softmax"}};
  for (const auto& [name, want] : torch_.policies) {
    SCOPED_TRACE(name);
    const bool ember_has = autocast_policy(name, DeviceType::kCUDA) != CastPolicy::kNone;
    auto via = by_decomposition.find(name);
    if (via != by_decomposition.end()) {
      EXPECT_EQ(want[2], "-");
      EXPECT_EQ(torch_.policies.at(via->second)[2], "K");
      EXPECT_TRUE(ember_has);
      continue;
    }
    EXPECT_EQ(ember_has, want[2] == "K");
  }
  // And every row of the table is probed, so none escapes the comparison.
  for (const AutocastPolicy& row : autocast_policies()) {
    EXPECT_TRUE(torch_.policies.count(std::string(row.op))) << row.op;
  }
}

Tensor Uniform(IntArrayRef shape) { return rand(shape, kFloat64); }

TEST_F(AutocastTorchTest, AnMlpStepGivesTorchsLossAndGradients) {
  manual_seed(kSeed);
  Tensor x = (Uniform({64, 32}) * 2 - 1).to(kFloat32);
  Tensor target = (Uniform({64}) * 10).to(kInt64).clamp(std::nullopt, 9);
  Tensor w1 = ((Uniform({64, 32}) * 2 - 1) * 0.2).to(kFloat32).requires_grad_();
  Tensor b1 = ((Uniform({64}) * 2 - 1) * 0.1).to(kFloat32).requires_grad_();
  Tensor w2 = ((Uniform({10, 64}) * 2 - 1) * 0.2).to(kFloat32).requires_grad_();
  Tensor b2 = ((Uniform({10}) * 2 - 1) * 0.1).to(kFloat32).requires_grad_();
  Tensor logits, loss;
  {
    autocast ac(DeviceType::kCPU);
    logits = functional::linear(functional::linear(x, w1, b1).relu(), w2, b2);
    loss = functional::cross_entropy(logits, target);
  }
  loss.backward();
  EXPECT_EQ(logits.dtype(), kBFloat16);
  EXPECT_EQ(torch_.step.at("logits_dtype")[0], 1.0);
  EXPECT_EQ(loss.dtype(), kFloat32);
  EXPECT_EQ(torch_.step.at("loss_dtype")[0], 1.0);
  const std::vector<std::pair<std::string, Tensor>> got = {
      {"loss", loss}, {"w1", w1.grad()}, {"b1", b1.grad()}, {"w2", w2.grad()}, {"b2", b2.grad()}};
  for (const auto& [name, t] : got) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(t.defined());
    EXPECT_EQ(t.dtype(), kFloat32);
    const std::vector<double> values = ::ember::testing::Values(t);
    const std::vector<double>& want = torch_.step.at(name);
    ASSERT_EQ(values.size(), want.size());
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    // Two places of bfloat16 (2^-7) of the tensor's largest value.
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR(values[i], want[i], scale / 128) << "at " << i;
    }
  }
}

}  // namespace
}  // namespace ember::nn
