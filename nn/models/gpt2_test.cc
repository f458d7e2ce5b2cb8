// GPT-2 against a small GPT-2 that testdata/torch_gpt2.py writes in PyTorch
// 2.x with Hugging Face's layout (the peer tools/install_peers.sh installs;
// those cases skip without it): logits, the loss and gradients for the same
// weights. Beside it, the checks that need no peer: parameter names and
// shapes, bad configs, ids and checkpoints refused naming the value.
#include "nn/models/gpt2.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/testing/peers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/loss.h"
#include "serialization/serialization.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::models {
namespace {

using ::testing::HasSubstr;

constexpr GPT2Config kSmall{.vocab_size = 97, .n_positions = 32, .n_embd = 48, .n_layer = 2,
                            .n_head = 4};

Tensor Get(const StateDict& sd, const std::string& name) {
  for (const auto& [key, t] : sd) {
    if (key == name) return t;
  }
  return Tensor();
}

// The largest |a - b| over the largest |b|.
double Relative(const Tensor& a, const Tensor& b) {
  const Tensor bd = b.to(kFloat64);
  return (a.to(kFloat64) - bd).abs().max().item<double>() / bd.abs().max().item<double>();
}

TEST(Gpt2Test, ParametersHaveHuggingFacesNamesAndShapes) {
  GPT2 model(kSmall);
  const auto params = model.named_parameters();
  ASSERT_EQ(params.size(), 2u + 2u * 12u + 2u);  // wte, wpe, 12 per block, ln_f
  EXPECT_EQ(params[0].first, "wte.weight");
  EXPECT_EQ(params[1].first, "wpe.weight");
  EXPECT_EQ(params[2].first, "h.0.ln_1.weight");
  EXPECT_EQ(params[4].first, "h.0.attn.c_attn.weight");
  EXPECT_EQ(params[4].second.sizes(), (SizeVector{48, 144}));  // Conv1D: [in, out]
  EXPECT_EQ(params[10].first, "h.0.mlp.c_fc.weight");
  EXPECT_EQ(params[10].second.sizes(), (SizeVector{48, 192}));
  EXPECT_EQ(params.back().first, "ln_f.bias");
  // GPT-2 small's parameter count: 124,439,808.
  GPT2 small;
  int64_t count = 0;
  for (const Tensor& p : small.parameters()) count += p.numel();
  EXPECT_EQ(count, 124439808);
}

TEST(Gpt2Test, BadConfigsAndIdsAreRefused) {
  EXPECT_THAT([] { GPT2 m({.n_embd = 50, .n_head = 4}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("n_embd (50) must be divisible by n_head (4)")));
  GPT2 model(kSmall);
  model.eval();
  EXPECT_THAT([&] { model(zeros({2, 3})); },
              ::testing::ThrowsMessage<Error>(HasSubstr("input_ids must be int64")));
  EXPECT_THAT([&] { model(zeros({1, 33}, kInt64)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("33 tokens, more than n_positions (32)")));
  EXPECT_THAT([&] { model(full({1, 3}, int64_t{97}, kInt64)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("token id 97 is outside the vocabulary [0, 97)")));
  // One token row unbatched: [T] -> [T, V].
  EXPECT_EQ(model(zeros({5}, kInt64)).sizes(), (SizeVector{5, 97}));
}

TEST(Gpt2Test, CheckpointsThatDoNotFitAreNamed) {
  GPT2 model(kSmall);
  StateDict sd = model.state_dict();
  sd.push_back({"lm_head.weight", zeros({97, 48})});
  absl::Status tied = model.load_hf_state_dict(sd);
  EXPECT_THAT(tied.message(), HasSubstr("lm_head.weight differs from wte.weight"));
  GPT2 bigger({.vocab_size = 97, .n_positions = 32, .n_embd = 48, .n_layer = 3, .n_head = 4});
  absl::Status missing = bigger.load_hf_state_dict(model.state_dict());
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("h.2."));
}

class Gpt2TorchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/torch_gpt2");
    ASSERT_EQ(std::system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()),
              0);
    absl::StatusOr<std::string> out =
        ::ember::testing::run_torch2("nn/models/testdata/torch_gpt2.py", {dir_});
    if (absl::IsNotFound(out.status())) GTEST_SKIP() << out.status().message();
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_THAT(*out, HasSubstr("done"));
  }
  std::string dir_;
};

TEST_F(Gpt2TorchTest, LogitsLossAndGradientsAreTorchs) {
  absl::StatusOr<std::shared_ptr<GPT2>> model =
      GPT2::from_safetensors(dir_ + "/model.safetensors", kSmall);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  absl::StatusOr<StateDict> expected = load(dir_ + "/expected.pt");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const Tensor logits = (**model)(Get(*expected, "ids"));
  EXPECT_EQ(logits.sizes(), (SizeVector{2, 11, 97}));
  EXPECT_LT(Relative(logits, Get(*expected, "logits")), 1e-5);
  const Tensor loss = functional::cross_entropy(logits.reshape({-1, 97}),
                                                Get(*expected, "targets").reshape({-1}));
  EXPECT_LT(Relative(loss, Get(*expected, "loss")), 1e-6);
  loss.backward();
  const auto params = (*model)->named_parameters();
  auto grad = [&](const std::string& name) {
    for (const auto& [k, p] : params) {
      if (k == name) return p.grad();
    }
    return Tensor();
  };
  // wte's gradient has both of its uses: the embedding and the tied head.
  EXPECT_LT(Relative(grad("wte.weight"), Get(*expected, "grad_wte")), 1e-5);
  EXPECT_LT(Relative(grad("h.0.attn.c_attn.weight"), Get(*expected, "grad_c_attn")), 1e-5);
  EXPECT_LT(Relative(grad("h.1.mlp.c_proj.bias"), Get(*expected, "grad_c_proj_bias")), 1e-5);
  std::printf("relative to torch: logits %.3g, loss %.3g, wte grad %.3g, c_attn grad %.3g\n",
              Relative(logits, Get(*expected, "logits")), Relative(loss, Get(*expected, "loss")),
              Relative(grad("wte.weight"), Get(*expected, "grad_wte")),
              Relative(grad("h.0.attn.c_attn.weight"), Get(*expected, "grad_c_attn")));
}

TEST_F(Gpt2TorchTest, CausalityHoldsOnTorchsWeights) {
  absl::StatusOr<std::shared_ptr<GPT2>> model =
      GPT2::from_safetensors(dir_ + "/model.safetensors", kSmall);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  Tensor ids = tensor({int64_t{5}, int64_t{17}, int64_t{3}, int64_t{88}, int64_t{40}, int64_t{2}});
  const Tensor all = (**model)(ids);
  // Changing the last token leaves the logits of the tokens before it alone.
  Tensor changed = ids.clone();
  changed.narrow(0, 5, 1).fill_(60);
  const Tensor other = (**model)(changed);
  EXPECT_TRUE(all.narrow(0, 0, 5).equal(other.narrow(0, 0, 5)));
  EXPECT_FALSE(all.narrow(0, 5, 1).equal(other.narrow(0, 5, 1)));
}

}  // namespace
}  // namespace ember::nn::models
