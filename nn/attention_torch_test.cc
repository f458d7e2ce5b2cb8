// scaled_dot_product_attention, MultiheadAttention and the transformer layers
// against PyTorch 2.x, the peer tools/install_peers.sh installs (found through
// //base/testing:peers; EMBER_TORCH2_PYTHON names another; without one the
// cases skip, saying why). nn/testdata/torch_attention.py builds torch's
// modules, runs them on random inputs and writes, per case, the inputs, the
// module's state dict, an output gradient, the outputs and every input and
// parameter gradient with torch.save; this test reads them with ember::load,
// loads the state dict (strict, so every name must be torch's) into Ember's
// module, and requires the outputs and gradients within 1e-5 (float32) /
// 1e-10 (float64) of torch's, relative to each tensor's largest magnitude.
// Then Ember's state dicts, written with ember::save, must load strictly into
// torch's modules (the script's "load" mode).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "autograd/engine.h"
#include "base/testing/peers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/attention.h"
#include "nn/transformer.h"
#include "serialization/serialization.h"
#include "tensor/factories.h"

namespace ember::nn {
namespace {

namespace fs = std::filesystem;

constexpr char kScript[] = "nn/testdata/torch_attention.py";

// Where torch's files are, written once per test binary.
const std::string& TorchDir() {
  static const std::string* dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    auto* d = new std::string(
        (fs::path(base ? base : "/tmp") / absl::StrCat("attention_torch_", ::getpid())).string());
    fs::remove_all(*d);
    fs::create_directories(*d);
    return d;
  }();
  return *dir;
}

// Empty when torch's files are there; else why not (for GTEST_SKIP or a
// failure).
absl::Status RunTorchOnce() {
  static const absl::Status* status = [] {
    absl::StatusOr<std::string> out = testing::run_torch2(kScript, {TorchDir()});
    return new absl::Status(out.ok() ? absl::OkStatus() : out.status());
  }();
  return *status;
}

#define REQUIRE_TORCH()                                   \
  do {                                                    \
    absl::Status s = RunTorchOnce();                      \
    if (absl::IsNotFound(s)) GTEST_SKIP() << s.message(); \
    ASSERT_TRUE(s.ok()) << s;                             \
  } while (0)

using Record = std::map<std::string, Tensor>;

Record Load(const std::string& name) {
  absl::StatusOr<StateDict> sd = ember::load(TorchDir() + "/" + name + ".pt");
  EXPECT_TRUE(sd.ok()) << sd.status();
  if (!sd.ok()) return {};
  return Record(sd->begin(), sd->end());
}

// The module's part of a record ("state.<key>").
StateDict StateOf(const Record& r) {
  StateDict sd;
  for (const auto& [key, t] : r) {
    if (absl::StartsWith(key, "state.")) sd.emplace_back(std::string(key.substr(6)), t);
  }
  return sd;
}

// max |got - want| / max |want|; records the worst per dtype for the report.
double Relative(const Tensor& got, const Tensor& want) {
  Tensor g = got.detach().to(kFloat64), w = want.to(kFloat64);
  const double scale = std::max(w.abs().max().item<double>(), 1e-300);
  return (g - w).abs().max().item<double>() / scale;
}

struct Result {
  Tensor out;
  Tensor weights;
};

// Runs `fn` on the record's inputs (fresh leaves) and compares the outputs
// and the gradients of (out * gy).sum() with the record's.
void Compare(const std::string& name, Module* module, const std::function<Result(Record&)>& fn) {
  SCOPED_TRACE(name);
  Record r = Load(name);
  ASSERT_FALSE(r.empty());
  const bool f32 = absl::EndsWith(name, "_f32");
  const double tol = f32 ? 1e-5 : 1e-10;
  if (module != nullptr) {
    module->to(f32 ? kFloat32 : kFloat64);
    absl::Status s = module->load_state_dict(StateOf(r));
    ASSERT_TRUE(s.ok()) << s;
  }
  Record in;
  std::vector<Tensor> wrt;
  std::vector<std::string> wrt_names;
  for (const auto& [key, t] : r) {
    if (!absl::StartsWith(key, "in.")) continue;
    const std::string k(key.substr(3));
    in[k] = t.clone();
    if (t.is_floating_point() && r.count("grad.in." + k)) {
      in[k].requires_grad_(true);
      wrt.push_back(in[k]);
      wrt_names.push_back("grad.in." + k);
    }
  }
  if (module != nullptr) {
    for (const auto& [key, p] : module->named_parameters()) {
      wrt.push_back(p);
      wrt_names.push_back("grad.state." + key);
    }
  }
  Result got = fn(in);
  ASSERT_EQ(got.out.sizes(), r.at("out").sizes());
  EXPECT_LE(Relative(got.out, r.at("out")), tol) << "out";
  if (r.count("weights")) {
    ASSERT_TRUE(got.weights.defined());
    ASSERT_EQ(got.weights.sizes(), r.at("weights").sizes());
    EXPECT_LE(Relative(got.weights, r.at("weights")), tol) << "weights";
  }
  std::vector<Tensor> grads = autograd::grad({(got.out * r.at("gy")).sum()}, wrt, {}, std::nullopt,
                                             false, /*allow_unused=*/true);
  double worst_grad = 0;
  for (size_t i = 0; i < wrt.size(); ++i) {
    auto it = r.find(wrt_names[i]);
    ASSERT_NE(it, r.end()) << "torch wrote no " << wrt_names[i];
    ASSERT_TRUE(grads[i].defined()) << wrt_names[i];
    const double err = Relative(grads[i], it->second);
    worst_grad = std::max(worst_grad, err);
    EXPECT_LE(err, tol) << wrt_names[i];
  }
  // The agreement, for the log.
  std::cout << name << ": output " << Relative(got.out, r.at("out")) << ", worst of "
            << wrt.size() << " gradients " << worst_grad << "\n";
}

std::vector<std::string> Suffixes() { return {"_f32", "_f64"}; }

TEST(AttentionTorch, ScaledDotProductAttention) {
  REQUIRE_TORCH();
  struct SdpaCase {
    std::string name;
    bool causal, gqa;
  };
  for (const SdpaCase& c : std::vector<SdpaCase>{{"sdpa_plain", false, false},
                                                 {"sdpa_causal", true, false},
                                                 {"sdpa_bool", false, false},
                                                 {"sdpa_float", false, false},
                                                 {"sdpa_gqa", false, true}}) {
    for (const std::string& suffix : Suffixes()) {
      Compare(c.name + suffix, nullptr, [&](Record& in) {
        Tensor mask = in.count("mask") ? in["mask"] : Tensor();
        return Result{functional::scaled_dot_product_attention(
            in["q"], in["k"], in["v"],
            {.attn_mask = mask, .is_causal = c.causal, .enable_gqa = c.gqa})};
      });
    }
  }
}

TEST(AttentionTorch, MultiheadAttention) {
  REQUIRE_TORCH();
  for (const std::string& suffix : Suffixes()) {
    MultiheadAttention mha({.embed_dim = 16, .num_heads = 4, .batch_first = true});
    Compare("mha_weights" + suffix, &mha, [&](Record& in) {
      auto r = mha.forward(in["x"], in["x"], in["x"],
                           {.key_padding_mask = in["padding"], .attn_mask = in["causal"]});
      return Result{r.output, r.weights};
    });
    Compare("mha_sdpa" + suffix, &mha, [&](Record& in) {
      auto r = mha.forward(
          in["x"], in["x"], in["x"],
          {.key_padding_mask = in["padding"], .need_weights = false, .attn_mask = in["causal"]});
      return Result{r.output};
    });
    MultiheadAttention cross({.embed_dim = 8, .num_heads = 2, .kdim = 5, .vdim = 3});
    Compare("mha_cross" + suffix, &cross, [&](Record& in) {
      auto r = cross.forward(in["q"], in["k"], in["v"], {.average_attn_weights = false});
      return Result{r.output, r.weights};
    });
  }
}

TEST(AttentionTorch, TransformerLayers) {
  REQUIRE_TORCH();
  for (const std::string& suffix : Suffixes()) {
    TransformerEncoderLayer post({.d_model = 16, .nhead = 4, .dim_feedforward = 32, .dropout = 0});
    Compare("encoder_layer_post" + suffix, &post, [&](Record& in) {
      return Result{post.forward(in["src"], {.src_mask = in["causal"]})};
    });
    TransformerEncoderLayer pre({.d_model = 16,
                                 .nhead = 4,
                                 .dim_feedforward = 32,
                                 .dropout = 0,
                                 .activation = "gelu",
                                 .batch_first = true,
                                 .norm_first = true});
    Compare("encoder_layer_pre" + suffix, &pre, [&](Record& in) {
      return Result{pre.forward(in["src"], {.src_key_padding_mask = in["padding"]})};
    });
    TransformerDecoderLayer dec({.d_model = 16, .nhead = 4, .dim_feedforward = 32, .dropout = 0});
    Compare("decoder_layer" + suffix, &dec, [&](Record& in) {
      return Result{dec.forward(in["tgt"], in["memory"],
                                {.tgt_mask = in["causal"],
                                 .memory_key_padding_mask = in["mpad"],
                                 .tgt_is_causal = true})};
    });
    auto layer = std::make_shared<TransformerEncoderLayer>(TransformerEncoderLayerOptions{
        .d_model = 16, .nhead = 4, .dim_feedforward = 32, .dropout = 0, .batch_first = true});
    TransformerEncoder encoder(layer, 2, std::make_shared<LayerNorm>(SizeVector{16}));
    Compare("encoder" + suffix, &encoder,
            [&](Record& in) { return Result{encoder.forward(in["src"], {.mask = in["causal"]})}; });
  }
}

// Ember's state dicts load into torch's modules (strict).
TEST(AttentionTorch, StateDictsLoadIntoTorch) {
  REQUIRE_TORCH();
  MultiheadAttention cross({.embed_dim = 8, .num_heads = 2, .kdim = 5, .vdim = 3});
  auto layer = std::make_shared<TransformerEncoderLayer>(
      TransformerEncoderLayerOptions{.d_model = 16, .nhead = 4, .dim_feedforward = 32});
  TransformerEncoder encoder(layer, 2, std::make_shared<LayerNorm>(SizeVector{16}));
  TransformerDecoderLayer dec({.d_model = 16, .nhead = 4, .dim_feedforward = 32, .bias = false});
  const std::string dir = TorchDir();
  ASSERT_TRUE(ember::save(cross.state_dict(), dir + "/ember_mha_cross.pt").ok());
  ASSERT_TRUE(ember::save(encoder.state_dict(), dir + "/ember_encoder.pt").ok());
  ASSERT_TRUE(ember::save(dec.state_dict(), dir + "/ember_decoder_nobias.pt").ok());
  absl::StatusOr<std::string> out = testing::run_torch2(kScript, {"load", dir});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ::testing::HasSubstr("loaded 3"));
}

}  // namespace
}  // namespace ember::nn
