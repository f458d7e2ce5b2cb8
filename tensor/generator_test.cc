// Generators (Note [Random numbers] in factories.h) on the CPU: the
// Mersenne Twister's state round trip, the Philox generators' seed and offset
// bookkeeping and state layout, the device-type checks of the random ops, and
// bernoulli. Expected values are worked out by hand.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/testing.h"

namespace ember {
namespace {

using ::ember::testing::ErrorOf;
using ::ember::testing::Values;
using ::testing::HasSubstr;

const Device kCuda0(DeviceType::kCUDA, 0);

std::vector<uint8_t> Bytes(const Tensor& t) {
  const uint8_t* p = t.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

Tensor FromBytes(const std::vector<uint8_t>& bytes) {
  Tensor t = empty({static_cast<int64_t>(bytes.size())}, TensorOptions(kUInt8));
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

TEST(GeneratorTest, CpuStateRoundTripRestoresTheSequenceMidway) {
  Generator g(123);
  rand({7}, {}, &g);
  randn({3}, TensorOptions(kFloat64), &g);  // odd count: a spare normal is pending
  const Tensor state = g.get_state();
  EXPECT_EQ(state.dtype(), kUInt8);
  EXPECT_TRUE(state.is_cpu());
  const std::vector<double> normals = Values(randn({5}, TensorOptions(kFloat64), &g));
  const std::vector<double> uniforms = Values(rand({5}, TensorOptions(kFloat64), &g));
  g.set_state(state);
  EXPECT_EQ(Values(randn({5}, TensorOptions(kFloat64), &g)), normals);
  EXPECT_EQ(Values(rand({5}, TensorOptions(kFloat64), &g)), uniforms);
  EXPECT_EQ(g.initial_seed(), 123u);

  // Into another generator: it continues the same sequence.
  Generator other(5);
  other.set_state(state);
  EXPECT_EQ(Values(randn({5}, TensorOptions(kFloat64), &other)), normals);
}

TEST(GeneratorTest, CpuSetStateRefusesOtherBytes) {
  Generator g(1);
  EXPECT_THAT(ErrorOf([&] {
                g.set_state(FromBytes({1, 2, 3}));
              }),
              HasSubstr("not a CPU generator's state"));
  EXPECT_THAT(ErrorOf([&] { g.set_state(zeros({4})); }),
              HasSubstr("expected a 1-D uint8 CPU tensor"));
  // A failed set_state leaves the generator as it was.
  Generator fresh(1);
  EXPECT_EQ(Values(rand({4}, {}, &g)), Values(rand({4}, {}, &fresh)));
}

TEST(GeneratorTest, PhiloxOffsetMovesByWholeBlocks) {
  Generator g(42, kCuda0);
  EXPECT_EQ(g.device(), kCuda0);
  EXPECT_EQ(g.initial_seed(), 42u);
  EXPECT_EQ(g.offset(), 0u);
  Generator::PhiloxInputs a = g.philox_engine_inputs(4);
  EXPECT_EQ(a.seed, 42u);
  EXPECT_EQ(a.offset, 0u);
  Generator::PhiloxInputs b = g.philox_engine_inputs(5);  // rounds up to 8
  EXPECT_EQ(b.offset, 4u);
  Generator::PhiloxInputs c = g.philox_engine_inputs(1);  // rounds up to 4
  EXPECT_EQ(c.offset, 12u);
  EXPECT_EQ(g.offset(), 16u);
  g.manual_seed(7);
  EXPECT_EQ(g.offset(), 0u);
  EXPECT_EQ(g.philox_engine_inputs(4).seed, 7u);
  g.set_offset(400);
  EXPECT_EQ(g.philox_engine_inputs(4).offset, 400u);
  EXPECT_THAT(ErrorOf([&] { g.set_offset(6); }), HasSubstr("multiple of 4, got 6"));
}

TEST(GeneratorTest, PhiloxStateIsSeedThenOffsetLittleEndian) {
  Generator g(0x0102030405060708ull, kCuda0);
  g.philox_engine_inputs(0x104);  // offset 0x104
  const Tensor state = g.get_state();
  EXPECT_EQ(Bytes(state), (std::vector<uint8_t>{8, 7, 6, 5, 4, 3, 2, 1, 4, 1, 0, 0, 0, 0, 0, 0}));

  Generator h(9, Device(DeviceType::kCUDA, 1));
  h.set_state(state);
  EXPECT_EQ(h.initial_seed(), 0x0102030405060708ull);
  EXPECT_EQ(h.offset(), 0x104u);

  EXPECT_THAT(ErrorOf([&] { h.set_state(FromBytes(std::vector<uint8_t>(15, 0))); }),
              HasSubstr("state is 16 bytes (seed and offset), got 15"));
  std::vector<uint8_t> odd(16, 0);
  odd[8] = 2;  // offset 2: not a block boundary
  EXPECT_THAT(ErrorOf([&] { h.set_state(FromBytes(odd)); }), HasSubstr("not a multiple of 4"));
  EXPECT_EQ(h.offset(), 0x104u);
}

TEST(GeneratorTest, DrawsAndOffsetsBelongToTheirKind) {
  Generator cpu(1);
  Generator cuda(1, kCuda0);
  EXPECT_THAT(ErrorOf([&] { cpu.philox_engine_inputs(4); }), HasSubstr("no Philox offset"));
  EXPECT_THAT(ErrorOf([&] { cuda.NextDouble(); }), HasSubstr("belong to a CPU generator"));
}

TEST(GeneratorTest, RandomOpsRefuseAGeneratorOfAnotherDeviceType) {
  Generator cuda(1, kCuda0);
  const std::string expected = "expected a 'cpu' device type for generator but found 'cuda'";
  EXPECT_THAT(ErrorOf([&] { rand({2}, {}, &cuda); }), HasSubstr(expected));
  EXPECT_THAT(ErrorOf([&] { randn({2}, {}, &cuda); }), HasSubstr(expected));
  EXPECT_THAT(ErrorOf([&] { randint(0, 3, {2}, {}, &cuda); }), HasSubstr(expected));
  Tensor t = zeros({2});
  EXPECT_THAT(ErrorOf([&] { uniform_(t, 0, 1, &cuda); }), HasSubstr(expected));
  EXPECT_THAT(ErrorOf([&] { normal_(t, 0, 1, &cuda); }), HasSubstr(expected));
  EXPECT_THAT(ErrorOf([&] { bernoulli_(t, 0.5, &cuda); }), HasSubstr(expected));
  EXPECT_EQ(Values(t), (std::vector<double>{0, 0}));
}

TEST(GeneratorTest, ManualSeedReseedsTheCpuGenerator) {
  manual_seed(11);
  const std::vector<double> a = Values(rand({6}));
  Generator g(11);
  EXPECT_EQ(Values(rand({6}, {}, &g)), a);
  EXPECT_EQ(default_generator(kCPU).initial_seed(), 11u);
  EXPECT_EQ(&default_generator(kCPU), &default_generator());
}

TEST(GeneratorTest, NoDeviceGeneratorsWithoutABackend) {
  // //cuda is not linked into this test.
  EXPECT_EQ(GetDeviceGenerators(DeviceType::kCUDA), nullptr);
  EXPECT_THAT(ErrorOf([] { default_generator(kCuda0); }),
              HasSubstr("no random number generator is registered for cuda devices"));
  EXPECT_THAT(ErrorOf([] { SetDeviceGenerators(DeviceType::kCPU, nullptr); }),
              HasSubstr("default_generator()"));
}

TEST(GeneratorTest, InPlaceDrawsFollowRowMajorOrderOfTheView) {
  Generator g1(3), g2(3);
  Tensor base = zeros({4, 3}, TensorOptions(kFloat64));
  Tensor view = base.t();  // [3, 4], not contiguous
  uniform_(view, -2.0, 2.0, &g1);
  // -2 + 4u is exact in float64 for u a multiple of 2^-53.
  EXPECT_EQ(Values(view), Values(rand({3, 4}, TensorOptions(kFloat64), &g2).mul(4.0).sub(2.0)));
  EXPECT_EQ(base.version(), 1u);
  for (double v : Values(view)) {
    EXPECT_GE(v, -2.0);
    EXPECT_LT(v, 2.0);
  }
}

TEST(GeneratorTest, BernoulliKeepsItsProbability) {
  Generator g(17);
  Tensor t = empty({20000});
  bernoulli_(t, 0.3, &g);
  double ones = 0;
  for (double v : Values(t)) {
    ASSERT_TRUE(v == 0.0 || v == 1.0) << v;
    ones += v;
  }
  // Binomial(20000, 0.3): sd ~ 65; 6 sd.
  EXPECT_NEAR(ones, 6000, 390);
  EXPECT_EQ(Values(bernoulli_(empty({50}, TensorOptions(kBool)), 0.0, &g)),
            std::vector<double>(50, 0.0));
  EXPECT_EQ(Values(bernoulli_(empty({50}, TensorOptions(kInt64)), 1.0, &g)),
            std::vector<double>(50, 1.0));
  EXPECT_THAT(ErrorOf([&] { bernoulli_(t, 1.5, &g); }), HasSubstr("0 <= p <= 1, but got p=1.5"));

  Tensor probs = testing::Make({0, 1, 0, 1}, kFloat64);
  Tensor b = bernoulli(probs, &g);
  EXPECT_EQ(b.dtype(), kFloat64);
  // Draws are in [0, 1): below 1 always, below 0 never.
  EXPECT_EQ(Values(b), (std::vector<double>{0, 1, 0, 1}));
}

TEST(GeneratorTest, RandintStaysInRange) {
  Generator g(5);
  Tensor t = randint(-3, 4, {2000}, {}, &g);
  EXPECT_EQ(t.dtype(), kInt64);
  std::vector<int> seen(7, 0);
  for (double v : Values(t)) {
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 4);
    ++seen[static_cast<int>(v) + 3];
  }
  for (int c : seen) EXPECT_GT(c, 0);
}

}  // namespace
}  // namespace ember
