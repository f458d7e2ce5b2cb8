// The CPU generator against PyTorch 2.x's (Note [Random numbers] in
// factories.h): for the same seed, randperm, randint, float64 rand, uniform_
// and randn give torch's values exactly (float32's uniform and normal within
// two ulps), and two 32-bit draws make torch's 64-bit one (what
// DataLoader draws its base seed with). torch's side is
// testdata/torch_random.py, run on the peer tools/install_peers.sh installs;
// without it the test skips, saying so.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/peers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"

namespace ember {
namespace {

struct Case {
  std::vector<std::string> words;   // the case: its kind, then its numbers
  std::vector<std::string> values;  // what torch drew
};

std::vector<Case> Parse(const std::string& out) {
  std::vector<Case> cases;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> halves = absl::StrSplit(line, absl::MaxSplits(':', 1));
    cases.push_back({absl::StrSplit(halves.first, ' ', absl::SkipEmpty()),
                     absl::StrSplit(halves.second, ' ', absl::SkipEmpty())});
  }
  return cases;
}

int64_t Int(const std::string& word) {
  int64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(word, &v)) << word;
  return v;
}

uint64_t Seed(const std::string& word) {
  uint64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(word, &v)) << word;
  return v;
}

std::vector<std::string> Words(const Tensor& t) {
  std::vector<std::string> words;
  const Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) words.push_back(std::to_string(c.data_ptr<int64_t>()[i]));
  return words;
}

// torch_random.py runs once for the suite.
class TorchRandomTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = new absl::StatusOr<std::string>(
        ::ember::testing::run_torch2("tensor/testdata/torch_random.py"));
  }
  void SetUp() override {
    if (absl::IsNotFound(out_->status())) GTEST_SKIP() << out_->status().message();
    ASSERT_TRUE(out_->ok()) << out_->status();
    cases_ = Parse(**out_);
    ASSERT_GT(cases_.size(), 50u);
  }
  static absl::StatusOr<std::string>* out_;
  std::vector<Case> cases_;
};

absl::StatusOr<std::string>* TorchRandomTest::out_ = nullptr;

TEST_F(TorchRandomTest, RandpermIsTorchsForTheSameSeed) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (c.words[0] != "randperm") continue;
    Generator g(Seed(c.words[2]));
    EXPECT_EQ(Words(randperm(Int(c.words[1]), {}, &g)), c.values)
        << "randperm(" << c.words[1] << ") seed " << c.words[2];
    ++checked;
  }
  EXPECT_EQ(checked, 40);
}

TEST_F(TorchRandomTest, RandintIsTorchsBelowAndAbove32Bits) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (c.words[0] != "randint") continue;
    Generator g(Seed(c.words[4]));
    EXPECT_EQ(Words(randint(Int(c.words[1]), Int(c.words[2]), {Int(c.words[3])}, {}, &g)), c.values)
        << "randint(" << c.words[1] << ", " << c.words[2] << ") seed " << c.words[4];
    ++checked;
  }
  EXPECT_EQ(checked, 25);
}

TEST_F(TorchRandomTest, Float64RandIsTorchsBitForBit) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (c.words[0] != "rand64") continue;
    Generator g(Seed(c.words[2]));
    const Tensor r = rand({Int(c.words[1])}, kFloat64, &g);
    ASSERT_EQ(static_cast<size_t>(r.numel()), c.values.size());
    for (int64_t i = 0; i < r.numel(); ++i) {
      EXPECT_EQ(r.data_ptr<double>()[i], std::strtod(c.values[i].c_str(), nullptr))
          << "element " << i << " seed " << c.words[2];
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

// Note [PyTorch's CPU draws] in factories.cc: float64 bit for bit; float32
// within two ulps (torch's vectorised log, sin and cos).
void ExpectTorchs(const Tensor& t, const Case& c, const std::string& what) {
  const Tensor d = t.to(kFloat64).contiguous();
  ASSERT_EQ(static_cast<size_t>(d.numel()), c.values.size()) << what;
  for (int64_t i = 0; i < d.numel(); ++i) {
    const double want = std::strtod(c.values[i].c_str(), nullptr);
    const double got = d.data_ptr<double>()[i];
    if (t.dtype() == kFloat64) {
      EXPECT_EQ(got, want) << what << " element " << i;
    } else {
      EXPECT_NEAR(got, want, 2.5e-7 * std::max(1.0, std::abs(want))) << what << " element " << i;
    }
  }
}

TEST_F(TorchRandomTest, UniformOfEachFloatDtypeIsTorchs) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (c.words[0] != "uniform") continue;
    Generator g(Seed(c.words[3]));
    const Dtype dtype = c.words[1] == "float32" ? kFloat32 : kFloat64;
    const Tensor t = uniform_(empty({Int(c.words[2])}, dtype), -0.3, 0.7, &g);
    ExpectTorchs(t, c, absl::StrCat("uniform_ ", c.words[1], " n=", c.words[2], " seed ",
                                    c.words[3]));
    ++checked;
  }
  EXPECT_EQ(checked, 70);
}

TEST_F(TorchRandomTest, RandnOfEachFloatDtypeIsTorchsAcrossTheSixteenElementFill) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (c.words[0] != "randn") continue;
    Generator g(Seed(c.words[3]));
    const Dtype dtype = c.words[1] == "float32" ? kFloat32 : kFloat64;
    const Tensor first = randn({Int(c.words[2])}, dtype, &g);
    const Tensor second = randn({3}, dtype, &g);
    ExpectTorchs(cat({first, second}), c,
                 absl::StrCat("randn ", c.words[1], " n=", c.words[2], " then 3, seed ",
                              c.words[3]));
    ++checked;
  }
  EXPECT_EQ(checked, 70);
}

TEST_F(TorchRandomTest, SixtyFourBitDrawsAreTorchs) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (c.words[0] != "random_int64") continue;
    Generator g(Seed(c.words[1]));
    std::lock_guard<std::mutex> lock(g.mutex());
    // int64 random_() with no bounds: a 64-bit draw modulo 2^63.
    EXPECT_EQ(std::to_string(g.random64() % (uint64_t{1} << 63)), c.values.at(0))
        << "seed " << c.words[1];
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST_F(TorchRandomTest, TheDefaultGeneratorAfterManualSeedIsTorchs) {
  for (const Case& c : cases_) {
    if (c.words[0] != "default_randperm") continue;
    manual_seed(Seed(c.words[2]));
    EXPECT_EQ(Words(randperm(Int(c.words[1]))), c.values);
    return;
  }
  FAIL() << "torch_random.py printed no default_randperm case";
}

std::string Hex(const Tensor& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    const uint8_t b = bytes.data_ptr<uint8_t>()[i];
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

Tensor FromHex(const std::string& hex) {
  Tensor t = empty({static_cast<int64_t>(hex.size() / 2)}, kUInt8);
  for (size_t i = 0; i < hex.size() / 2; ++i) {
    t.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return t;
}

// Ember's get_state() is torch's get_rng_state() byte for byte (right after
// seeding, after draws, with a cached normal); a state from torch, set
// into an Ember generator, draws what torch's draws next.
TEST_F(TorchRandomTest, StatesAreTorchsBytesBothWays) {
  int checked = 0;
  for (size_t k = 0; k < cases_.size(); ++k) {
    const Case& c = cases_[k];
    if (c.words[0] != "state") continue;
    ASSERT_LT(k + 1, cases_.size());
    const Case& after = cases_[k + 1];
    const int64_t draws = Int(c.words[2]);
    Generator g(Seed(c.words[1]));
    if (draws > 0) randint(0, 10, {draws}, {}, &g);
    if (draws < 0) randn({3}, kFloat64, &g);
    const Tensor mine = g.get_state();
    EXPECT_EQ(mine.numel(), 5056);
    if (draws >= 0) {
      // Ember's normals are its own: only states without a cached normal are
      // compared whole.
      EXPECT_EQ(Hex(mine), c.values.at(0)) << "seed " << c.words[1] << " draws " << draws;
    }
    Generator other(999);
    other.set_state(FromHex(c.values.at(0)));
    EXPECT_EQ(Words(randperm(20, {}, &other)), after.values)
        << "seed " << c.words[1] << " draws " << draws;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(GeneratorStateTest, ARoundTripRestoresTheSequenceAndBadBytesAreRefused) {
  Generator g(42);
  randint(0, 1000, {1000}, {}, &g);
  const Tensor state = g.get_state();
  const Tensor a = randperm(50, {}, &g);
  g.set_state(state);
  EXPECT_TRUE(randperm(50, {}, &g).equal(a));
  Tensor bad = state.clone();
  bad.data_ptr<uint8_t>()[16] = 200;  // next = 200 with left unchanged
  try {
    g.set_state(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("is not one an MT19937 engine can be in"));
  }
  try {
    g.set_state(zeros({10}, kUInt8));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "10 bytes are not a CPU generator's state, which is 5056 bytes"));
  }
}

TEST(RandpermTest, RefusesANegativeSizeAndADeviceGenerator) {
  try {
    randperm(-3);
    FAIL() << "randperm(-3) did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("n must be non-negative, got -3"));
  }
  Generator cuda(1, Device(DeviceType::kCUDA, 0));
  try {
    randperm(3, {}, &cuda);
    FAIL() << "randperm on a CUDA generator did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("draws on a CPU generator"));
  }
}

TEST(RandpermTest, IsAPermutationInTheAskedDtype) {
  Generator g(3);
  const Tensor p = randperm(1000, kFloat32, &g);
  EXPECT_EQ(p.dtype(), kFloat32);
  std::vector<float> values(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  std::sort(values.begin(), values.end());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(values[i], static_cast<float>(i));
}

}  // namespace
}  // namespace ember
