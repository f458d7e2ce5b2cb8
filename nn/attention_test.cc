// scaled_dot_product_attention's fused CPU kernel and composed path against a
// float64 reference written here in plain tensor ops (matmul, masked softmax),
// finite-difference gradient checks, thread-count independence, fully masked
// rows (zeros, as PyTorch 2.15), errors; MultiheadAttention's and the
// transformer layers' names, shapes, masks and errors. The comparison with
// PyTorch itself is attention_torch_test.cc.
#include "nn/attention.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/testing.h"
#include "nn/transformer.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/thread_pool.h"

namespace ember::nn {
namespace {

using functional::scaled_dot_product_attention;
using ::testing::HasSubstr;
using testing::Values;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The reference: 4-D q [B, Hq, L, E], k/v [B, Hk, S, *]; `mask` bool (true =
// attend) or float, broadcastable to [B, Hq, L, S]; rows with nothing to
// attend give 0. Plain recorded ops, in the inputs' dtype.
Tensor Reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                 double scale) {
  const int64_t hq = q.size(1), hk = k.size(1);
  Tensor kr = k, vr = v;
  if (hq != hk) {
    std::vector<int64_t> idx;
    for (int64_t h = 0; h < hq; ++h) idx.push_back(h / (hq / hk));
    Tensor index = tensor(idx);
    kr = k.index_select(1, index);
    vr = v.index_select(1, index);
  }
  const int64_t L = q.size(2), S = k.size(2);
  Tensor s = q.matmul(kr.transpose(2, 3)) * scale;
  Tensor allowed = ones({L, S}, TensorOptions(kBool));
  if (causal) {
    std::vector<int64_t> keep;  // j <= i
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j < S; ++j) keep.push_back(j <= i ? 1 : 0);
    }
    allowed = tensor(keep, SizeVector{L, S}).to(kBool);
  }
  if (mask.defined() && mask.dtype() == kBool) allowed = allowed.logical_and(mask);
  if (mask.defined() && mask.dtype() != kBool) s = s + mask;
  s = s.masked_fill(allowed.logical_not(), kNegInf);
  Tensor dead = s.detach().amax({-1}, true).eq(kNegInf);
  Tensor p = s.masked_fill(dead, 0.0).softmax(-1).masked_fill(dead, 0.0);
  return p.matmul(vr);
}

struct Case {
  std::string name;
  int64_t B, Hq, Hk, L, S, E, Ev;
  bool causal = false;
  int mask = 0;  // 0 none, 1 bool [L, S], 2 float [B, 1, L, S], 3 bool [B, Hq, L, S] sparse
};

std::vector<Case> Cases() {
  return {
      {"plain", 2, 3, 3, 70, 130, 16, 24},
      {"causal_tall", 1, 2, 2, 100, 75, 8, 8, true},
      {"causal_wide", 2, 2, 2, 50, 150, 12, 5, true},
      {"bool_mask", 2, 2, 2, 65, 67, 8, 8, false, 1},
      {"float_mask", 2, 2, 2, 33, 129, 16, 16, false, 2},
      {"sparse_mask", 1, 4, 4, 64, 64, 8, 8, false, 3},
      {"gqa", 2, 6, 2, 40, 90, 16, 8},
      {"gqa_causal", 1, 4, 1, 130, 130, 8, 8, true},
  };
}

Tensor MakeMask(const Case& c, Generator& gen) {
  switch (c.mask) {
    case 1: {
      Tensor m = rand({c.L, c.S}, TensorOptions(kFloat64), &gen).gt(0.3);
      m.select(0, 3).fill_(false);  // a fully masked row
      return m;
    }
    case 2:
      return randn({c.B, 1, c.L, c.S}, TensorOptions(kFloat64), &gen);
    case 3:
      return rand({c.B, c.Hq, c.L, c.S}, TensorOptions(kFloat64), &gen).gt(0.9);
    default:
      return Tensor();
  }
}

// Largest |a - b| / (1 + |b|).
double RelError(const Tensor& a, const Tensor& b) {
  std::vector<double> x = Values(a), y = Values(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    worst = std::max(worst, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  }
  return worst;
}

void CheckCase(const Case& c, Dtype dtype, double tol) {
  SCOPED_TRACE(c.name + (dtype == kFloat32 ? " float32" : " float64"));
  Generator gen(17);
  const TensorOptions f64(kFloat64);
  Tensor q = randn({c.B, c.Hq, c.L, c.E}, f64, &gen), k = randn({c.B, c.Hk, c.S, c.E}, f64, &gen),
         v = randn({c.B, c.Hk, c.S, c.Ev}, f64, &gen), g = randn({c.B, c.Hq, c.L, c.Ev}, f64, &gen);
  Tensor mask = MakeMask(c, gen);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));

  // Reference in float64 with autograd's gradients.
  Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(),
         rv = v.clone().requires_grad_();
  Tensor want = Reference(rq, rk, rv, mask, c.causal, scale);
  want.backward(g);

  Tensor tq = q.to(dtype).requires_grad_(), tk = k.to(dtype).requires_grad_(),
         tv = v.to(dtype).requires_grad_();
  Tensor m = mask.defined() && mask.dtype() != kBool ? mask.to(dtype) : mask;
  Tensor got = scaled_dot_product_attention(
      tq, tk, tv, {.attn_mask = m, .is_causal = c.causal, .enable_gqa = c.Hq != c.Hk});
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.dtype(), dtype);
  got.backward(g.to(dtype));
  EXPECT_LE(RelError(got, want), tol) << "output";
  EXPECT_LE(RelError(tq.grad(), rq.grad()), tol) << "grad query";
  EXPECT_LE(RelError(tk.grad(), rk.grad()), tol) << "grad key";
  EXPECT_LE(RelError(tv.grad(), rv.grad()), tol) << "grad value";
}

TEST(ScaledDotProductAttention, FusedMatchesReferenceFloat64) {
  for (const Case& c : Cases()) CheckCase(c, kFloat64, 1e-10);
}

TEST(ScaledDotProductAttention, FusedMatchesReferenceFloat32) {
  for (const Case& c : Cases()) CheckCase(c, kFloat32, 2e-5);
}

// The softmax's AVX2 and scalar paths (where the CPU has AVX-512 the test
// above took the AVX-512 one).
TEST(ScaledDotProductAttention, FusedMatchesReferenceOnNarrowerVectors) {
  for (int bits : {256, 0}) {
    SCOPED_TRACE("vector bits " + std::to_string(bits));
    internal::set_max_vector_bits(bits);
    for (const Case& c : Cases()) CheckCase(c, kFloat32, 2e-5);
  }
  internal::set_max_vector_bits(512);
}

TEST(ScaledDotProductAttention, FullyMaskedRowsGiveZerosAsTorch) {
  Tensor q = randn({1, 2, 5, 4}, TensorOptions(kFloat64)).requires_grad_();
  Tensor k = randn({1, 2, 7, 4}, TensorOptions(kFloat64)).requires_grad_();
  Tensor v = randn({1, 2, 7, 3}, TensorOptions(kFloat64)).requires_grad_();
  Tensor mask = ones({5, 7}, TensorOptions(kBool));
  mask.select(0, 1).fill_(false);
  Tensor fmask = zeros({5, 7}, TensorOptions(kFloat64));
  fmask.select(0, 4).fill_(kNegInf);
  for (const Tensor& m : {mask, fmask}) {
    q.set_grad(Tensor());
    Tensor out = scaled_dot_product_attention(q, k, v, {.attn_mask = m});
    const int64_t row = m.dtype() == kBool ? 1 : 4;
    for (double x : Values(out.select(2, row))) EXPECT_EQ(x, 0.0);
    for (double x : Values(out)) EXPECT_FALSE(std::isnan(x));
    out.sum().backward();
    for (double x : Values(q.grad().select(2, row))) EXPECT_EQ(x, 0.0);
    for (double x : Values(k.grad())) EXPECT_FALSE(std::isnan(x));
  }
}

TEST(ScaledDotProductAttention, GradientsMatchFiniteDifferences) {
  Tensor mask = rand({5, 6}, TensorOptions(kFloat64)).gt(0.3);
  testing::ExpectGradientsMatch(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {.attn_mask = mask});
      },
      {randn({2, 2, 5, 3}, TensorOptions(kFloat64)), randn({2, 2, 6, 3}, TensorOptions(kFloat64)),
       randn({2, 2, 6, 4}, TensorOptions(kFloat64))});
  testing::ExpectGradientsMatch(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2],
                                            {.is_causal = true, .scale = 0.7, .enable_gqa = true});
      },
      {randn({1, 4, 6, 3}, TensorOptions(kFloat64)), randn({1, 2, 5, 3}, TensorOptions(kFloat64)),
       randn({1, 2, 5, 2}, TensorOptions(kFloat64))});
  // A float mask that requires grad goes through the composed path.
  testing::ExpectGradientsMatch(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {.attn_mask = in[3]});
      },
      {randn({2, 4, 3}, TensorOptions(kFloat64)), randn({2, 5, 3}, TensorOptions(kFloat64)),
       randn({2, 5, 2}, TensorOptions(kFloat64)), randn({4, 5}, TensorOptions(kFloat64))});
}

TEST(ScaledDotProductAttention, SecondDerivativesMatchFiniteDifferences) {
  testing::ExpectSecondDerivativesMatch(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {.is_causal = true});
      },
      {randn({1, 3, 3}, TensorOptions(kFloat64)), randn({1, 4, 3}, TensorOptions(kFloat64)),
       randn({1, 4, 2}, TensorOptions(kFloat64))});
}

// 8 (batch, head) pairs take the backward's one pass at 1 and 4 threads; a
// single pair (and a GQA pair of 3 query heads) takes it at 1 thread and the
// two passes over blocks at 4: the same bits either way.
TEST(ScaledDotProductAttention, ThreadCountDoesNotChangeResults) {
  struct Shape {
    int64_t B, Hq, Hk;
    bool causal;
  };
  for (const Shape& shape : {Shape{2, 4, 4, true}, Shape{1, 1, 1, false}, Shape{1, 3, 1, true}}) {
    SCOPED_TRACE(std::to_string(shape.B) + "x" + std::to_string(shape.Hq) + "/" +
                 std::to_string(shape.Hk));
    Generator gen(3);
    Tensor q = randn({shape.B, shape.Hq, 150, 32}, TensorOptions(), &gen).requires_grad_();
    Tensor k = randn({shape.B, shape.Hk, 140, 32}, TensorOptions(), &gen).requires_grad_();
    Tensor v = randn({shape.B, shape.Hk, 140, 24}, TensorOptions(), &gen).requires_grad_();
    Tensor g = randn({shape.B, shape.Hq, 150, 24}, TensorOptions(), &gen);
    const int threads = get_num_threads();
    std::vector<std::vector<double>> results[2];
    for (int run = 0; run < 2; ++run) {
      set_num_threads(run == 0 ? 1 : 4);
      q.set_grad(Tensor());
      k.set_grad(Tensor());
      v.set_grad(Tensor());
      Tensor out = scaled_dot_product_attention(
          q, k, v, {.is_causal = shape.causal, .enable_gqa = shape.Hq != shape.Hk});
      out.backward(g);
      results[run] = {Values(out), Values(q.grad()), Values(k.grad()), Values(v.grad())};
    }
    set_num_threads(threads);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "result " << i;
  }
}

TEST(ScaledDotProductAttention, BroadcastsBatchDimsAndLowDims) {
  Tensor q = randn({2, 3, 5, 4}, TensorOptions(kFloat64));
  Tensor k = randn({1, 3, 6, 4}, TensorOptions(kFloat64));
  Tensor v = randn({3, 6, 2}, TensorOptions(kFloat64));
  Tensor out = scaled_dot_product_attention(q, k, v);
  ASSERT_EQ(out.sizes(), IntArrayRef({2, 3, 5, 2}));
  Tensor want = Reference(q, k.expand({2, 3, 6, 4}), v.unsqueeze(0).expand({2, 3, 6, 2}), Tensor(),
                          false, 0.5);
  EXPECT_LE(RelError(out, want), 1e-12);
  Tensor out2 = scaled_dot_product_attention(q.select(0, 0).select(0, 0), k[0][0], v[0]);
  EXPECT_LE(RelError(out2, want[0][0]), 1e-12);
}

TEST(ScaledDotProductAttention, LowPrecisionComputesInFloat32) {
  Tensor q = randn({1, 2, 9, 8}), k = randn({1, 2, 9, 8}), v = randn({1, 2, 9, 8});
  Tensor out = scaled_dot_product_attention(q.to(kBFloat16), k.to(kBFloat16), v.to(kBFloat16));
  EXPECT_EQ(out.dtype(), kBFloat16);
  Tensor want = Reference(q.to(kBFloat16).to(kFloat64), k.to(kBFloat16).to(kFloat64),
                          v.to(kBFloat16).to(kFloat64), Tensor(), false, 1 / std::sqrt(8.0));
  EXPECT_LE(RelError(out, want), 1e-2);
}

TEST(ScaledDotProductAttention, DropoutUsesTheGenerator) {
  Tensor q = randn({2, 6, 4}), k = randn({2, 7, 4}), v = randn({2, 7, 3});
  Generator a(5), b(5);
  Tensor x = scaled_dot_product_attention(q, k, v, {.dropout_p = 0.5, .generator = &a});
  Tensor y = scaled_dot_product_attention(q, k, v, {.dropout_p = 0.5, .generator = &b});
  EXPECT_EQ(Values(x), Values(y));
  EXPECT_GT(RelError(x, scaled_dot_product_attention(q, k, v)), 1e-3);
  Tensor zero = scaled_dot_product_attention(q, k, v, {.dropout_p = 1.0});
  for (double e : Values(zero)) EXPECT_EQ(e, 0.0);
}

TEST(ScaledDotProductAttention, ErrorsNameTheValues) {
  Tensor q = randn({2, 4, 3, 8}), k = randn({2, 4, 5, 8}), v = randn({2, 4, 5, 6});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message([&] { scaled_dot_product_attention(randn({8}), k, v); }),
              HasSubstr("at least 2 dimensional, but got query.dim: 1"));
  EXPECT_THAT(message([&] { scaled_dot_product_attention(q.to(kFloat64), k, v); }),
              HasSubstr("same dtype, but got query.dtype: float64"));
  EXPECT_THAT(message([&] {
                scaled_dot_product_attention(q, randn({2, 4, 5, 7}), v);
              }),
              HasSubstr("the last dim of query (8) and key (7) must match"));
  EXPECT_THAT(message([&] {
                scaled_dot_product_attention(q, k, randn({2, 4, 6, 6}));
              }),
              HasSubstr("same sequence length"));
  EXPECT_THAT(message([&] {
                scaled_dot_product_attention(q, randn({3, 4, 5, 8}), v);
              }),
              HasSubstr("shapes [2, 4] and [3, 4] are not broadcastable"));
  EXPECT_THAT(message([&] { scaled_dot_product_attention(q, k, v, {.dropout_p = 1.5}); }),
              HasSubstr("dropout probability has to be between 0 and 1, but got 1.5"));
  EXPECT_THAT(message([&] {
                scaled_dot_product_attention(
                    q, k, v, {.attn_mask = ones({3, 5}, TensorOptions(kBool)), .is_causal = true});
              }),
              HasSubstr("Explicit attn_mask should not be set when is_causal=True"));
  EXPECT_THAT(
      message([&] {
        scaled_dot_product_attention(q, k, v, {.attn_mask = ones({3, 5}, TensorOptions(kInt64))});
      }),
      HasSubstr("attn_mask.dtype: int64 and query.dtype: float32"));
  EXPECT_THAT(
      message([&] {
        scaled_dot_product_attention(q, k, v, {.attn_mask = ones({3, 4}, TensorOptions(kBool))});
      }),
      HasSubstr("attn_mask of shape [3, 4] doesn't broadcast"));
  EXPECT_THAT(message([&] {
                scaled_dot_product_attention(q, randn({2, 3, 5, 8}), randn({2, 3, 5, 6}),
                                             {.enable_gqa = true});
              }),
              HasSubstr("Number of heads in key and value must divide the number of heads in "
                        "query: query has 4, key 3"));
  EXPECT_THAT(message([&] {
                scaled_dot_product_attention(q, randn({2, 2, 5, 8}), v);
              }),
              HasSubstr("shapes [2, 4] and [2, 2] are not broadcastable"));
}

// --- MultiheadAttention and the layers -----------------------------------------------

std::vector<std::string> Names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

TEST(MultiheadAttention, ParametersAreTorchs) {
  MultiheadAttention mha(8, 2);
  EXPECT_THAT(Names(mha), ::testing::ElementsAre("in_proj_weight", "in_proj_bias",
                                                 "out_proj.weight", "out_proj.bias"));
  EXPECT_EQ(mha.in_proj_weight().sizes(), IntArrayRef({24, 8}));
  for (double b : Values(mha.in_proj_bias())) EXPECT_EQ(b, 0.0);
  for (double b : Values(mha.out_proj->bias())) EXPECT_EQ(b, 0.0);
  // xavier_uniform_ on [24, 8]: bound sqrt(6 / 32).
  for (double w : Values(mha.in_proj_weight())) EXPECT_LE(std::abs(w), std::sqrt(6.0 / 32));
  MultiheadAttention cross({.embed_dim = 8, .num_heads = 2, .bias = false, .kdim = 5, .vdim = 3});
  EXPECT_THAT(Names(cross), ::testing::ElementsAre("q_proj_weight", "k_proj_weight",
                                                   "v_proj_weight", "out_proj.weight"));
  EXPECT_EQ(cross.k_proj_weight().sizes(), IntArrayRef({8, 5}));
  EXPECT_EQ(cross.v_proj_weight().sizes(), IntArrayRef({8, 3}));
  auto out = cross.forward(randn({4, 2, 8}), randn({6, 2, 5}), randn({6, 2, 3}));
  EXPECT_EQ(out.output.sizes(), IntArrayRef({4, 2, 8}));
  EXPECT_EQ(out.weights.sizes(), IntArrayRef({2, 4, 6}));
}

TEST(MultiheadAttention, WeightsAndSdpaPathsAgree) {
  auto mha = std::make_shared<MultiheadAttention>(
      MultiheadAttentionOptions{.embed_dim = 12, .num_heads = 3, .batch_first = true});
  mha->to(kFloat64);
  Tensor x = randn({2, 5, 12}, TensorOptions(kFloat64));
  Tensor padding = zeros({2, 5}, TensorOptions(kBool));
  padding.select(0, 1).select(0, 4).fill_(true);
  Tensor causal = generate_square_subsequent_mask(5, kFloat64);
  auto with = mha->forward(x, x, x, {.key_padding_mask = padding, .attn_mask = causal});
  auto without = mha->forward(
      x, x, x, {.key_padding_mask = padding, .need_weights = false, .attn_mask = causal});
  EXPECT_FALSE(without.weights.defined());
  EXPECT_EQ(with.weights.sizes(), IntArrayRef({2, 5, 5}));
  EXPECT_LE(RelError(with.output, without.output), 1e-12);
  // The padded key gets no weight; each row sums to 1.
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(with.weights[1][i][4].item<double>(), 0.0);
  for (double s : Values(with.weights.sum({-1}))) EXPECT_NEAR(s, 1.0, 1e-12);
  // The causal hint alone goes to SDPA's is_causal and gives the same.
  auto hinted =
      mha->forward(x, x, x, {.need_weights = false, .attn_mask = causal, .is_causal = true});
  auto masked = mha->forward(x, x, x, {.need_weights = false, .attn_mask = causal});
  EXPECT_LE(RelError(hinted.output, masked.output), 1e-12);
  // Unbatched input is one batch entry, and per-head weights.
  auto one = mha->forward(x[0], x[0], x[0], {.average_attn_weights = false});
  auto all = mha->forward(x, x, x, {.average_attn_weights = false});
  EXPECT_EQ(one.weights.sizes(), IntArrayRef({3, 5, 5}));
  EXPECT_LE(RelError(one.output, all.output[0]), 1e-12);
}

TEST(MultiheadAttention, ErrorsNameTheValues) {
  EXPECT_THAT(
      [] { MultiheadAttention(10, 3); },
      ::testing::ThrowsMessage<Error>(HasSubstr("embed_dim must be divisible by num_heads")));
  EXPECT_THAT([] { MultiheadAttention(0, 3); },
              ::testing::ThrowsMessage<Error>(HasSubstr("got embed_dim=0 and num_heads=3")));
  EXPECT_THAT([] { MultiheadAttention({.embed_dim = 4, .num_heads = 2, .add_bias_kv = true}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("add_bias_kv=true is not supported")));
  MultiheadAttention mha(8, 2);
  Tensor x = randn({3, 2, 8});
  EXPECT_THAT(
      [&] {
        mha.forward(x, x, randn({3, 8}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("expected `key` and `value` to be 3-D")));
  EXPECT_THAT(
      [&] {
        mha.forward(randn({3, 2, 6}), randn({3, 2, 6}), randn({3, 2, 6}));
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("was expecting embedding dimension of 8, but got 6")));
  EXPECT_THAT(
      [&] {
        mha.forward(x, x, x, {.attn_mask = zeros({3, 4})});
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("The shape of the 2D attn_mask is [3, 4], but should be [3, 3].")));
  EXPECT_THAT(
      [&] {
        mha.forward(x, x, x, {.key_padding_mask = zeros({2, 4}, TensorOptions(kBool))});
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("Expected key_padded_mask.shape[1] to be 3, but got 4")));
  EXPECT_THAT(
      [&] {
        mha.forward(x, x, x, {.attn_mask = zeros({3, 3}, TensorOptions(kInt64))});
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("only bool and floating types of attn_mask are supported")));
  EXPECT_THAT([&] { mha.forward(x, x, x, {.is_causal = true}); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("Need attn_mask if specifying the is_causal hint")));
}

TEST(TransformerLayers, ParameterNamesAreTorchs) {
  TransformerEncoderLayer enc({.d_model = 8, .nhead = 2, .dim_feedforward = 16});
  EXPECT_THAT(Names(enc),
              ::testing::ElementsAre(
                  "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                  "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                  "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"));
  TransformerDecoderLayer dec({.d_model = 8, .nhead = 2, .dim_feedforward = 16, .bias = false});
  EXPECT_THAT(Names(dec), ::testing::ElementsAre(
                              "self_attn.in_proj_weight", "self_attn.out_proj.weight",
                              "multihead_attn.in_proj_weight", "multihead_attn.out_proj.weight",
                              "linear1.weight", "linear2.weight", "norm1.weight", "norm2.weight",
                              "norm3.weight"));
  auto layer = std::make_shared<TransformerEncoderLayer>(
      TransformerEncoderLayerOptions{.d_model = 8, .nhead = 2, .dim_feedforward = 16});
  TransformerEncoder encoder(layer, 2, std::make_shared<LayerNorm>(SizeVector{8}));
  std::vector<std::string> names = Names(encoder);
  ASSERT_EQ(names.size(), 26u);
  EXPECT_EQ(names[0], "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(names[12], "layers.1.self_attn.in_proj_weight");
  EXPECT_EQ(names[25], "norm.bias");
  // The layers are copies of the given one.
  EXPECT_EQ(Values(encoder.layers[1]->linear1->weight()), Values(layer->linear1->weight()));
  EXPECT_FALSE(encoder.layers[1]->linear1->weight().is_same(layer->linear1->weight()));
  auto copy = std::dynamic_pointer_cast<TransformerEncoder>(encoder.clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(Names(*copy), names);
  EXPECT_THAT(
      [] { TransformerEncoderLayer({.d_model = 8, .nhead = 2, .activation = "tanh"}); },
      ::testing::ThrowsMessage<Error>(HasSubstr("activation should be relu/gelu, not tanh")));
  EXPECT_THAT(
      [&] {
        dec.forward(randn({3, 2, 8}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("needs the encoder's memory")));
}

TEST(TransformerLayers, CausalMaskIsDetectedAndKeysArePadded) {
  auto layer = std::make_shared<TransformerEncoderLayer>(TransformerEncoderLayerOptions{
      .d_model = 8, .nhead = 2, .dim_feedforward = 16, .dropout = 0.0, .batch_first = true});
  TransformerEncoder encoder(layer, 2);
  encoder.to(kFloat64);
  Tensor x = randn({2, 6, 8}, TensorOptions(kFloat64));
  Tensor causal = generate_square_subsequent_mask(6, kFloat64);
  Tensor a = encoder.forward(x, {.mask = causal});
  Tensor b = encoder.forward(x, {.mask = causal, .is_causal = false});
  EXPECT_LE(RelError(a, b), 1e-12);
  // Under the causal mask the first position depends on itself only.
  Tensor y = x.clone();
  y.select(1, 5).fill_(3.0);
  Tensor c = encoder.forward(y, {.mask = causal});
  EXPECT_LE(RelError(c.select(1, 0), a.select(1, 0)), 1e-12);
  // A padded key's value doesn't matter.
  Tensor padding = zeros({2, 6}, TensorOptions(kBool));
  padding.select(1, 5).fill_(true);
  EXPECT_LE(RelError(encoder.forward(x, {.src_key_padding_mask = padding}).select(1, 0),
                     encoder.forward(y, {.src_key_padding_mask = padding}).select(1, 0)),
            1e-12);
}

}  // namespace
}  // namespace ember::nn
