// checkpoint() against torch.utils.checkpoint.checkpoint(use_reentrant=False)
// of PyTorch 2.x: the gradients of a two-block MLP with dropout, flat and
// nested, and where the CPU generator's stream stands after backward. Both
// sides draw the weights, the input and the dropout masks as float64
// uniforms from the same seed (Note [Random numbers] in tensor/factories.h),
// so they compute the same function; torch's side is
// testdata/torch_checkpoint.py on the peer tools/install_peers.sh installs
// (the test skips, saying so, without it).
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "autograd/checkpoint.h"
#include "base/testing/peers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/testing.h"

namespace ember::autograd {
namespace {

constexpr int kSeed = 3;

// "<case> <name>" -> torch's values.
using Expected = std::map<std::string, std::vector<double>>;

Expected Parse(const std::string& out) {
  Expected expected;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> halves = absl::StrSplit(line, absl::MaxSplits(':', 1));
    std::vector<double>& values = expected[halves.first];
    for (absl::string_view word : absl::StrSplit(halves.second, ' ', absl::SkipEmpty())) {
      values.push_back(std::strtod(std::string(word).c_str(), nullptr));  // float.hex
    }
  }
  return expected;
}

Tensor Uniform(IntArrayRef shape) { return rand(shape, kFloat64); }

Tensor Dropout(const Tensor& t, double p) {
  Tensor keep = Uniform(t.sizes()).ge(p).to(t.dtype());
  return t * (keep * (1.0 / (1.0 - p)));
}

// The script's model, drawn in the script's order.
struct Model {
  std::vector<std::pair<std::string, Tensor>> params;
  Tensor Get(const std::string& name) const {
    for (const auto& [n, t] : params) {
      if (n == name) return t;
    }
    return Tensor();
  }
  Model() {
    params.emplace_back("x", (Uniform({8, 16}) * 2 - 1).requires_grad_());
    params.emplace_back("w1", ((Uniform({16, 32}) * 2 - 1) * 0.3).requires_grad_());
    params.emplace_back("b1", (Uniform({32}) * 0.2 - 0.1).requires_grad_());
    params.emplace_back("w2", ((Uniform({32, 32}) * 2 - 1) * 0.2).requires_grad_());
    params.emplace_back("b2", (Uniform({32}) * 0.2 - 0.1).requires_grad_());
    params.emplace_back("w3", ((Uniform({32, 4}) * 2 - 1) * 0.3).requires_grad_());
  }
  Tensor Block1(const Tensor& t) const {
    return Dropout((t.matmul(Get("w1")) + Get("b1")).tanh(), 0.25);
  }
  Tensor Block2(const Tensor& h) const {
    return Dropout((h.matmul(Get("w2")) + Get("b2")).relu(), 0.5).matmul(Get("w3")).sigmoid();
  }
};

class CheckpointTorchTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    out_ = new absl::StatusOr<std::string>(::ember::testing::run_torch2(
        "autograd/testdata/torch_checkpoint.py", {std::to_string(kSeed)}));
  }
  void SetUp() override {
    if (absl::IsNotFound(out_->status())) GTEST_SKIP() << out_->status().message();
    ASSERT_TRUE(out_->ok()) << out_->status();
    expected_ = Parse(**out_);
    ASSERT_EQ(expected_.size(), 2u * 8u) << **out_;
  }
  void ExpectNear(const std::string& key, const Tensor& t, double tolerance) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(t.defined());
    const std::vector<double> got = ::ember::testing::Values(t);
    const std::vector<double>& want = expected_.at(key);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance) << "at " << i;
  }
  static absl::StatusOr<std::string>* out_;
  Expected expected_;
};

absl::StatusOr<std::string>* CheckpointTorchTest::out_ = nullptr;

TEST_P(CheckpointTorchTest, GradientsAndTheRngStreamMatchTorchs) {
  const std::string& c = GetParam();
  manual_seed(kSeed);
  const Model m;
  auto block1 = [&m](const Tensor& t) { return m.Block1(t); };
  auto block2 = [&m](const Tensor& h) { return m.Block2(h); };
  Tensor out;
  if (c == "flat") {
    out = checkpoint(block2, checkpoint(block1, m.Get("x")));
  } else {
    out = checkpoint([&](const Tensor& t) { return m.Block2(checkpoint(block1, t)); }, m.Get("x"));
  }
  Tensor loss = (out * out).sum();
  loss.backward();
  ExpectNear(c + " loss", loss, 1e-6);
  for (const auto& [name, t] : m.params) ExpectNear(c + " " + name, t.grad(), 1e-6);
  // The draws after backward: both recomputations restored the stream.
  ExpectNear(c + " next", Uniform({3}), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointTorchTest, ::testing::Values("flat", "nested"));

}  // namespace
}  // namespace ember::autograd
