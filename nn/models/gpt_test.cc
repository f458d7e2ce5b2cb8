// make_gpt's layout (children and parameter names a tensor-parallel plan
// and pipeline stages address), causality (a position's logits do not see
// later tokens), a column shard of q, k, v running its share of the heads,
// and the errors.
#include "nn/models/gpt.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/attention.h"
#include "tensor/error.h"
#include "tensor/factories.h"

namespace ember::nn::models {
namespace {

using ::testing::HasSubstr;

const GPTConfig kSmall{.vocab_size = 16, .block_size = 6, .n_embd = 8, .head_dim = 2,
                       .hidden = 12, .n_layer = 2};

TEST(GptTest, ChildrenAndNames) {
  manual_seed(1);
  auto gpt = make_gpt(kSmall);
  ASSERT_EQ(gpt->size(), 5u);  // embeddings, 2 blocks, norm, head
  std::vector<std::string> names;
  for (const auto& [name, p] : gpt->named_parameters()) names.push_back(name);
  EXPECT_THAT(names, ::testing::IsSupersetOf({"0.wte.weight", "0.wpe.weight", "1.ln1.weight",
                                              "1.attn.q.weight", "1.attn.o.bias", "2.fc1.weight",
                                              "2.fc2.bias", "3.weight", "4.weight", "4.bias"}));
  EXPECT_EQ((*gpt)[0]->child("wpe")->parameter("weight").sizes(), (SizeVector{6, 8}));
  EXPECT_EQ((*gpt)[2]->child("fc1")->parameter("weight").sizes(), (SizeVector{12, 8}));
  Tensor logits = (*gpt)(randint(0, 16, {3, 5}));
  EXPECT_EQ(logits.sizes(), (SizeVector{3, 5, 16}));
}

TEST(GptTest, CausalLogitsIgnoreLaterTokens) {
  manual_seed(2);
  auto gpt = make_gpt(kSmall);
  Tensor a = tensor<int64_t>({1, 2, 3, 4, 5}, SizeVector{1, 5});
  Tensor b = tensor<int64_t>({1, 2, 3, 9, 0}, SizeVector{1, 5});  // differs from position 3
  Tensor la = (*gpt)(a);
  Tensor lb = (*gpt)(b);
  EXPECT_TRUE(la.narrow(1, 0, 3).allclose(lb.narrow(1, 0, 3), 0, 0));
  EXPECT_FALSE(la.narrow(1, 3, 1).allclose(lb.narrow(1, 3, 1)));
  GPTConfig bidirectional = kSmall;
  bidirectional.causal = false;
  manual_seed(2);
  auto both = make_gpt(bidirectional);
  EXPECT_FALSE((*both)(a).narrow(1, 0, 3).allclose((*both)(b).narrow(1, 0, 3)));
}

// q, k, v cut to their first 4 rows (and o to its first 4 columns, no
// bias) run the first 2 of the 4 heads: a column shard's share.
TEST(GptTest, HeadsFollowTheProjectionsWidth) {
  manual_seed(3);
  auto attn = std::make_shared<SelfAttention>(8, 2, /*causal=*/true);
  Tensor x = randn({2, 4, 8});
  auto rows = [&](const std::shared_ptr<Linear>& l, const char* name) {
    return l->parameter(name).narrow(0, 0, 4).detach().clone();
  };
  const Tensor o_cols = attn->o->parameter("weight").narrow(1, 0, 4).detach().clone();
  std::shared_ptr<Module> half = attn->replicate_for_data_parallel(
      {rows(attn->q, "weight"), rows(attn->q, "bias"), rows(attn->k, "weight"),
       rows(attn->k, "bias"), rows(attn->v, "weight"), rows(attn->v, "bias"), o_cols, zeros({8})},
      {});
  // The first two heads written out: [B, 2, T, 2] each.
  auto project = [&](const std::shared_ptr<Linear>& l) {
    Tensor y = x.matmul(rows(l, "weight").t()) + rows(l, "bias");
    return y.reshape({2, 4, 2, 2}).transpose(1, 2);
  };
  Tensor heads = functional::scaled_dot_product_attention(project(attn->q), project(attn->k),
                                                          project(attn->v), {.is_causal = true});
  Tensor want = heads.transpose(1, 2).reshape({2, 4, 4}).matmul(o_cols.t());
  EXPECT_TRUE((*half)(x).allclose(want, 1e-5, 1e-6));
}

TEST(GptTest, Errors) {
  GPTConfig bad = kSmall;
  bad.head_dim = 3;
  EXPECT_THAT([&] { make_gpt(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr(
                                          "n_embd (8) must be a positive multiple of head_dim (3)")));
  auto gpt = make_gpt(kSmall);
  EXPECT_THAT([&] { (*gpt)(randint(0, 16, {1, 7})); },
              ::testing::ThrowsMessage<Error>(HasSubstr("7 tokens, more than block_size (6)")));
  EXPECT_THAT([&] { (*gpt)(randn({1, 3})); },
              ::testing::ThrowsMessage<Error>(HasSubstr("ids must be int64 [batch, tokens]")));
}

}  // namespace
}  // namespace ember::nn::models
