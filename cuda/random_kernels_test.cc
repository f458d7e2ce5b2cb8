// Random numbers drawn on CUDA devices (cuda/random_kernels.*, Note [Random
// numbers] in tensor/factories.h). Without a device: the host Philox4x32-10
// reference against Random123's known answers, the element grouping, and
// the no-device error. With one: the distributions' moments and ranges,
// values equal to the host reference (so Philox, seed and offset are what
// Note [Philox element groups] says), reproducibility per seed and device,
// get/set_rng_state, and that nothing is drawn from the CPU generator.
#include "cuda/random_kernels.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/testing.h"
#include "third_party/cuda/device_check.h"

namespace ember::cuda {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::HasSubstr;

const Device kCuda0(DeviceType::kCUDA, 0);

// --- Host reference ---------------------------------------------------------------

struct Block {
  uint32_t v[4];
};

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC11), written from the paper's definition.
Block Philox(Block ctr, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * ctr.v[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * ctr.v[2];
    const Block next{{static_cast<uint32_t>(p1 >> 32) ^ ctr.v[1] ^ k0, static_cast<uint32_t>(p1),
                      static_cast<uint32_t>(p0 >> 32) ^ ctr.v[3] ^ k1, static_cast<uint32_t>(p0)}};
    ctr = next;
  }
  return ctr;
}

// The block element group `g` draws at Philox offset `offset` (Note [Philox
// element groups]): counter (offset / 4, g) as two 64-bit halves, key seed.
Block GroupBlock(uint64_t seed, uint64_t offset, uint64_t g) {
  const uint64_t c = offset / 4;
  return Philox(Block{{static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32),
                       static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32)}},
                static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// rand's float32 element i: cuRAND's uniform (x + 1/2) / 2^32, with 1 read as 0.
float ReferenceUniform(uint64_t seed, uint64_t offset, int64_t i) {
  const uint32_t x = GroupBlock(seed, offset, i / 4).v[i % 4];
  const float u = x * 2.3283064e-10f + 1.1641532e-10f;
  return u == 1.0f ? 0.0f : u;
}

TEST(PhiloxReferenceTest, MatchesRandom123KnownAnswers) {
  struct Case {
    Block ctr;
    uint32_t k0, k1;
    Block expected;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Case& c : cases) {
    const Block out = Philox(c.ctr, c.k0, c.k1);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(out.v[k], c.expected.v[k]) << "word " << k;
  }
}

TEST(RandomKernelsTest, ElementGroupsHoldFourOrTwo) {
  kernels::RandomParams uniform;
  EXPECT_EQ(kernels::ElementsPerGroup(static_cast<int>(kFloat32), uniform), 4);
  EXPECT_EQ(kernels::ElementsPerGroup(static_cast<int>(kFloat16), uniform), 4);
  EXPECT_EQ(kernels::ElementsPerGroup(static_cast<int>(kFloat64), uniform), 2);
  kernels::RandomParams ints;
  ints.distribution = kernels::kIntegerDistribution;
  ints.range = uint64_t{1} << 32;
  EXPECT_EQ(kernels::ElementsPerGroup(static_cast<int>(kInt64), ints), 4);
  ints.range = (uint64_t{1} << 32) + 1;
  EXPECT_EQ(kernels::ElementsPerGroup(static_cast<int>(kInt64), ints), 2);
  EXPECT_EQ(kernels::kOffsetIncrement, 4u);
}

TEST(RandomKernelsTest, WithoutADeviceRandomCudaTensorsFail) {
  if (is_available()) GTEST_SKIP() << "a CUDA device is usable: this case is for none";
  const std::string message = ErrorOf([] { rand({4}, TensorOptions().device(kCuda0)); });
  EXPECT_NE(message, "no error");
  EXPECT_NE(ErrorOf([] { randn({4}, TensorOptions().device(kCuda0)); }), "no error");
}

// --- On a device ------------------------------------------------------------------

std::vector<double> HostValues(const Tensor& t) { return Values(t.to(kCPU)); }

struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};

Moments MomentsOf(const std::vector<double>& v) {
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

TEST(RandomKernelsTest, UniformIsUniformInItsHalfOpenRange) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(manual_seed(2024, 0).ok());
  for (Dtype dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor t = empty({1 << 20}, TensorOptions(dtype).device(kCuda0));
    uniform_(t, -1.0, 3.0);
    const Moments m = MomentsOf(HostValues(t));
    EXPECT_GE(m.min, -1.0);
    EXPECT_LT(m.max, 3.0);
    // bfloat16 steps by 2^-6 below 3: the draws that round up to 3 become -1
    // (the half-open rule), moving the mean by -2^-7.
    const bool bf16 = dtype == kBFloat16;
    EXPECT_NEAR(m.mean, bf16 ? 1.0 - 1.0 / 128 : 1.0, 0.005);  // sd of the mean ~0.0011
    EXPECT_NEAR(m.var, 16.0 / 12, 0.02);                       // uniform on [-1, 3)
  }
  const Moments r = MomentsOf(HostValues(rand({1 << 20}, TensorOptions().device(kCuda0))));
  EXPECT_GE(r.min, 0.0);
  EXPECT_LT(r.max, 1.0);
  EXPECT_NEAR(r.mean, 0.5, 0.003);
}

TEST(RandomKernelsTest, NormalHasItsMeanAndStd) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(manual_seed(7, 0).ok());
  for (Dtype dtype : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor t = empty({1 << 20}, TensorOptions(dtype).device(kCuda0));
    normal_(t, 2.0, 3.0);
    const Moments m = MomentsOf(HostValues(t));
    EXPECT_NEAR(m.mean, 2.0, 0.02);  // sd of the mean ~0.003
    EXPECT_NEAR(std::sqrt(m.var), 3.0, 0.03);
  }
  const Moments z = MomentsOf(HostValues(randn({1 << 20}, TensorOptions(kFloat64).device(kCuda0))));
  EXPECT_NEAR(z.mean, 0.0, 0.006);
  EXPECT_NEAR(z.var, 1.0, 0.01);
}

TEST(RandomKernelsTest, RandintCoversItsRangeOnly) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(manual_seed(11, 0).ok());
  std::vector<int> seen(10, 0);
  for (double v : HostValues(randint(-5, 5, {100000}, TensorOptions().device(kCuda0)))) {
    ASSERT_GE(v, -5);
    ASSERT_LT(v, 5);
    ++seen[static_cast<int>(v) + 5];
  }
  for (int c : seen) EXPECT_NEAR(c, 10000, 600);
  // A range above 2^32 takes 64 bits per element.
  const int64_t high = int64_t{1} << 40;
  const Moments big =
      MomentsOf(HostValues(randint(0, high, {4097}, TensorOptions().device(kCuda0))));
  EXPECT_GE(big.min, 0);
  EXPECT_LT(big.max, static_cast<double>(high));
  EXPECT_GT(big.max, static_cast<double>(int64_t{1} << 39));
  Tensor i32 = randint(0, 3, {1000}, TensorOptions(kInt32).device(kCuda0));
  EXPECT_EQ(i32.dtype(), kInt32);
  EXPECT_EQ(MomentsOf(HostValues(i32)).max, 2);
}

TEST(RandomKernelsTest, BernoulliHasItsProbability) {
  EMBER_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(manual_seed(3, 0).ok());
  Tensor t = empty({1 << 20}, TensorOptions().device(kCuda0));
  bernoulli_(t, 0.3);
  const std::vector<double> v = HostValues(t);
  for (double x : v) ASSERT_TRUE(x == 0.0 || x == 1.0) << x;
  EXPECT_NEAR(MomentsOf(v).mean, 0.3, 0.003);
  Tensor never = bernoulli_(empty({4096}, TensorOptions(kBool).device(kCuda0)), 0.0);
  Tensor always = bernoulli_(empty({4096}, TensorOptions(kFloat16).device(kCuda0)), 1.0);
  EXPECT_EQ(HostValues(never), std::vector<double>(4096, 0.0));
  EXPECT_EQ(HostValues(always), std::vector<double>(4096, 1.0));
  Tensor probs = testing::Make({0, 1, 0, 1}, kFloat32).to(kCuda0);
  EXPECT_EQ(HostValues(bernoulli(probs)), (std::vector<double>{0, 1, 0, 1}));
}

TEST(RandomKernelsTest, ValuesAreTheHostPhiloxReference) {
  EMBER_SKIP_WITHOUT_CUDA();
  const uint64_t seed = 0x123456789abcdefull;
  ASSERT_TRUE(manual_seed(seed, 0).ok());
  // 4099 elements: a last group of 3; then a second launch at offset 4.
  for (uint64_t offset : {uint64_t{0}, uint64_t{4}}) {
    const std::vector<double> got = HostValues(rand({4099}, TensorOptions().device(kCuda0)));
    for (int64_t i = 0; i < 4099; ++i) {
      ASSERT_NEAR(got[i], ReferenceUniform(seed, offset, i), 2e-7)
          << "element " << i << " at offset " << offset;
    }
  }
  absl::StatusOr<Generator*> g = default_generator(0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->offset(), 8u);
}

TEST(RandomKernelsTest, ReproducibleForASeedAndDevice) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions on0 = TensorOptions().device(kCuda0);
  ASSERT_TRUE(manual_seed(99, 0).ok());
  const std::vector<double> a = HostValues(randn({1000}, on0));
  const std::vector<double> b = HostValues(randn({1000}, on0));
  EXPECT_NE(a, b);
  ASSERT_TRUE(manual_seed(99, 0).ok());
  EXPECT_EQ(HostValues(randn({1000}, on0)), a);

  // get/set_rng_state restore the sequence.
  absl::StatusOr<Tensor> state = get_rng_state(0);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->numel(), 16);
  const std::vector<double> next = HostValues(randn({1000}, on0));
  ASSERT_TRUE(set_rng_state(*state, 0).ok());
  EXPECT_EQ(HostValues(randn({1000}, on0)), next);

  // ember::manual_seed seeds every device's generator; an explicit
  // generator with the same seed draws the same.
  ember::manual_seed(5);
  EXPECT_EQ(*initial_seed(0), 5u);
  const std::vector<double> c = HostValues(rand({777}, on0));
  Generator mine(5, kCuda0);
  EXPECT_EQ(HostValues(rand({777}, on0, &mine)), c);
  EXPECT_THAT(ErrorOf([&] { rand({3}, {}, &mine); }),
              HasSubstr("expected a 'cpu' device type for generator but found 'cuda'"));
}

TEST(RandomKernelsTest, NothingIsDrawnOnTheHost) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions on0 = TensorOptions().device(kCuda0);
  const std::vector<double> cpu_before = Values(ember::default_generator().get_state());
  absl::StatusOr<Generator*> g = default_generator(0);
  ASSERT_TRUE(g.ok());
  const uint64_t offset = (*g)->offset();
  Tensor t = empty({64, 3}, on0);
  rand({100}, on0);
  randn({100}, on0);
  randint(0, 9, {100}, on0);
  uniform_(t);
  normal_(t);
  bernoulli_(t, 0.5);
  bernoulli(t.clamp(0.0, 1.0));
  // Seven launches, one Philox block each, on the device's generator alone.
  EXPECT_EQ((*g)->offset(), offset + 7 * kernels::kOffsetIncrement);
  EXPECT_EQ(Values(ember::default_generator().get_state()), cpu_before);
}

TEST(RandomKernelsTest, StridedOutputsGetRowMajorDraws) {
  EMBER_SKIP_WITHOUT_CUDA();
  const TensorOptions on0 = TensorOptions().device(kCuda0);
  Tensor base = zeros({5, 7}, on0);
  Tensor view = base.t();  // [7, 5], not contiguous
  ASSERT_TRUE(manual_seed(8, 0).ok());
  uniform_(view);
  ASSERT_TRUE(manual_seed(8, 0).ok());
  EXPECT_EQ(HostValues(view), HostValues(rand({7, 5}, on0)));
}

TEST(RandomKernelsTest, EveryDeviceHasItsOwnGenerator) {
  EMBER_SKIP_WITHOUT_CUDA();
  if (device_count() < 2)
    GTEST_SKIP() << "needs two CUDA devices, this machine has " << device_count();
  const Device cuda1(DeviceType::kCUDA, 1);
  ember::manual_seed(21);
  const std::vector<double> on0 = HostValues(rand({500}, TensorOptions().device(kCuda0)));
  const std::vector<double> on1 = HostValues(rand({500}, TensorOptions().device(cuda1)));
  EXPECT_EQ(on0, on1);  // one seed, one algorithm, each device from offset 0
  ASSERT_TRUE(manual_seed(22, 1).ok());
  EXPECT_EQ(*initial_seed(0), 21u);
  EXPECT_EQ(*initial_seed(1), 22u);
  EXPECT_NE(HostValues(rand({500}, TensorOptions().device(cuda1))), on1);
}

}  // namespace
}  // namespace ember::cuda
